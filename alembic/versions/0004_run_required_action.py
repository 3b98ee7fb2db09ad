"""A run that paused for client tools or approvals records what it asked for.

Revision ID: 0004
Revises: 0006
Create Date: 2026-12-01

``runs.required_action``: the ``required_action`` of a run that ended ``requires_action``
(JSON text, as every JSON value of the schema), null otherwise (docs/tools.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("required_action", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("required_action")
