"""Apply and inspect the Alembic history programmatically (no alembic.ini, any directory).

``carryover migrate`` and ``carryover serve`` call :func:`upgrade`; ``/readyz`` compares
:func:`current_revision` with :func:`head_revision`.

The scripts (``env.py``, ``script.py.mako``, ``versions/``) live once, in ``alembic/`` at the
repository root; the wheel carries that directory as ``app/store/migrations`` (see setup.py).
:data:`MIGRATIONS_DIR` is the installed copy when there is one, else the checkout's ``alembic/``
(a source tree or an editable install), so neither the working directory nor ``alembic.ini``
matter here.

Each upgrade or downgrade runs in one write transaction: ``BEGIN IMMEDIATE`` on SQLite and a
transaction-scoped advisory lock on PostgreSQL, so several processes starting at once migrate
one after the other and the later ones find the schema already at head.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import NullPool

from .db import make_engine, read_transaction, write_transaction


def _migrations_dir() -> Path:
    here = Path(__file__).resolve().parent
    installed = here / "migrations"  # app/store/migrations inside a wheel
    checkout = here.parent.parent  # <checkout>/app/store -> <checkout>
    if not (installed / "env.py").is_file() and (checkout / "alembic.ini").is_file():
        return checkout / "alembic"
    return installed


MIGRATIONS_DIR = _migrations_dir()

# pg_advisory_xact_lock key shared by every Carryover process ("carryover" in ASCII, truncated).
_PG_MIGRATION_LOCK = 0x636172727976


def alembic_config() -> Config:
    if not (MIGRATIONS_DIR / "env.py").is_file():
        raise RuntimeError(
            f"the Alembic scripts are missing: no env.py in {MIGRATIONS_DIR} "
            "(install the carryover wheel, or run from a checkout with alembic/ at its root)"
        )
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


@cache
def head_revision() -> str:
    """The revision the code expects the database to be at (read once: scripts do not change
    under a running process)."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise RuntimeError("the migration history is empty")
    return head


async def upgrade(url: str, revision: str = "head") -> None:
    """Upgrade the database at ``url`` to ``revision`` (creating every table from empty)."""
    await run_in_transaction(url, lambda conn: _command(conn, command.upgrade, revision))


async def downgrade(url: str, revision: str = "base") -> None:
    """Downgrade the database at ``url`` to ``revision`` (``"base"`` drops every table)."""
    await run_in_transaction(url, lambda conn: _command(conn, command.downgrade, revision))


async def current_revision(url_or_engine: str | AsyncEngine) -> str | None:
    """The revision the database is at, or None when it was never migrated."""

    def read(conn: Connection) -> str | None:
        return MigrationContext.configure(conn).get_current_revision()

    if isinstance(url_or_engine, AsyncEngine):
        async with read_transaction(url_or_engine) as conn:
            return await conn.run_sync(read)
    engine = make_engine(url_or_engine, poolclass=NullPool)
    try:
        async with read_transaction(engine) as conn:
            return await conn.run_sync(read)
    finally:
        await engine.dispose()


async def run_in_transaction(url: str, fn: Callable[[Connection], None]) -> None:
    """Run ``fn`` on a sync connection inside one migration write transaction."""
    engine = make_engine(url, poolclass=NullPool)
    try:
        async with write_transaction(engine) as conn:
            if conn.dialect.name == "postgresql":
                await conn.execute(
                    text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK}
                )
            await conn.run_sync(fn)
    finally:
        await engine.dispose()


def _command(conn: Connection, cmd: Callable[[Config, str], None], revision: str) -> None:
    config = alembic_config()
    config.attributes["connection"] = conn
    cmd(config, revision)


def sqlite_path(url: str) -> Path | None:
    """The absolute path of a SQLite URL's file (``None`` for another engine or ``:memory:``)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database).expanduser().resolve()


async def existing_database_problem(url: str) -> str | None:
    """Why an operator command must not use ``url``, or ``None``: a SQLite file that does not
    exist (opening it would create an empty database the server never sees: only ``serve``
    and ``migrate`` create one) or a database whose schema is not at the head revision."""
    path = sqlite_path(url)
    if path is not None and not path.is_file():
        return (
            "it does not exist (only `carryover serve` and `carryover migrate` create a "
            "database): run the command with the server's CARRYOVER_DATABASE_URL, or "
            "`carryover migrate` first to create this one"
        )
    try:
        revision = await current_revision(url)
    except Exception as exc:
        return f"it cannot be read: {type(exc).__name__}: {exc}"
    if revision != head_revision():
        at = f"at revision {revision}" if revision else "not migrated"
        return f"it is {at}, not at {head_revision()}: run `carryover migrate`"
    return None
