"""SQLite on aiosqlite with one thread hop per statement.

aiosqlite runs every call of the sqlite3 module in its own thread and hands the answer back to
the event loop: each call is a "hop" (a queue put, a thread wake-up, a ``call_soon_threadsafe``
back), ~50-100 µs of CPU, while a statement of a run costs SQLite itself ~5 µs. SQLAlchemy's
adapter makes up to four hops per statement (open a cursor, execute, fetch the rows, close the
cursor). This dialect is SQLAlchemy's ``sqlite+aiosqlite`` with one change: its cursor executes,
fetches and closes in **one** call in aiosqlite's thread. What a statement does, the thread it
runs in and its errors are unchanged; a run issues ~20 statements, so this removes ~60 hops
(docs/performance.md, "Statements and hops").

:func:`app.store.db.make_engine` uses it for every SQLite URL (``sqlite:///…`` and
``sqlite+aiosqlite:///…`` alike); it relies on SQLAlchemy 2.1's asyncio adapter classes, which
``pyproject.toml`` pins.
"""

from __future__ import annotations

import collections
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

#: the drivername :func:`app.store.db.make_engine` gives SQLite URLs
DRIVERNAME = "sqlite+carryover_aiosqlite"


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
        raw = self._connection._conn  # aiosqlite's sqlite3.Connection, used in its thread

        def run() -> tuple[Any, int, int | None, list[Any] | None]:
            cursor = raw.cursor()
            try:
                if parameters is None:
                    cursor.execute(operation)
                else:
                    cursor.execute(operation, parameters)
                rows = cursor.fetchall() if cursor.description else None
                return cursor.description, cursor.rowcount, cursor.lastrowid, rows
            finally:
                cursor.close()

        async with self._adapt_connection._execute_mutex:
            begin = cast("OneHopConnection", self._adapt_connection).take_begin()
            if begin is not None:
                single = run

                def run() -> tuple[Any, int, int | None, list[Any] | None]:
                    raw.execute(begin)
                    return single()

            description, rowcount, lastrowid, rows = await self._connection._execute(run)
        self._record(description, rowcount, lastrowid)
        if rows is not None:
            self._rows = collections.deque(rows)
        return None

    async def _executemany_async(self, operation: Any, seq_of_parameters: Any) -> Any:
        raw = self._connection._conn

        def run() -> tuple[Any, int, int | None]:
            cursor = raw.cursor()
            try:
                cursor.executemany(operation, seq_of_parameters)
                return cursor.description, cursor.rowcount, cursor.lastrowid
            finally:
                cursor.close()

        async with self._adapt_connection._execute_mutex:
            begin = cast("OneHopConnection", self._adapt_connection).take_begin()
            if begin is not None:
                many = run

                def run() -> tuple[Any, int, int | None]:
                    raw.execute(begin)
                    return many()

            description, rowcount, lastrowid = await self._connection._execute(run)
        self._record(description, rowcount, lastrowid)
        return None

    def _record(self, description: Any, rowcount: int, lastrowid: int | None) -> None:
        outcome: _Outcome = self._cursor  # type: ignore[assignment]
        outcome.description = description
        outcome.rowcount = rowcount
        outcome.lastrowid = lastrowid


class OneHopConnection(AsyncAdapt_aiosqlite_connection):
    __slots__ = ("_begin",)
    _cursor_cls = OneHopCursor

    def __init__(self, dbapi: Any, connection: Any) -> None:
        super().__init__(dbapi, connection)
        self._begin: str | None = None

    def begin_with_next(self, statement: str) -> None:
        """Open the transaction with ``statement`` (``BEGIN`` or ``BEGIN IMMEDIATE``) in the
        same call in aiosqlite's thread as the next statement, before it: SQLite runs the
        same statements in the same order, without a hop and a pass through SQLAlchemy of
        its own for the ``BEGIN``. What it raises (a busy timeout) the next statement raises.
        A commit or rollback with no statement in between drops it (nothing was begun)."""
        self._begin = statement

    def cursor(self, server_side: bool = False) -> Any:
        if server_side and self._begin is not None:  # a streamed result: the BEGIN goes first
            begin, self._begin = self._begin, None
            try:
                await_(self._connection.execute(begin))
            except Exception as error:
                self._handle_exception(error)
        return super().cursor(server_side)

    def take_begin(self) -> str | None:
        begin, self._begin = self._begin, None
        return begin

    def commit(self) -> None:
        if self.take_begin() is not None:
            return  # nothing ran since the BEGIN that was asked: no transaction to commit
        super().commit()

    def rollback(self) -> None:
        """Roll back, without a thread hop when there is nothing to roll back: the pool resets
        every connection it takes back with a rollback, and after a committed transaction
        (every transaction here ends by commit or rollback) none is open. ``in_transaction``
        only reads SQLite's autocommit flag, safe from the loop while no statement runs on
        this connection (it is checked out to no one when the pool resets it)."""
        self._begin = None
        raw = self._connection._connection
        if raw is not None and not raw.in_transaction:
            return
        super().rollback()


class OneHopDBAPI(AsyncAdapt_aiosqlite_dbapi):
    def connect(self, *arg: Any, **kw: Any) -> OneHopConnection:
        creator_fn = kw.pop("async_creator_fn", None)
        connection = creator_fn(*arg, **kw) if creator_fn else self.aiosqlite.connect(*arg, **kw)
        if not creator_fn:
            connection._thread.daemon = True  # as SQLAlchemy's own adapter does
        return OneHopConnection(self, await_(connection))


class OneHopSQLiteDialect(SQLiteDialect_aiosqlite):
    driver = "carryover_aiosqlite"
    supports_statement_cache = True

    @classmethod
    def import_dbapi(cls) -> OneHopDBAPI:
        return OneHopDBAPI(__import__("aiosqlite"), __import__("sqlite3"))


registry.register("sqlite.carryover_aiosqlite", __name__, "OneHopSQLiteDialect")

dialect = OneHopSQLiteDialect

__all__ = ["DRIVERNAME", "OneHopSQLiteDialect"]
