"""SQLite on aiosqlite with at most one thread hop per statement.

aiosqlite runs every call of the sqlite3 module in its own thread and hands the answer back to
the event loop: each call is a "hop" (a queue put, a thread wake-up, a ``call_soon_threadsafe``
back), ~50-100 µs of CPU, while a statement of a run costs SQLite itself ~5 µs. SQLAlchemy's
adapter makes up to four hops per statement (open a cursor, execute, fetch the rows, close the
cursor). This dialect is SQLAlchemy's ``sqlite+aiosqlite`` with one change: its cursor executes,
fetches and closes in **one** call in aiosqlite's thread. What a statement does, the thread it
runs in and its errors are unchanged; a run issues ~15 statements, so this removes ~45 hops.
And a transaction's ``BEGIN``, and the inserts it asks to hold (:class:`OneHopConnection`), ride
with its next statement or its ``COMMIT``.

A run's prepared statements (:mod:`app.store.direct`) need no hop at all: each costs SQLite a few
microseconds, less than the hop, so :meth:`OneHopConnection.execute_direct` runs a small one
(:func:`weigh`) on the event loop's own thread, with what rides with it. Everything that could
hold the loop up still goes to the thread: a statement with many rows or much text, every
statement SQLAlchemy executes itself (a read of a whole context, say), a ``BEGIN`` whose lock
another process holds (tried on the loop with the busy timeout at 0, then sent to the thread to
wait). A small transaction that holds the write lock commits on the loop too: its connection
never checkpoints the log in a ``COMMIT`` there (a write and a sync to disk); every few commits
go to the thread with the checkpoint switched on (:class:`Checkpoints`). A warm run makes no
call into the thread but that one in every few (docs/performance.md, "Calls into aiosqlite's
thread").

:func:`app.store.db.make_engine` uses it for every SQLite URL (``sqlite:///…`` and
``sqlite+aiosqlite:///…`` alike); it relies on SQLAlchemy 2.1's asyncio adapter classes, which
``pyproject.toml`` pins.
"""

from __future__ import annotations

import asyncio
import collections
import sqlite3
import weakref
from collections.abc import Callable
from typing import Any, cast

from sqlalchemy.dialects import registry
from sqlalchemy.dialects.sqlite.aiosqlite import (
    AsyncAdapt_aiosqlite_connection,
    AsyncAdapt_aiosqlite_cursor,
    AsyncAdapt_aiosqlite_dbapi,
    SQLiteDialect_aiosqlite,
)
from sqlalchemy.util import EMPTY_DICT
from sqlalchemy.util.concurrency import await_

from .held import HoldsInserts

#: the drivername :func:`app.store.db.make_engine` gives SQLite URLs
DRIVERNAME = "sqlite+carryover_aiosqlite"


#: what one statement's call returns: its description, row count, last row id and rows
_Done = tuple[Any, int, "int | None", "list[Any] | None"]


class _Outcome:
    """What the last statement of a cursor left: its description, row count and last row id
    (read in aiosqlite's thread, kept here for SQLAlchemy to read on the loop)."""

    __slots__ = ("arraysize", "description", "lastrowid", "rowcount")

    def __init__(self) -> None:
        self.description: Any = None
        self.rowcount = -1
        self.lastrowid: int | None = None
        self.arraysize = 1

    def close(self) -> None:
        """Nothing stays open between statements."""


class OneHopCursor(AsyncAdapt_aiosqlite_cursor):
    """A cursor whose statement runs, fetches and closes in one call in aiosqlite's thread."""

    __slots__ = ()
    _awaitable_cursor_close = False  # nothing to close on the loop: see _Outcome.close

    def __init__(self, adapt_connection: Any) -> None:  # no sqlite3 cursor is opened here
        self._adapt_connection = adapt_connection
        self._connection = adapt_connection._connection
        self._cursor = _Outcome()  # type: ignore[assignment]
        self._soft_closed_memoized = EMPTY_DICT
        self._rows = collections.deque()

    async def _execute_async(self, operation: Any, parameters: Any) -> Any:
        connection = cast("OneHopConnection", self._adapt_connection)
        description, rowcount, lastrowid, rows = await connection.call(
            operation, parameters, many=False
        )
        self._record(description, rowcount, lastrowid)
        if rows is not None:
            self._rows = collections.deque(rows)
        return None

    async def _executemany_async(self, operation: Any, seq_of_parameters: Any) -> Any:
        connection = cast("OneHopConnection", self._adapt_connection)
        description, rowcount, lastrowid, _ = await connection.call(
            operation, seq_of_parameters, many=True
        )
        self._record(description, rowcount, lastrowid)
        return None

    def _record(self, description: Any, rowcount: int, lastrowid: int | None) -> None:
        outcome: _Outcome = self._cursor  # type: ignore[assignment]
        outcome.description = description
        outcome.rowcount = rowcount
        outcome.lastrowid = lastrowid


