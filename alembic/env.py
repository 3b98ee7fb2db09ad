"""Alembic environment of Carryover's schema (``app/store/tables.py``).

Two ways in, one migration path:

- ``alembic …`` at the repository root (``alembic.ini``): the database is
  ``CARRYOVER_DATABASE_URL``, default ``sqlite:///./carryover.db`` as for the service, in the
  forms the service accepts (``sqlite:///…``, ``postgresql://…``, or naming ``aiosqlite`` /
  ``asyncpg``). The migration runs on the async engine the service uses, inside the one write
  transaction of :func:`app.store.migrate.run_in_transaction`.
- :mod:`app.store.migrate` (``carryover migrate`` / ``serve``, the tests) opens that transaction
  itself and hands its connection over in ``config.attributes["connection"]``.

Either way: ``BEGIN IMMEDIATE`` on SQLite and an advisory lock on PostgreSQL, so concurrent
migrators go one after the other. ``--sql`` (offline) prints the DDL for the URL's engine.

This directory is not a Python package (no ``__init__.py``): an ``alembic`` package here would
shadow the library when Python runs from the repository root.
"""

from __future__ import annotations

import asyncio
import os
from logging.config import fileConfig
from typing import Any, Literal

from alembic import context
from alembic.autogenerate.api import AutogenContext
from sqlalchemy.engine import Connection
from sqlalchemy.types import TypeDecorator
from sqlmodel.sql.sqltypes import AutoString

from app.config import Settings
from app.store.db import async_url
from app.store.tables import metadata

#: the service's default database (``Settings.database_url``)
DEFAULT_DATABASE_URL: str = Settings.model_fields["database_url"].default


def database_url() -> str:
    """``CARRYOVER_DATABASE_URL``; unset or empty means the service's default."""
    return os.environ.get("CARRYOVER_DATABASE_URL", "").strip() or DEFAULT_DATABASE_URL


def render_item(type_: str, obj: Any, autogen_context: AutogenContext) -> str | Literal[False]:
    """Render the tables' column types as plain SQLAlchemy types in generated revisions.

    A revision must not import the application (it has to keep working when ``tables.py``
    moves on): SQLModel's ``AutoString`` becomes ``sa.String``, and ``JSONText`` /
    ``UTCDateTime`` become what they store (``sa.Text``, ``sa.DateTime(timezone=True)``).
    """
    if type_ != "type":
        return False
    if isinstance(obj, AutoString):
        return f"sa.String(length={obj.length})" if obj.length else "sa.String()"
    if isinstance(obj, TypeDecorator):
        impl = obj.impl_instance
        if type(impl).__module__.startswith("sqlalchemy."):
            return f"sa.{impl!r}"
    return False


def _configure(**kwargs: Any) -> None:
    context.configure(
        target_metadata=metadata,
        # types are compared too, so `alembic check` notices a changed length or type
        compare_type=True,
        # SQLite rewrites a table to alter it: autogenerate writes batch_alter_table blocks,
        # whichever engine it compared against, so every revision runs on both (on
        # PostgreSQL a batch is plain ALTER TABLE statements)
        render_as_batch=True,
        render_item=render_item,
        **kwargs,
    )


def run_migrations(connection: Connection) -> None:
    _configure(connection=connection)
    with context.begin_transaction():
        context.run_migrations()


def run_offline() -> None:
    """``alembic upgrade head --sql``: the DDL for the configured URL's engine, not executed."""
    backend = async_url(database_url()).get_backend_name()
    _configure(dialect_name=backend, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def main() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        run_migrations(connection)
        return
    # The `alembic` command line: log as alembic.ini says, open the database ourselves.
    if context.config.config_file_name is not None:
        fileConfig(context.config.config_file_name, disable_existing_loggers=False)
    if context.is_offline_mode():
        run_offline()
        return
    from app.store.migrate import run_in_transaction

    asyncio.run(run_in_transaction(database_url(), run_migrations))


main()
