"""Token counts as 64-bit integers on PostgreSQL: a tenant's daily totals (``tenant_usage``),
its daily token quota (``tenant_quotas.tokens_per_day``), a compaction's ``tokens_before`` /
``tokens_after`` (``run_compactions``) and a conversation's ``version``. They were ``INTEGER``
(up to 2**31 - 1): a busy tenant's day with long contexts passes that, and settling a run's
usage then failed; an imported conversation may be at any version up to 2**53 - 1.

SQLite's ``INTEGER`` is 64-bit already: nothing changes there (the tables declare these columns
``BIGINT`` on PostgreSQL only, ``app.store.tables.WIDE_INTEGER``), so no SQLite table is
rebuilt. On PostgreSQL each ``ALTER COLUMN … TYPE BIGINT`` rewrites its table.

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
    ("conversations", "version", False),
)


def _retype(old: sa.types.TypeEngine[int], new: sa.types.TypeEngine[int]) -> None:
    if op.get_context().dialect.name != "postgresql":
        return
    for table, column, nullable in COLUMNS:
        op.alter_column(table, column, existing_type=old, type_=new, existing_nullable=nullable)


def upgrade() -> None:
    _retype(sa.Integer(), sa.BigInteger())


def downgrade() -> None:
    _retype(sa.BigInteger(), sa.Integer())