class OneHopConnection(AsyncAdapt_aiosqlite_connection):
    """The driver connection, with what rides with its next call into aiosqlite's thread.

    - :meth:`begin_with_next`: the transaction's ``BEGIN`` runs just before its first
      statement, in that statement's call.
    - :meth:`defer_inserts`: until the transaction ends, an ``INSERT`` without ``RETURNING``
      (whose result nobody reads: SQLAlchemy still processes its parameters and builds its
      result, with no row count) is kept and runs, in order, just before the next statement
      or the ``COMMIT``, in that call. SQLite runs the same statements in the same order in
      the same transaction; what one of them raises, the call it rides with raises (the
      transaction then rolls back, as it would have). A rollback drops what was kept.
    """

    __slots__ = (
        "_begin",
        "_calls",
        "_defer",
        "_deferred",
        "_kept",
        "_threaded",
        "_write_locked",
        "busy_timeout_ms",
        "checkpoints",
        "direct",
        "inline",
        "used",
    )
    _cursor_cls = OneHopCursor

    def __init__(self, dbapi: Any, connection: Any, *, inline: bool = False) -> None:
        super().__init__(dbapi, connection)
        self._begin: str | None = None
        self._defer = False
        self._deferred: list[tuple[str, Any, bool]] = []
        #: the rows and characters of what is kept (:func:`weigh`); None: more than small
        self._kept: tuple[int, int] | None = (0, 0)
        #: a call went into aiosqlite's thread, or a statement ran on the loop, since the last
        #: commit or rollback: a rollback then always goes to the thread (behind such a call,
        #: should it still run: its awaiting task cancelled), whatever SQLite's autocommit
        #: flag reads at that moment
        self.used = False
        #: a call of the open transaction went into aiosqlite's thread (a statement not small,
        #: one SQLAlchemy executed, a BEGIN that waited): its COMMIT goes there too
        self._threaded = False
        #: a write transaction was begun here (:meth:`begin_direct`), not through
        #: SQLAlchemy: prepared statements run straight on this connection until its commit
        #: or rollback
        self.direct = False
        #: the sqlite3 connection may be used on the event loop's thread as well
        #: (``check_same_thread=False``): :meth:`execute_direct` may run there
        self.inline = inline
        #: the connection's busy timeout (set where it is configured); None: unknown, and a
        #: ``BEGIN`` then never runs on the loop
        self.busy_timeout_ms: int | None = None
        #: when the database's log is checkpointed (set where the connection is configured,
        #: with its ``wal_autocheckpoint`` at 0); None: SQLite's own automatic checkpoint,
        #: and every ``COMMIT`` then goes to aiosqlite's thread
        self.checkpoints: Checkpoints | None = None
        #: the calls aiosqlite hands to its thread, counted (:class:`_ThreadCalls`)
        self._calls = _ThreadCalls(connection)
        #: the open transaction began with ``BEGIN IMMEDIATE``: it holds SQLite's write lock,
        #: so its statements never wait on another connection's
        self._write_locked = False

    def begin_with_next(self, statement: str) -> None:
        """Open the transaction with ``statement`` (``BEGIN`` or ``BEGIN IMMEDIATE``) in the
        same call in aiosqlite's thread as the next statement, before it. A commit or
        rollback with no statement in between drops it (nothing was begun)."""
        self._begin = statement

    def begin_direct(self) -> None:
        """Begin a write transaction here, without SQLAlchemy (:attr:`direct`): its
        ``BEGIN IMMEDIATE`` rides with its first statement."""
        self.direct = True
        self.begin_with_next("BEGIN IMMEDIATE")

    def defer_inserts(self) -> None:
        """Keep this transaction's further plain ``INSERT`` statements for the next call
        (class docstring); the transaction's end turns it off."""
        self._defer = True

    def defer(self, operation: str, parameters: Any, many: bool) -> None:
        self._deferred.append((operation, parameters, many))
        if self._kept is not None:
            self._kept = weigh(parameters, many, *self._kept)

    def offer_insert(self, operation: str, parameters: Any, many: bool) -> bool:
        """Keep a plain insert for the next call when inserts are deferred
        (:mod:`app.store.held`)."""
        if not self._defer:
            return False
        self.defer(operation, parameters, many)
        return True

    def take_pending(self) -> Callable[[sqlite3.Connection], None] | None:
        """What must run before the next statement, in its call: the ``BEGIN``, then the
        kept statements (None: nothing)."""
        begin, deferred = self._begin, self._deferred
        if begin is None and not deferred:
            return None
        self._begin, self._deferred, self._kept = None, [], (0, 0)
        if begin is not None:
            self._write_locked = begin == "BEGIN IMMEDIATE"

        def pending(raw: sqlite3.Connection) -> None:
            if begin is not None:
                raw.execute(begin)
            for operation, parameters, many in deferred:
                _run_statement(raw, operation, parameters, many)

        return pending

    async def call(self, operation: str, parameters: Any, *, many: bool) -> _Done:
        """Run one statement in one call into aiosqlite's thread, with what is pending before
        it (:meth:`take_pending`): execute (or executemany), fetch its rows, close the cursor.
        Its description, row count, last row id and rows (None when it returns none)."""
        raw = self._connection._conn  # aiosqlite's sqlite3.Connection, used in its thread

        async with self._execute_mutex:
            before = self.take_pending()
            self.used = True
            self._threaded = True

            def run() -> _Done:
                if before is not None:
                    before(raw)
                return _run_statement(raw, operation, parameters, many)

            return cast(_Done, await self._connection._execute(run))

    async def execute_direct(
        self, operation: str, parameters: Any, *, many: bool, insert: bool
    ) -> tuple[list[Any] | None, int, None]:
        """A statement from outside SQLAlchemy's execution (app/store/direct.py): a plain
        ``INSERT`` (``insert``) while inserts are deferred is kept for the next call, as
        :meth:`offer_insert` keeps SQLAlchemy's; else, when it is small (:func:`weigh`), on the
        event loop (:meth:`_on_loop`), or else :meth:`call`. Its rows, if any, its row count
        (-1 when kept), and no column types (SQLite's driver reports none)."""
        if insert and self.offer_insert(operation, parameters, many):
            return None, -1, None
        if self.inline and self._kept is not None and weigh(parameters, many, *self._kept):
            if self._execute_mutex.locked():
                async with self._execute_mutex:
                    done = self._on_loop(operation, parameters, many)
            else:  # nothing runs between this check and the statement: no one else can enter
                done = self._on_loop(operation, parameters, many)
            if done is not None:
                return done[3], done[1], None
        _, rowcount, _, rows = await self.call(operation, parameters, many=many)
        return rows, rowcount, None

    def _on_loop(self, operation: str, parameters: Any, many: bool) -> _Done | None:
        """Run one statement, with what is pending before it, on the event loop's thread: no
        hop. Only when nothing of this connection is in aiosqlite's thread (it would run
        behind that), and a ``BEGIN`` only when it takes its lock at once: with the busy
        timeout at 0 for it, a lock another process holds answers "busy" at once instead
        of holding up the loop, and the statement then goes to the thread (None), where the
        ``BEGIN`` waits up to the busy timeout as it always did."""
        if self._calls.submitted != self._calls.finished:
            return None
        raw = self._connection._conn
        if self._begin is not None:
            if (
                self._begin != "BEGIN IMMEDIATE"
                or self.busy_timeout_ms is None
                or not _begun_at_once(raw, self._begin, self.busy_timeout_ms)
            ):
                return None
            self._begin = None
            self._write_locked = True
            self.used = True
        elif not self._write_locked:
            return None
        before = self.take_pending()
        self.used = True
        if before is not None:
            before(raw)
        return _run_statement(raw, operation, parameters, many)

    def cursor(self, server_side: bool = False) -> Any:
        if server_side:  # a streamed result: what is pending runs first, in a call of its own
            pending = self.take_pending()
            if pending is not None:
                self._run(pending)
        return super().cursor(server_side)

    def _run(self, fn: Callable[[sqlite3.Connection], None]) -> None:
        raw = self._connection._conn

        async def call() -> None:
            async with self._execute_mutex:
                self.used = True
                self._threaded = True
                await self._connection._execute(fn, raw)

        try:
            await_(call())
        except Exception as error:
            self._handle_exception(error)

    def needs_thread_to_commit(self) -> bool:
        """Whether :meth:`commit` would call into aiosqlite's thread (which, from SQLAlchemy's
        side, takes a greenlet), else it commits on the loop or has nothing to commit."""
        if self._begin is not None and not self._deferred and not self.used:
            return False
        return not self._commits_on_loop()

    def commit(self) -> None:
        self._defer = False
        self.direct = False
        if self._begin is not None and not self._deferred:
            self._begin = None
            if not self.used:
                return  # nothing ran since the BEGIN that was asked: no transaction to commit
        if self._commit_on_loop():
            return
        pending = self.take_pending()  # the kept statements, then COMMIT, in one call
        self._write_locked = False
        self._thread_commit(pending)
        self.used = self._threaded = False

    def _commit_on_loop(self) -> bool:
        """Commit on the event loop's thread, with the kept statements before it, when the
        transaction holds the write lock (``BEGIN IMMEDIATE``: the ``COMMIT`` waits for no
        other connection), every statement of it ran on the loop (all were small), what is
        kept is small too (:func:`weigh`) and no checkpoint is due (:class:`Checkpoints`).
        ``COMMIT`` then appends the few pages the transaction changed to the write-ahead log
        (written, not synced: ``synchronous=NORMAL``) and never checkpoints there (the
        connection's ``wal_autocheckpoint`` is 0). True when it did."""
        checkpoints = self.checkpoints
        if checkpoints is None or not self._commits_on_loop():
            return False
        pending = self.take_pending()
        self._write_locked = False
        raw = self._connection._conn
        try:
            if pending is not None:
                pending(raw)
            raw.commit()
        except Exception as error:
            self._handle_exception(error)
        self.used = False
        checkpoints.committed()
        return True

    def _commits_on_loop(self) -> bool:
        return not (
            self.checkpoints is None
            or not self.inline
            or not self._write_locked
            or self._begin is not None
            or self._threaded
            or self._calls.submitted != self._calls.finished
            or self._kept is None
            or self.checkpoints.due()
        )

    def _thread_commit(self, pending: Callable[[sqlite3.Connection], None] | None) -> None:
        """``COMMIT`` in aiosqlite's thread, with what is pending before it, SQLite's
        automatic checkpoint switched on for it (:class:`Checkpoints`)."""
        checkpoints = self.checkpoints
        if pending is None and checkpoints is None:
            super().commit()
            return

        def commit(raw: sqlite3.Connection) -> None:
            if pending is not None:
                pending(raw)
            if checkpoints is None:
                raw.commit()
                return
            raw.execute(f"PRAGMA wal_autocheckpoint={checkpoints.pages}")
            try:
                raw.commit()
            finally:
                raw.execute("PRAGMA wal_autocheckpoint=0")
            checkpoints.done()

        self._run(commit)

    def rollback(self) -> None:
        """Roll back, without a thread hop when there is nothing to roll back: the pool resets
        every connection it takes back with a rollback, and after a committed transaction
        (every transaction here ends by commit or rollback) none is open. ``in_transaction``
        only reads SQLite's autocommit flag, read only when no call went into aiosqlite's
        thread since the last commit or rollback (:attr:`used`): a call whose awaiting task
        was cancelled may still run there (a ``BEGIN`` riding with a statement not yet
        begun), and the rollback must then queue behind it. What was kept for the next call
        is dropped: it would have been rolled back."""
        self._begin, self._defer, self._deferred, self._kept = None, False, [], (0, 0)
        self.direct = False
        self._write_locked = self._threaded = False
        raw = self._connection._connection
        if not self.used and raw is not None and not raw.in_transaction:
            return
        super().rollback()
        self.used = False


