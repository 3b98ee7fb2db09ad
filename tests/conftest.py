"""Shared database fixtures: a fresh database per test, on SQLite and on PostgreSQL.

- ``database_url``: a migrated, empty database, parametrized over ``sqlite`` (a temp file) and
  ``postgresql`` (a database of its own, dropped afterwards). Migrations are applied with
  ``app.store.migrate.upgrade`` (never ``create_all``), once per session into a template that each
  test copies: the SQLite file is copied, the PostgreSQL database is ``CREATE DATABASE …
  TEMPLATE``.
- ``empty_database_url``: the same, never migrated (for migration tests).
- ``engine``: an AsyncEngine on ``database_url``; ``repo``: a ``Repository`` on it.

PostgreSQL comes from ``CARRYOVER_TEST_POSTGRES_URL`` (default
``postgresql://postgres@127.0.0.1:5432/test``), used as the admin connection that creates and
drops the per-test databases. When no connection to it can be made (server unreachable, its
database missing, login refused) the ``postgresql`` cases are skipped with the reason, or fail
when ``CARRYOVER_REQUIRE_POSTGRES=1`` (CI sets it).

Admin work runs on its own event loop in a helper thread, so these fixtures never touch the
event loop pytest-asyncio gives each test.

Also here: ``clock``, a ``ManualClock`` the test moves (one per test), and the suite's order
under pytest-xdist (``./scripts/test`` runs ``-n N --dist loadscope``: each module runs on one
worker, so a module-scoped fixture, a built wheel, a private PostgreSQL cluster or a live
server, is set up once): the slowest modules are handed out first.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import asyncpg
import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from app.clock import ManualClock
from app.store.db import make_engine
from app.store.migrate import upgrade
from tests.repository import Repository

T = TypeVar("T")

POSTGRES_ADMIN_URL = os.environ.get(
    "CARRYOVER_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
BACKENDS = ["sqlite", "postgresql"]


def run_blocking(fn: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine function to completion on a private loop in a helper thread."""

    async def main() -> T:
        return await fn()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, main()).result()


# --- PostgreSQL --------------------------------------------------------------------------------


def _postgres_url(database: str) -> str:
    url = make_url(POSTGRES_ADMIN_URL).set(drivername="postgresql", database=database)
    return url.render_as_string(hide_password=False)


