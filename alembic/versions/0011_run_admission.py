"""Admission of queued runs: ``runs.started_at`` (when a run was admitted and took its lease;
the runs-per-minute window counts it, not ``created_at``, which for a queued run is its arrival)
and ``runs.tool_inputs`` (a queued run's client tools, gated tool names and answers to pending
calls, so that whichever process claims it runs — and checks — the request it was given).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("started_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("tool_inputs", sa.Text(), nullable=True))
    # every run that is not queued started when it was created (before this revision a queued
    # run was never admitted: its start is not known, its creation is the best bound)
    op.execute("UPDATE runs SET started_at = created_at WHERE status <> 'queued'")
    op.drop_index("ix_runs_tenant_created", table_name="runs")
    op.create_index("ix_runs_tenant_started", "runs", ["tenant", "started_at"])


def downgrade() -> None:
    op.drop_index("ix_runs_tenant_started", table_name="runs")
    op.create_index("ix_runs_tenant_created", "runs", ["tenant", "created_at"])
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("tool_inputs")
        batch.drop_column("started_at")
