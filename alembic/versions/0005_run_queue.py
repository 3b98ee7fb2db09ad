"""Queued runs: the arrival order of a conversation's queued runs and a waiter's bound.

Revision ID: 0005
Revises: 0002
Create Date: 2026-12-01

``runs.queue_seq`` orders a conversation's queued runs (status ``queued``) in arrival order;
``runs.wait_until`` is when an ``if_busy: wait`` request gives up (app/store/queue.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("queue_seq", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("wait_until", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_runs_queue", "runs", ["tenant", "conversation_id", "queue_seq"])


def downgrade() -> None:
    op.drop_index("ix_runs_queue", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("wait_until")
        batch.drop_column("queue_seq")
