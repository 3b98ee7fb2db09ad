"""Long conversations (issue 10): the running token tally kept with each conversation, and
where in its run each compaction happened.

- ``conversations.token_tally``: the JSON of :class:`app.agent.tokens.TokenTally` for the
  stored context's messages, written by every write of the context (runs, PUT). Null for rows
  written before this revision: the first run recounts and stores it.
- ``run_compactions.at``: ``Compaction.at``. Null for rows written before this revision (the
  transcript then places the compaction at the end of its run).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


# Plain ADD/DROP COLUMN on both engines (SQLite has both since 3.35): no batch mode, which
# would copy ``conversations`` and, dropping the old table, cascade-delete its children.


def upgrade() -> None:
    op.add_column("conversations", sa.Column("token_tally", sa.Text(), nullable=True))
    op.add_column("run_compactions", sa.Column("at", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("run_compactions", "at")
    op.drop_column("conversations", "token_tally")
