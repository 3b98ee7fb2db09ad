"""A run's final as one of its new messages: ``runs`` gets ``final_seq``, the ``seq`` of its
final among its ``run_new_messages``. A run's final is its last attempt, always among its new
messages, so a finishing run no longer writes a ``run_finals`` row (one statement of its
outcome's transaction); rows written before, and those of imported runs, stay and are read as
before (``final_seq`` null).

Plain ADD/DROP COLUMN on both engines (as in 0018). The downgrade first writes the
``run_finals`` row of each run that has ``final_seq`` (a reference to the same text), then drops
the column: nothing is lost either way.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | Sequence[str] | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("final_seq", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.execute(
        "INSERT INTO run_finals (tenant, conversation_id, run_id, body, body_sha256) "
        "SELECT r.tenant, r.conversation_id, r.run_id, m.body, m.body_sha256 "
        "FROM runs r JOIN run_new_messages m ON m.tenant = r.tenant "
        "AND m.conversation_id = r.conversation_id AND m.run_id = r.run_id "
        "AND m.seq = r.final_seq "
        "WHERE r.final_seq IS NOT NULL AND NOT EXISTS (SELECT 1 FROM run_finals f "
        "WHERE f.tenant = r.tenant AND f.conversation_id = r.conversation_id "
        "AND f.run_id = r.run_id)"
    )
    op.drop_column("runs", "final_seq")
