"""``webhooks.allow_private``: an endpoint registered with ``--allow-private`` may be on a
private, loopback or link-local address; every other endpoint's address is checked when it is
registered and again before each delivery (app/addresses.py).

Endpoints registered before this revision were accepted without the check: they are marked
allowed, so that an upgrade changes no delivery (remove and add one again to have it checked).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # a plain ADD COLUMN on both engines (SQLite takes one with a default as it is)
    op.add_column(
        "webhooks",
        sa.Column("allow_private", sa.Boolean(), nullable=False, server_default=sa.true()),
    )
    # new endpoints say what they are allowed; existing ones (above) keep delivering. Printing
    # the DDL (--sql) cannot reflect SQLite's table to rebuild it: the default then stays, which
    # changes nothing the app does, as it writes the column with every endpoint it adds.
    if not (context.is_offline_mode() and op.get_context().dialect.name == "sqlite"):
        with op.batch_alter_table("webhooks") as batch:
            batch.alter_column("allow_private", server_default=sa.false())


def downgrade() -> None:
    with op.batch_alter_table("webhooks") as batch:
        batch.drop_column("allow_private")