class Checkpoints:
    """When the write-ahead log of one engine's SQLite database is checkpointed.

    A checkpoint copies the log's pages into the database file and syncs it: a write to disk
    that must not hold up the event loop. SQLite runs one in the ``COMMIT`` that leaves the log
    with ``wal_autocheckpoint`` pages or more. The engine's connections have it at 0, so a
    ``COMMIT`` on the loop (:meth:`OneHopConnection._commit_on_loop`) never checkpoints;
    after :attr:`every` commits there the next one goes to aiosqlite's thread with it back at
    :attr:`pages` (SQLite's default, 1,000) for that ``COMMIT``, and so does every commit
    of a transaction that was not small or used the thread. SQLite then checkpoints there
    exactly when it would have after any commit; the log grows by at most :attr:`every`
    small transactions past :attr:`pages` before it does."""

    __slots__ = ("every", "pages", "since")

    def __init__(self, every: int = 16, pages: int = 1000) -> None:
        self.every = every
        self.pages = pages
        #: commits on the loop since the last one in the thread
        self.since = 0

    def due(self) -> bool:
        return self.since >= self.every

    def committed(self) -> None:
        self.since += 1

    def done(self) -> None:
        self.since = 0


class _ThreadCalls:
    """aiosqlite's ``Connection._execute`` for one connection (set on it in its place),
    counting the calls it hands to the connection's thread and those the thread finished:
    equal when nothing of the connection is queued or running there
    (:meth:`OneHopConnection._on_loop` runs a statement only then). It holds the connection
    weakly: a connection dropped without being closed is freed as it was without it, not
    kept by a reference cycle until a garbage collection, when its event loop may be gone."""

    __slots__ = ("connection", "finished", "submitted")

    def __init__(self, connection: Any) -> None:
        self.connection = weakref.ref(connection)
        self.submitted = 0  # only the event loop writes it
        self.finished = 0  # only aiosqlite's thread writes it
        connection._execute = self  # every call aiosqlite makes goes through it

    async def __call__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        connection = self.connection()
        assert connection is not None  # it is calling

        def counted() -> Any:
            try:
                return fn(*args, **kwargs)
            finally:
                self.finished += 1

        self.submitted += 1
        return await type(connection)._execute(connection, counted)