def _require_postgres() -> None:
    """Skip (or, with ``CARRYOVER_REQUIRE_POSTGRES=1``, fail) unless the admin database answers."""
    problem = _postgres_problem()
    if problem is None:
        return
    if os.environ.get("CARRYOVER_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"{problem} (CARRYOVER_REQUIRE_POSTGRES=1)")
    pytest.skip(problem)


@functools.cache
def _postgres_problem() -> str | None:
    """Why the admin connection cannot be used, or ``None``: a real login to the admin
    database, asked once per session. A listening port alone is not enough (the database named
    in ``CARRYOVER_TEST_POSTGRES_URL`` may not exist, or the role may be refused)."""
    url = make_url(POSTGRES_ADMIN_URL)
    where = f"PostgreSQL {url.render_as_string(hide_password=True)} (CARRYOVER_TEST_POSTGRES_URL)"
    admin_db = url.database or "postgres"

    async def probe() -> None:
        conn = await asyncpg.connect(_postgres_url(admin_db), timeout=5)
        await conn.close()

    try:
        run_blocking(probe)
    except asyncpg.InvalidCatalogNameError:
        return f"{where}: database {admin_db!r} does not exist; create it or point the URL at one"
    except (TimeoutError, OSError) as exc:
        return f"{where} is unreachable: {exc or type(exc).__name__}"
    except (asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        return f"{where} refused the connection: {type(exc).__name__}: {exc}"
    return None


async def _postgres_admin(sql: str) -> None:
    admin_db = make_url(POSTGRES_ADMIN_URL).database or "postgres"
    conn = await asyncpg.connect(_postgres_url(admin_db))
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def _create_postgres_database(template: str | None = None) -> str:
    name = f"carryover_test_{uuid.uuid4().hex[:16]}"
    suffix = f' TEMPLATE "{template}"' if template else ""
    run_blocking(lambda: _postgres_admin(f'CREATE DATABASE "{name}"{suffix}'))
    return name


def _drop_postgres_database(name: str) -> None:
    run_blocking(lambda: _postgres_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="session")
def _postgres_dropper() -> Iterator[ThreadPoolExecutor]:
    """Drops per-test databases in the background (a DROP DATABASE waits for a checkpoint)."""
    dropper = ThreadPoolExecutor(max_workers=8, thread_name_prefix="drop-test-db")
    try:
        yield dropper
    finally:
        dropper.shutdown(wait=True)


@pytest.fixture(scope="session")
def _postgres_template(_postgres_dropper: ThreadPoolExecutor) -> Iterator[str]:
    _require_postgres()
    name = _create_postgres_database()
    try:
        run_blocking(lambda: upgrade(_postgres_url(name)))
        yield name
    finally:
        _postgres_dropper.submit(_drop_postgres_database, name)


# --- SQLite ------------------------------------------------------------------------------------


def _sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


@pytest.fixture(scope="session")
def _sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sqlite-template") / "template.db"
    run_blocking(lambda: upgrade(_sqlite_url(path)))
    return path


def _copy_sqlite(template: Path, target: Path) -> None:
    # Closing the migration's last connection checkpoints the WAL; copy it anyway if present.
    for suffix in ("", "-wal"):
        source = template.with_name(template.name + suffix)
        if source.exists():
            shutil.copyfile(source, target.with_name(target.name + suffix))


# --- fixtures ----------------------------------------------------------------------------------


def _fresh_database(
    request: pytest.FixtureRequest, tmp_path: Path, *, migrated: bool
) -> Iterator[str]:
    if request.param == "sqlite":
        path = tmp_path / "carryover.db"
        if migrated:
            _copy_sqlite(request.getfixturevalue("_sqlite_template"), path)
        yield _sqlite_url(path)
        return
    dropper: ThreadPoolExecutor = request.getfixturevalue("_postgres_dropper")
    if not migrated:
        _require_postgres()
        name = _create_postgres_database()
        try:
            yield _postgres_url(name)
        finally:
            dropper.submit(_drop_postgres_database, name)
        return
    pool: _PostgresPool = request.getfixturevalue("_postgres_pool")
    name = pool.take()
    try:
        yield _postgres_url(name)
    finally:
        pool.give_back(name)


class _PostgresPool:
    """Migrated PostgreSQL databases of this worker, emptied between tests and used again.

    A database of its own per test, as before, but not a new one: ``CREATE DATABASE … TEMPLATE``
    and ``DROP DATABASE`` cost the server more CPU than most tests (the catalog is copied through
    the WAL, a new database starts with cold caches). After a test the database goes back to the
    pool only when it is again exactly what the template is: its connections are closed, every
    row is deleted, and its schema and settings (tables, columns, indexes, constraints,
    triggers, functions, sequences, ``ALLOW_CONNECTIONS`` and per-database settings) must match
    the template's; a test that changed any of them (created a table, altered the database)
    leaves its database to be dropped instead."""

    def __init__(self, template: str, dropper: ThreadPoolExecutor) -> None:
        self.template = template
        self.dropper = dropper
        self.free: list[str] = []
        self.all: set[str] = set()
        self.shape = run_blocking(lambda: _with_database(template, _shape))
        self.tables: list[str] = run_blocking(lambda: _with_database(template, _tables))

    def take(self) -> str:
        if self.free:
            return self.free.pop()
        name = _create_postgres_database(template=self.template)
        self.all.add(name)
        return name

    def give_back(self, name: str) -> None:
        try:
            clean = run_blocking(lambda: self._empty(name))
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            clean = False
        if clean:
            self.free.append(name)
        else:
            self.all.discard(name)
            self.dropper.submit(_drop_postgres_database, name)

    async def _empty(self, name: str) -> bool:
        await _postgres_admin(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            f" WHERE datname = '{name}' AND pid <> pg_backend_pid()"
        )
        conn = await asyncpg.connect(_postgres_url(name), timeout=10)
        try:
            await conn.execute("SET lock_timeout = '5s'")
            if await _shape(conn) != self.shape:
                return False
            async with conn.transaction():
                # the rows only, in any order: foreign keys are not checked while replicating
                await conn.execute("SET LOCAL session_replication_role = replica")
                for table in self.tables:
                    await conn.execute(f'DELETE FROM "{table}"')
                for (sequence,) in await conn.fetch(
                    "SELECT sequencename FROM pg_sequences WHERE schemaname = 'public'"
                ):
                    await conn.execute(f'ALTER SEQUENCE "{sequence}" RESTART')
            return True
        finally:
            await conn.close()

    def close(self) -> None:
        for name in self.all:
            self.dropper.submit(_drop_postgres_database, name)


async def _with_database(name: str, fn: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
    conn = await asyncpg.connect(_postgres_url(name), timeout=10)
    try:
        return await fn(conn)
    finally:
        await conn.close()


async def _tables(conn: asyncpg.Connection) -> list[str]:
    rows = await conn.fetch(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
        " AND tablename <> 'alembic_version' ORDER BY tablename"
    )
    return [row[0] for row in rows]


async def _shape(conn: asyncpg.Connection) -> str:
    """What a test must not have changed: the schema (with the migration version) and the
    database's own settings, as one text."""
    rows = await conn.fetch(
        """
        SELECT 'rel', c.relname || ':' || c.relkind::text, '' FROM pg_class c
          JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public'
        UNION ALL
        SELECT 'col', c.relname || '.' || a.attname,
               format_type(a.atttypid, a.atttypmod) || a.attnotnull::text
               || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
          FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
          JOIN pg_namespace n ON n.oid = c.relnamespace
          LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE n.nspname = 'public' AND a.attnum > 0 AND NOT a.attisdropped
        UNION ALL
        SELECT 'con', conname, pg_get_constraintdef(oid) FROM pg_constraint
         WHERE connamespace = 'public'::regnamespace
        UNION ALL
        SELECT 'idx', indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'
        UNION ALL
        SELECT 'trg', tgname, tgrelid::regclass::text FROM pg_trigger WHERE NOT tgisinternal
        UNION ALL
        SELECT 'fn', proname, pg_get_function_identity_arguments(oid) FROM pg_proc
         WHERE pronamespace = 'public'::regnamespace
        UNION ALL
        SELECT 'ext', extname, extversion FROM pg_extension
        UNION ALL
        SELECT 'db', datallowconn::text || datconnlimit::text, '' FROM pg_database
         WHERE datname = current_database()
        UNION ALL
        SELECT 'set', array_to_string(s.setconfig, ','), '' FROM pg_db_role_setting s
          JOIN pg_database d ON d.oid = s.setdatabase WHERE d.datname = current_database()
        UNION ALL
        SELECT 'ver', version_num, '' FROM alembic_version
        ORDER BY 1, 2, 3
        """
    )
    return "\n".join(" ".join(row) for row in rows)


@pytest.fixture(scope="session")
def _postgres_pool(
    _postgres_template: str, _postgres_dropper: ThreadPoolExecutor
) -> Iterator[_PostgresPool]:
    pool = _PostgresPool(_postgres_template, _postgres_dropper)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(params=BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh database at the head revision, on each backend."""
    yield from _fresh_database(request, tmp_path, migrated=True)


@pytest.fixture(params=BACKENDS)
def empty_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh database with no schema at all, on each backend."""
    yield from _fresh_database(request, tmp_path, migrated=False)


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    engine = make_engine(database_url)
    try:
        yield engine
    finally:
        await engine.dispose()


@pytest.fixture
def repo(engine: AsyncEngine) -> Repository:
    return Repository(engine)


@pytest.fixture
def clock() -> ManualClock:
    """A clock that moves only when the test advances it (leases, TTLs, retention)."""
    return ManualClock()


# --- the order of the suite under pytest-xdist ---------------------------------------------------

#: the slowest parts of the suite (seconds each: a wheel built, servers started, a cluster
#: restarted, an API fuzzed), handed to the workers first so that none is left to run alone at
#: the end; in this order, the rest keeps its order
SLOW_FIRST = (
    "tests/frame/test_wheel.py",
    "tests/console/",
    "tests/client/",
    "tests/security/test_schemathesis.py",
    "tests/faults/",
    "tests/lifecycle/",
    "tests/frame/test_cli_conversations.py",
    "tests/frame/test_chat.py",
)


def _rank(item: pytest.Item) -> int:
    path = item.nodeid.split("::", 1)[0]
    for rank, prefix in enumerate(SLOW_FIRST):
        if path.startswith(prefix):
            return rank
    return len(SLOW_FIRST)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slowest parts first (``SLOW_FIRST``; a stable sort, so the order within each part and
    of the rest stays the collection's): xdist hands the modules out in this order."""
    items.sort(key=_rank)


# --- an invariant of the whole suite -------------------------------------------------------------


@pytest.fixture(autouse=True)
def every_result_is_replayable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every Result any test produces — through the agent, the service or HTTP — keeps a
    storable context (contract §1, docs/tools.md): replayable, except that it may end with pending
    calls, and then ``required_action`` lists exactly them; a ``requires_action`` run has some."""
    from app.agent.records import Result
    from app.agent.replay import validate_context, validate_storable
    from app.agent.run import Agent

    guarded = Agent._guarded

    async def checked(self: Agent, *args: object, **kwargs: object) -> Result:
        result = await guarded(self, *args, **kwargs)  # type: ignore[arg-type]
        if result.required_action is None:
            validate_context(result.context)
        else:
            validate_storable(result.context)
            assert [c.id for c in result.required_action.tool_calls] == [
                c.id for c in self.pending_calls(result.context)
            ]
        assert result.status != "requires_action" or result.required_action is not None
        return result

    monkeypatch.setattr(Agent, "_guarded", checked)
