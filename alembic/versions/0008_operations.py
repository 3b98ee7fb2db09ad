"""Operations: runs.trace_id (the OpenTelemetry trace a run was started in), per-tenant quotas
and usage by day, and the index the runs-per-minute window reads (docs/operations.md).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("trace_id", sa.String(32), nullable=True))
    op.create_index("ix_runs_tenant_created", "runs", ["tenant", "created_at"])
    op.create_table(
        "tenant_quotas",
        sa.Column("tenant", sa.String(128), primary_key=True),
        sa.Column("tokens_per_day", sa.Integer(), nullable=True),
        sa.Column("runs_per_minute", sa.Integer(), nullable=True),
        sa.Column("concurrent_runs", sa.Integer(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "tenant_usage",
        sa.Column("tenant", sa.String(128), primary_key=True),
        sa.Column("day", sa.String(10), primary_key=True),
        sa.Column("runs", sa.Integer(), nullable=False),
        sa.Column("input_tokens", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("cached_tokens", sa.Integer(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("tenant_usage")
    op.drop_table("tenant_quotas")
    op.drop_index("ix_runs_tenant_created", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("trace_id")