def _run_statement(raw: sqlite3.Connection, operation: str, parameters: Any, many: bool) -> _Done:
    """Execute (or executemany), fetch the rows, close the cursor: one statement's call."""
    cursor = raw.cursor()
    try:
        if many:
            cursor.executemany(operation, parameters)
        elif parameters is None:
            cursor.execute(operation)
        else:
            cursor.execute(operation, parameters)
        rows = cursor.fetchall() if cursor.description else None
        return cursor.description, cursor.rowcount, cursor.lastrowid, rows
    finally:
        cursor.close()


def _begun_at_once(raw: sqlite3.Connection, begin: str, busy_timeout_ms: int) -> bool:
    """Run ``begin`` with the busy timeout at 0, then back at ``busy_timeout_ms``: False when
    another connection held the lock it needs (nothing was begun)."""
    raw.execute("PRAGMA busy_timeout=0")
    try:
        raw.execute(begin)
    except sqlite3.OperationalError as error:
        if error.sqlite_errorcode & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            return False
        raise
    finally:
        raw.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")
    return True


#: what :func:`weigh` lets run on the event loop: the rows of a statement and of the inserts
#: riding with it, and the characters and bytes of their values
LIGHT_ROWS = 256
LIGHT_CHARACTERS = 256 * 1024
_THREAD_STOP_SECONDS = 5.0  # how long a failed connect waits for aiosqlite's thread to end


