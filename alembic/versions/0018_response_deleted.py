"""A response deleted through ``DELETE /v1/responses/{id}`` (docs/openai.md): ``runs`` gets
``response_deleted_at``, when it was deleted. The run stays in its conversation's audit (GET
of its run record, the transcript, the context it stored are unchanged); ``/v1`` no longer
finds it (404, and 400 as a ``previous_response_id``).

Plain ADD/DROP COLUMN on both engines (as in 0009): batch mode would copy ``runs`` and,
dropping the old table, cascade-delete its records.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | Sequence[str] | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "runs", sa.Column("response_deleted_at", sa.DateTime(timezone=True), nullable=True)
    )


def downgrade() -> None:
    op.drop_column("runs", "response_deleted_at")
