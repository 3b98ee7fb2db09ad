"""Alembic environment: migrations run on the async engine through ``run_sync``.

:mod:`app.store.migrate` opens the write transaction (``BEGIN IMMEDIATE`` on SQLite, an
advisory lock on PostgreSQL) and hands its connection over in ``config.attributes``, so
concurrent ``carryover serve`` processes migrate one after the other, each in one transaction.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection

from app.store.tables import metadata


def run_migrations(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        # SQLite rewrites a table to alter it; batch mode does that for later revisions.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def main() -> None:
    if context.is_offline_mode():
        raise RuntimeError("offline (--sql) migrations are not supported; use app.store.migrate")
    connection = context.config.attributes.get("connection")
    if connection is not None:
        run_migrations(connection)
        return
    # Plain `alembic` command line: build the engine from sqlalchemy.url.
    from app.store.migrate import run_in_transaction

    url = context.config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("set sqlalchemy.url or run migrations through app.store.migrate")
    asyncio.run(run_in_transaction(url, run_migrations))


main()
