"""Engines and transactions for the two supported databases (contract §5).

- SQLite (the embedded default, ``sqlite:///./carryover.db``) runs on aiosqlite in WAL mode with
  foreign keys on and a busy timeout. pysqlite's own transaction handling is switched off and
  :func:`write_transaction` / :func:`read_transaction` emit the ``BEGIN`` themselves, as the
  transaction's first statement: a plain (deferred) ``BEGIN`` for reads and ``BEGIN IMMEDIATE``
  for writes. Taking the write lock up front is what makes concurrent
  writers wait on ``busy_timeout`` instead of failing with "database is locked" when a read lock
  would have to be upgraded mid-transaction.
- PostgreSQL (``postgresql://…``) runs on asyncpg. Writes use the default READ COMMITTED (every
  write that matters is a conditional ``UPDATE … WHERE version = …``); reads run in a
  REPEATABLE READ, read-only transaction so that the conversation row and its messages come
  from one snapshot. A pooled connection is checked when it is taken from the pool
  (:func:`_configure_postgresql`): one the driver knows is closed (a restart, a terminated
  backend) is replaced at once, and one that sat idle for :data:`IDLE_PING_SECONDS` is pinged
  first; a connection in steady use is not pinged.

Every transaction is opened with :func:`write_transaction` or :func:`read_transaction`; a read
of one statement may use :func:`read_one`, which on PostgreSQL opens none. The
engine has no event listener of its own (a ``begin`` listener used to emit the ``BEGIN``): with
none, SQLAlchemy skips its event dispatch on every statement (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, cast

from sqlalchemy import event, exc
from sqlalchemy.engine import URL, RowMapping, make_url
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry, PoolProxiedConnection, QueuePool
from sqlalchemy.sql.base import Executable
from sqlalchemy.util.concurrency import greenlet_spawn

from . import pg_driver, sqlite_driver
from .direct import DirectConnection

_DRIVERS = {"sqlite": "sqlite+aiosqlite", "postgresql": "postgresql+asyncpg"}
_ALIASES = {"postgres": "postgresql"}

DEFAULT_BUSY_TIMEOUT_MS = 5000

#: a PostgreSQL connection idle in the pool longer than this is pinged before it is used
#: (a middlebox may have dropped it without a word); one used more recently is not
IDLE_PING_SECONDS = 30.0


def async_url(url: str | URL) -> URL:
    """Map ``sqlite:///…`` and ``postgresql://…`` URLs onto the async drivers Carryover uses.

    URLs that already name ``aiosqlite`` / ``asyncpg`` are kept; any other driver is refused
    rather than silently replaced.
    """
    parsed = make_url(url)
    backend = _ALIASES.get(parsed.get_backend_name(), parsed.get_backend_name())
    if backend not in _DRIVERS:
        raise ValueError(f"unsupported database {parsed.drivername!r}: use sqlite or postgresql")
    wanted = _DRIVERS[backend]
    if parsed.drivername in (sqlite_driver.DRIVERNAME, pg_driver.DRIVERNAME):  # given back
        return parsed
    if "+" in parsed.drivername and parsed.drivername != wanted:
        raise ValueError(f"unsupported driver {parsed.drivername!r}: Carryover uses {wanted!r}")
    return parsed.set(drivername=wanted)


def make_engine(
    url: str | URL,
    *,
    busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
    idle_ping_seconds: float | None = IDLE_PING_SECONDS,
    **kwargs: Any,
) -> AsyncEngine:
    """An AsyncEngine for ``url`` with Carryover's connection and transaction setup.

    ``idle_ping_seconds`` (PostgreSQL): how long a pooled connection may sit idle before it is
    pinged when taken (:func:`_configure_postgresql`); None: no check on checkout at all."""
    target = async_url(url)
    if target.get_backend_name() == "sqlite":
        # one thread hop per statement instead of up to four (app/store/sqlite_driver.py)
        engine = create_async_engine(target.set(drivername=sqlite_driver.DRIVERNAME), **kwargs)
        _configure_sqlite(engine, busy_timeout_ms)
        # prepared statements straight on that driver (app/store/direct.py)
        return DirectEngine(engine.sync_engine)
    # the most recently used connection first: the others stay idle and are pinged when
    # next taken, and the busy one's prepared statements stay warm
    if "poolclass" not in kwargs:  # the default queue pool
        kwargs.setdefault("pool_use_lifo", True)
    # inserts held for the next statement ride with it (app/store/pg_driver.py)
    engine = create_async_engine(target.set(drivername=pg_driver.DRIVERNAME), **kwargs)
    if idle_ping_seconds is not None and not kwargs.get("pool_pre_ping"):
        _configure_postgresql(engine, idle_ping_seconds)
    # prepared statements straight on that driver (app/store/direct.py)
    return DirectEngine(engine.sync_engine)


class DirectEngine(AsyncEngine):
    """The engine :func:`make_engine` makes: its connections run prepared statements straight
    on the driver connection (:class:`app.store.direct.DirectConnection`)."""

    __slots__ = ()
    _connection_cls = DirectConnection

    async def dispose(self, close: bool = True) -> None:
        await give_back_writers(self)
        await super().dispose(close)


def _configure_postgresql(engine: AsyncEngine, idle_ping_seconds: float) -> None:
    """Check a connection as it leaves the pool, without a round trip when it was in use
    lately.

    SQLAlchemy's ``pool_pre_ping`` sends three statements (``BEGIN``, an empty query,
    ``ROLLBACK``) on every checkout, two checkouts per run. Here: a connection asyncpg knows
    is closed (the server restarted or ended its backend: it sent its goodbye and closed the
    socket) is replaced without asking the server; one that was idle for more than
    ``idle_ping_seconds`` is pinged as ``pool_pre_ping`` would, since a connection dropped
    silently on the way (a NAT or firewall timeout) looks open until used. Either way a dead
    connection raises :class:`~sqlalchemy.exc.DisconnectionError`: the pool discards every
    connection older than it and hands out a new one. A connection that dies between the
    check and its first statement fails that statement as ``connection_lost``
    (app/store/faults.py), retried where that is safe."""

    @event.listens_for(engine.sync_engine, "connect")
    def _connected(_dbapi_connection: DBAPIConnection, record: ConnectionPoolEntry) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine.sync_engine, "checkin")
    def _checked_in(_dbapi_connection: DBAPIConnection | None, record: ConnectionPoolEntry) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine.sync_engine, "checkout")
    def _checked_out(
        dbapi_connection: DBAPIConnection,
        record: ConnectionPoolEntry,
        _proxy: PoolProxiedConnection,
    ) -> None:
        if cast(Any, dbapi_connection).driver_connection.is_closed():
            raise exc.DisconnectionError("the connection was closed")
        idle_since = record.info.get("idle_since")
        if idle_since is None or time.monotonic() - idle_since > idle_ping_seconds:
            try:
                dbapi_connection.ping()
            except Exception as error:
                raise exc.DisconnectionError(f"the ping failed: {error}") from error


def _configure_sqlite(engine: AsyncEngine, busy_timeout_ms: int) -> None:
    # the engine's connections' log checkpoints, off the event loop (sqlite_driver.Checkpoints)
    checkpoints = _checkpoints[engine.sync_engine] = sqlite_driver.Checkpoints()

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
        one_hop = isinstance(dbapi_connection, sqlite_driver.OneHopConnection)
        # Take BEGIN away from the driver; the "begin" listener below emits it.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            # the mode it is in: not WAL where the file system cannot share memory (nor for an
            # in-memory database), and a COMMIT then syncs the file: never on the loop
            row = cursor.fetchone()
            wal = row is not None and str(row[0]).lower() == "wal"
            cursor.execute("PRAGMA synchronous=NORMAL")  # durable enough in WAL mode
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
            if one_hop and wal:  # its log is checkpointed on a schedule of its own (below)
                cursor.execute("PRAGMA wal_autocheckpoint=0")
        finally:
            cursor.close()
        if one_hop:
            driver = cast(sqlite_driver.OneHopConnection, dbapi_connection)
            driver.busy_timeout_ms = int(busy_timeout_ms)
            if wal:
                driver.checkpoints = checkpoints


_checkpoints: weakref.WeakKeyDictionary[Any, sqlite_driver.Checkpoints] = (
    weakref.WeakKeyDictionary()
)


def sqlite_checkpoints(engine: AsyncEngine) -> sqlite_driver.Checkpoints | None:
    """When the log of the SQLite database under ``engine`` is checkpointed (None: not an
    engine :func:`make_engine` made for SQLite)."""
    return _checkpoints.get(engine.sync_engine)


def is_sqlite(engine: AsyncEngine | AsyncConnection) -> bool:
    return engine.dialect.name == "sqlite"


@asynccontextmanager
async def write_transaction(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """One write transaction: ``BEGIN IMMEDIATE`` on SQLite, ``BEGIN`` on PostgreSQL.

    Commits when the block ends normally, rolls back if it raises. On SQLite the writers of one
    engine queue for the write lock in order, in this process: SQLite's busy handler polls, so
    under load a writer among many could lose every poll until ``busy_timeout`` and fail with
    "database is locked"; the busy timeout is left to arbitrate between processes. Since they
    take turns, they share one connection (:class:`_Writer`).
    """
    if engine.dialect.name != "sqlite":
        async with engine.connect() as conn:
            async with conn.begin():
                yield conn
        return
    writer = await _sqlite_writer(engine)
    async with writer.lock:
        conn = await writer.take(engine)
        committed = False
        try:
            driver = _one_hop(conn)
            if driver is None:  # a listener sees the transaction's every statement
                async with conn.begin():
                    await _sqlite_begin(conn, "BEGIN IMMEDIATE")
                    yield conn
            else:
                driver.begin_direct()
                yield conn
                await _commit_direct(conn, driver)
            committed = True
        finally:
            if committed and writer.keeps:
                writer.connection = conn
            else:  # back to the pool, which rolls back what is left, as it always did
                await conn.close()


async def _commit_direct(conn: AsyncConnection, driver: sqlite_driver.OneHopConnection) -> None:
    """Commit a transaction begun on SQLite's driver (:meth:`~app.store.sqlite_driver.
    OneHopConnection.begin_direct`): through SQLAlchemy when a statement it executed itself
    began its own transaction there too, else on the driver, in a greenlet only when the
    ``COMMIT`` goes to aiosqlite's thread. Its errors are SQLAlchemy's, as on its own path."""
    if conn.in_transaction():
        await conn.commit()
        return
    try:
        if driver.needs_thread_to_commit():
            await greenlet_spawn(driver.commit)
        else:
            driver.commit()
    except Exception as error:
        sync = conn.sync_connection
        assert sync is not None
        await greenlet_spawn(sync._handle_dbapi_exception, error, None, None, None, None)
        raise


class _Writer:
    """The SQLite writers of one engine on one event loop: they take turns on :attr:`lock`
    and share :attr:`connection`, kept out of the pool between their transactions.

    A pool checkout and check-in per write transaction costs about as much CPU as a run's
    statements together (two write transactions per run); one writer at a time needs one
    connection. A transaction that did not commit gives its connection back to the pool,
    which rolls back what is left, and the next takes a new one; so does a connection found
    closed, invalidated or in a transaction. A connection kept for an event loop that has
    closed is given back the next time the engine writes, and the engine's ``dispose``
    gives back those of this loop and of closed ones (:class:`DirectEngine`). A pool of one
    connection keeps none: its readers would wait for it."""

    __slots__ = ("connection", "keeps", "lock")

    def __init__(self, engine: AsyncEngine) -> None:
        self.lock = asyncio.Lock()
        self.connection: AsyncConnection | None = None
        pool = engine.sync_engine.pool
        # (a queue pool's max_overflow: -1 for no limit)
        self.keeps = not isinstance(pool, QueuePool) or pool.size() > 1 or pool._max_overflow != 0

    async def take(self, engine: AsyncEngine) -> AsyncConnection:
        conn, self.connection = self.connection, None
        if conn is not None:
            if not (conn.closed or conn.invalidated or conn.in_transaction()):
                return conn
            await conn.close()
        return await engine.connect().start()

    async def give_back(self) -> None:
        conn, self.connection = self.connection, None
        if conn is not None:
            await conn.close()


_writers: weakref.WeakKeyDictionary[Any, dict[asyncio.AbstractEventLoop, _Writer]] = (
    weakref.WeakKeyDictionary()
)


async def _sqlite_writer(engine: AsyncEngine) -> _Writer:
    """The engine's writer on the running event loop; the connections kept for loops that
    have closed are given back to the pool first."""
    loop = asyncio.get_running_loop()
    writers = _writers.setdefault(engine.sync_engine, {})
    found = writers.get(loop)
    if found is None:
        await _give_back(writers, lambda other: other.is_closed())
        found = writers[loop] = _Writer(engine)
    return found


async def _give_back(
    writers: dict[asyncio.AbstractEventLoop, _Writer],
    which: Callable[[asyncio.AbstractEventLoop], bool],
) -> None:
    for loop in [loop for loop in writers if which(loop)]:
        await writers.pop(loop).give_back()


async def give_back_writers(engine: AsyncEngine) -> None:
    """Give the connections kept for the engine's SQLite writers on this event loop, and on
    loops that have closed, back to the pool (before it is disposed of)."""
    writers = _writers.get(engine.sync_engine)
    if writers:
        here = asyncio.get_running_loop()
        await _give_back(writers, lambda loop: loop is here or loop.is_closed())


@asynccontextmanager
async def read_transaction(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """One read-only transaction over a single consistent snapshot."""
    async with engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            await conn.execution_options(
                isolation_level="REPEATABLE READ", postgresql_readonly=True
            )
        async with conn.begin():
            if conn.dialect.name == "sqlite":
                await _sqlite_begin(conn, "BEGIN")
            yield conn


async def read_one(
    engine: AsyncEngine, statement: Executable, parameters: Mapping[str, Any] | None = None
) -> list[RowMapping]:
    """The rows of one read-only ``statement``, read at once.

    One statement sees one snapshot on either engine. On PostgreSQL it therefore runs with no
    transaction of its own: one round trip, not three (``BEGIN``, the statement, ``COMMIT``), for
    what is read again and again (a reader's poll of a running run). On SQLite it runs in
    :func:`read_transaction`, whose ``BEGIN`` rides with it.

    A read is safe to repeat, so on PostgreSQL a statement whose connection turns out to be
    gone (a backend ended or a server restarted behind the pool's back: SQLAlchemy drops the
    connection, and the pool's others with it) is sent once more, on a fresh one. A database
    that is still down then answers as it is (refused: ``unavailable``), not as the stale
    connection did."""
    if engine.dialect.name != "postgresql":
        async with read_transaction(engine) as conn:
            return list((await conn.execute(statement, parameters)).mappings().all())
    try:
        return await _read_autocommit(engine, statement, parameters)
    except exc.DBAPIError as error:
        if not error.connection_invalidated:
            raise
    return await _read_autocommit(engine, statement, parameters)


async def _read_autocommit(
    engine: AsyncEngine, statement: Executable, parameters: Mapping[str, Any] | None
) -> list[RowMapping]:
    async with engine.connect() as conn:
        autocommit = await conn.execution_options(isolation_level="AUTOCOMMIT")
        return list((await autocommit.execute(statement, parameters)).mappings().all())


def _one_hop(conn: AsyncConnection) -> sqlite_driver.OneHopConnection | None:
    """The one-hop driver connection under ``conn`` (:mod:`app.store.sqlite_driver`), when
    no statement listener is on the engine or the connection; else None."""
    driver = _driver(conn)
    return driver if isinstance(driver, sqlite_driver.OneHopConnection) else None


def _driver(conn: AsyncConnection) -> Any:
    """The driver connection under ``conn`` when no statement listener is on the engine or
    the connection (a listener must see every statement when it is executed); else None."""
    sync = conn.sync_connection
    if sync is None or sync._has_events or sync.engine._has_events:
        return None
    return sync.connection.dbapi_connection


async def _sqlite_begin(conn: AsyncConnection, statement: str) -> None:
    """Open the transaction with ``statement`` on SQLite.

    On the engines :func:`make_engine` makes, with no statement listener on the engine or the
    connection, it runs in the same call in aiosqlite's thread as the transaction's first
    statement, just before it
    (:meth:`app.store.sqlite_driver.OneHopConnection.begin_with_next`): no pass through
    SQLAlchemy and no thread hop of its own. A listener (tracing's SQLAlchemy
    instrumentation, a test counting statements) sees it as a statement of its own, as before."""
    driver = _one_hop(conn)
    if driver is not None:
        driver.begin_with_next(statement)
    else:
        await conn.exec_driver_sql(statement)


def defer_inserts(conn: AsyncConnection) -> None:
    """From here to the end of this write transaction, a plain ``INSERT`` (no ``RETURNING``)
    runs with the transaction's next statement or its ``COMMIT`` instead of on its own: on
    SQLite in that statement's call into aiosqlite's thread
    (:meth:`app.store.sqlite_driver.OneHopConnection.defer_inserts`), on PostgreSQL as a
    ``WITH`` clause of that statement, or of one statement just before it when it could see
    their rows (:mod:`app.store.pg_driver`). For the inserts of a transaction whose results
    nobody reads and whose errors nobody catches one by one: what one raises, the next
    statement or the commit raises, and everything rolls back. Nothing changes when a
    statement listener (tracing, a test) is on the engine: then each runs when it is
    executed."""
    driver = _driver(conn)
    if isinstance(driver, sqlite_driver.OneHopConnection):
        driver.defer_inserts()
    elif isinstance(driver, pg_driver.KeepingConnection):
        driver.holding = True