def weigh(parameters: Any, many: bool, rows: int = 0, size: int = 0) -> tuple[int, int] | None:
    """The rows of a statement with ``parameters`` and the characters and bytes of their
    values, added to ``rows`` and ``size`` (what rides with it); None once past what may run
    on the event loop: :data:`LIGHT_ROWS` rows or :data:`LIGHT_CHARACTERS` of text and bytes.
    A run's statements are small (they carry what the run changed); a context of thousands
    of messages, or a prompt of megabytes, goes to aiosqlite's thread as every other
    statement does. What a transaction keeps for its next call is weighed as it is kept."""
    for row in parameters if many else (parameters,) if parameters is not None else ():
        rows += 1
        for value in row:
            if isinstance(value, (str, bytes)):
                size += len(value)
        if rows > LIGHT_ROWS or size > LIGHT_CHARACTERS:
            return None
    return rows, size


class OneHopDBAPI(AsyncAdapt_aiosqlite_dbapi):
    def connect(self, *arg: Any, **kw: Any) -> OneHopConnection:
        creator_fn = kw.pop("async_creator_fn", None)
        if not creator_fn:
            # its statements may also run on the loop (OneHopConnection.execute_direct),
            # one at a time with those in aiosqlite's thread
            kw["check_same_thread"] = False
        connection = creator_fn(*arg, **kw) if creator_fn else self.aiosqlite.connect(*arg, **kw)
        if not creator_fn:
            connection._thread.daemon = True  # as SQLAlchemy's own adapter does
        try:
            return OneHopConnection(self, await_(connection), inline=not creator_fn)
        except BaseException:
            if not creator_fn:
                # aiosqlite stops its thread when the connect fails and does not wait for
                # it; the thread then answers into this event loop. Wait for it (off the
                # loop) so that answer lands while the loop still runs, not after it closed.
                await_(asyncio.to_thread(connection._thread.join, _THREAD_STOP_SECONDS))
            raise


class OneHopSQLiteDialect(HoldsInserts, SQLiteDialect_aiosqlite):
    driver = "carryover_aiosqlite"
    supports_statement_cache = True

    @classmethod
    def import_dbapi(cls) -> OneHopDBAPI:
        return OneHopDBAPI(__import__("aiosqlite"), __import__("sqlite3"))


registry.register("sqlite.carryover_aiosqlite", __name__, "OneHopSQLiteDialect")

dialect = OneHopSQLiteDialect

__all__ = ["DRIVERNAME", "Checkpoints", "OneHopSQLiteDialect"]
