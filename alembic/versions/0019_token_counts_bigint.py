"""Token counts as 64-bit integers: a tenant's daily totals (``tenant_usage``), its daily
token quota (``tenant_quotas.tokens_per_day``) and a compaction's ``tokens_before`` /
``tokens_after`` (``run_compactions``). On PostgreSQL they were ``INTEGER`` (up to 2**31 - 1):
a busy tenant's day with long contexts passes that, and settling a run's usage then failed.
SQLite's integers were 64-bit already; its tables are rebuilt with the new declared type
(batch mode: none of the three is referenced by another table, so nothing cascades).

``conversations.version`` becomes ``BIGINT`` on PostgreSQL too (an imported conversation keeps
any version up to 2**53 - 1, as its ``context_versions`` rows already could). On SQLite it
stays as declared: rebuilding ``conversations`` would cascade-delete its children.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | Sequence[str] | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: (table, column, nullable)
COLUMNS = (
    ("tenant_usage", "input_tokens", False),
    ("tenant_usage", "output_tokens", False),
    ("tenant_usage", "cached_tokens", False),
    ("tenant_quotas", "tokens_per_day", True),
    ("run_compactions", "tokens_before", False),
    ("run_compactions", "tokens_after", False),
)


def _retype(old: sa.types.TypeEngine[int], new: sa.types.TypeEngine[int]) -> None:
    for table in dict.fromkeys(t for t, _, _ in COLUMNS):
        with op.batch_alter_table(table) as batch:
            for name, column, nullable in COLUMNS:
                if name == table:
                    batch.alter_column(
                        column, existing_type=old, type_=new, existing_nullable=nullable
                    )


def _retype_version(old: sa.types.TypeEngine[int], new: sa.types.TypeEngine[int]) -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.alter_column(
            "conversations", "version", existing_type=old, type_=new, existing_nullable=False
        )


def upgrade() -> None:
    _retype(sa.Integer(), sa.BigInteger())
    _retype_version(sa.Integer(), sa.BigInteger())


def downgrade() -> None:
    _retype_version(sa.BigInteger(), sa.Integer())
    _retype(sa.BigInteger(), sa.Integer())
