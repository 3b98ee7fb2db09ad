"""Where SQLite's statements run (app/store/sqlite_driver.py): a run's small prepared statements
on the event loop's own thread, and everything that could hold the loop up in aiosqlite's
thread: a BEGIN whose lock another connection holds, any statement outside a transaction that
holds the write lock, a statement with many rows or much text, and any statement while an
earlier call of the connection is still in that thread. Threads and
order, never timings."""

from __future__ import annotations

import asyncio
import gc
import sqlite3
import threading
import weakref
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, bindparam, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store import sqlite_driver
from app.store.db import (
    defer_inserts,
    make_engine,
    read_transaction,
    sqlite_checkpoints,
    write_transaction,
)
from app.store.direct import prepared

metadata = MetaData()
notes = Table(
    "notes",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("text", String, nullable=False),
)
INSERT = prepared(insert(notes))
COUNT = prepared(select(notes.c.id).where(notes.c.id >= bindparam("from_id")))


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    engine = make_engine(f"sqlite:///{tmp_path / 'loop.db'}")
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
    try:
        yield engine
    finally:
        await engine.dispose()


@contextmanager
def threads(monkeypatch: Any) -> Iterator[list[tuple[str, bool]]]:
    """Each statement run, by its first word, and whether it ran on the loop's thread."""
    ran: list[tuple[str, bool]] = []
    loop_thread = threading.get_ident()
    run_statement = sqlite_driver._run_statement

    def recorded(raw: Any, operation: str, *args: Any) -> Any:
        ran.append((operation.split()[0], threading.get_ident() == loop_thread))
        return run_statement(raw, operation, *args)

    monkeypatch.setattr(sqlite_driver, "_run_statement", recorded)
    yield ran


async def test_small_prepared_statements_run_on_the_loop(
    engine: AsyncEngine, monkeypatch: Any
) -> None:
    with threads(monkeypatch) as ran:
        async with write_transaction(engine) as conn:
            await conn.execute(INSERT, {"id": 1, "text": "one"})
            found = (await conn.execute(COUNT, {"from_id": 0})).all()
    assert ran == [("INSERT", True), ("SELECT", True)]
    assert [row.id for row in found] == [1]
    async with engine.connect() as conn:  # committed
        assert (await conn.execute(select(notes.c.text))).scalars().all() == ["one"]


async def test_a_begin_whose_lock_another_connection_holds_waits_in_the_thread(
    engine: AsyncEngine, monkeypatch: Any, tmp_path: Path
) -> None:
    other = sqlite3.connect(tmp_path / "loop.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process's writer, holding the write lock
    begun_at_once = sqlite_driver._begun_at_once
    tried: list[bool] = []

    def begun(raw: Any, begin: str, busy_timeout_ms: int) -> bool:
        at_once = begun_at_once(raw, begin, busy_timeout_ms)
        tried.append(at_once)
        if not at_once:  # the other writer ends: the BEGIN, in the thread, takes the lock
            other.execute("COMMIT")
        return at_once

    monkeypatch.setattr(sqlite_driver, "_begun_at_once", begun)
    try:
        with threads(monkeypatch) as ran:
            async with write_transaction(engine) as conn:
                await conn.execute(INSERT, {"id": 2, "text": "two"})
                await conn.execute(COUNT, {"from_id": 0})
    finally:
        if other.in_transaction:
            other.execute("ROLLBACK")
        other.close()
    assert tried == [False]  # the lock was held: "busy" at once, the loop was not held up
    # the BEGIN and the INSERT went to the thread; the SELECT, in the begun transaction, not
    assert ran == [("INSERT", False), ("SELECT", True)]
    async with engine.connect() as conn:
        assert (await conn.execute(select(notes.c.text))).scalars().all() == ["two"]
        # the busy timeout is back where it was configured, for every later statement
        timeout = (await conn.exec_driver_sql("PRAGMA busy_timeout")).scalar()
    assert timeout == 5000


async def test_statements_outside_a_write_transaction_go_to_the_thread(
    engine: AsyncEngine, monkeypatch: Any
) -> None:
    """Only a transaction begun with BEGIN IMMEDIATE holds the write lock: in a read
    transaction, or with no transaction (autocommit), a statement may wait for another
    connection's lock, so it waits in the thread."""
    with threads(monkeypatch) as ran:
        async with read_transaction(engine) as conn:
            await conn.execute(COUNT, {"from_id": 0})
        async with engine.begin() as conn:  # no BEGIN: the INSERT takes the lock itself
            await conn.execute(INSERT, {"id": 4, "text": "four"})
        async with write_transaction(engine) as conn:  # and after them, on the loop again
            await conn.execute(COUNT, {"from_id": 0})
    assert ran == [("SELECT", False), ("INSERT", False), ("SELECT", True)]
    async with engine.connect() as conn:
        assert (await conn.execute(select(notes.c.text))).scalars().all() == ["four"]


async def test_many_rows_or_much_text_go_to_the_thread(
    engine: AsyncEngine, monkeypatch: Any
) -> None:
    many = [{"id": i, "text": "x"} for i in range(sqlite_driver.LIGHT_ROWS + 1)]
    long = {"id": 10_000, "text": "y" * (sqlite_driver.LIGHT_CHARACTERS + 1)}
    with threads(monkeypatch) as ran:
        async with write_transaction(engine) as conn:
            await conn.execute(INSERT, many)
            await conn.execute(INSERT, long)
            await conn.execute(INSERT, {"id": 10_001, "text": "z"})
    assert ran == [("INSERT", False), ("INSERT", False), ("INSERT", True)]


@contextmanager
def hops(monkeypatch: Any) -> Iterator[list[str]]:
    """Each call into aiosqlite's thread, by the name of what it ran."""
    called: list[str] = []
    execute = sqlite_driver._ThreadCalls.__call__

    async def counted(self: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
        called.append(getattr(fn, "__name__", "?"))
        return await execute(self, fn, *args, **kwargs)

    monkeypatch.setattr(sqlite_driver._ThreadCalls, "__call__", counted)
    yield called


def checkpoints_of(engine: AsyncEngine) -> sqlite_driver.Checkpoints:
    found = sqlite_checkpoints(engine)
    assert found is not None
    return found


async def test_a_small_write_transaction_commits_on_the_loop(
    engine: AsyncEngine, monkeypatch: Any
) -> None:
    checkpoints_of(engine).done()  # none is due
    with hops(monkeypatch) as called:
        async with write_transaction(engine) as conn:
            await conn.execute(INSERT, {"id": 1, "text": "one"})
            defer_inserts(conn)  # held for the COMMIT: it runs on the loop with it
            await conn.execute(INSERT, {"id": 2, "text": "two"})
    assert called == []
    async with engine.connect() as conn:  # committed, seen by another connection
        assert (await conn.execute(select(notes.c.text))).scalars().all() == ["one", "two"]


async def test_a_transaction_that_used_the_thread_commits_there(
    engine: AsyncEngine, monkeypatch: Any
) -> None:
    """The COMMIT of a transaction with a large statement writes its many pages: it goes to
    the thread as the statement did; so does one whose held inserts are large."""
    checkpoints_of(engine).done()
    many = [{"id": i, "text": "x"} for i in range(sqlite_driver.LIGHT_ROWS + 1)]
    with hops(monkeypatch) as called:
        async with write_transaction(engine) as conn:
            await conn.execute(INSERT, many)
    assert called == ["run", "commit"]
    with hops(monkeypatch) as called:
        async with write_transaction(engine) as conn:
            await conn.execute(COUNT, {"from_id": 10_000})  # on the loop
            defer_inserts(conn)
            await conn.execute(INSERT, {"id": 10_000, "text": "y" * sqlite_driver.LIGHT_CHARACTERS})
            await conn.execute(INSERT, {"id": 10_001, "text": "z"})
    assert called == ["commit"]
    with hops(monkeypatch) as called:  # a small statement with large inserts riding with it
        async with write_transaction(engine) as conn:
            defer_inserts(conn)
            await conn.execute(
                INSERT, {"id": 20_000, "text": "y" * (sqlite_driver.LIGHT_CHARACTERS + 1)}
            )
            await conn.execute(COUNT, {"from_id": 20_000})
    assert called == ["run", "commit"]
    async with engine.connect() as conn:
        ids = (await conn.execute(select(notes.c.id))).scalars().all()
    assert len(ids) == len(many) + 3


async def test_every_few_commits_go_to_the_thread_where_the_log_is_checkpointed(
    engine: AsyncEngine, monkeypatch: Any, tmp_path: Path
) -> None:
    """A COMMIT on the loop never checkpoints the write-ahead log (the database file is not
    written); every ``every``-th commit goes to the thread with SQLite's automatic
    checkpoint on, and the log's pages reach the database file there."""
    checkpoints = checkpoints_of(engine)
    monkeypatch.setattr(checkpoints, "every", 3)
    monkeypatch.setattr(checkpoints, "pages", 1)  # any page in the log is enough
    checkpoints.done()
    database = tmp_path / "loop.db"
    sizes = [database.stat().st_size]
    with hops(monkeypatch) as called:
        for i in range(4):
            async with write_transaction(engine) as conn:
                await conn.execute(INSERT, {"id": 100 + i, "text": "w" * 20_000})
            sizes.append(database.stat().st_size)
    assert called == ["commit"]  # the fourth
    assert sizes[0] == sizes[1] == sizes[2] == sizes[3] < sizes[4]
    assert checkpoints.since == 0
    async with engine.connect() as conn:  # and the connection's own checkpoint stays off
        assert (await conn.exec_driver_sql("PRAGMA wal_autocheckpoint")).scalar() == 0
        texts = (await conn.execute(select(notes.c.text))).scalars().all()
    assert len(texts) == 4


async def test_a_statement_queues_behind_a_call_still_in_the_thread(
    engine: AsyncEngine, monkeypatch: Any
) -> None:
    import aiosqlite

    handed_over = threading.Event()  # a call after the slow one was handed to the thread
    order: list[str] = []
    execute = aiosqlite.Connection._execute
    calls = 0

    async def noted(self: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls > 1:
            handed_over.set()
        return await execute(self, fn, *args, **kwargs)

    def slow() -> None:  # an earlier call still in the thread (its awaiting task gone, say)
        handed_over.wait(10)
        order.append("earlier call")

    with threads(monkeypatch) as ran:
        async with write_transaction(engine) as conn:
            await conn.execute(INSERT, {"id": 3, "text": "three"})
            sync = conn.sync_connection
            assert sync is not None
            driver = sync.connection.dbapi_connection
            assert isinstance(driver, sqlite_driver.OneHopConnection)
            monkeypatch.setattr(aiosqlite.Connection, "_execute", noted)
            earlier = asyncio.ensure_future(driver._connection._execute(slow))
            await asyncio.sleep(0)  # handed to the thread, where it waits for the next call
            found = (await conn.execute(COUNT, {"from_id": 0})).all()
            order.append("statement")
            await earlier
    assert order == ["earlier call", "statement"]
    # the INSERT (with the BEGIN) ran on the loop; the SELECT in the thread, behind that call
    assert ran == [("INSERT", True), ("SELECT", False)]
    assert [row.id for row in found] == [3]


async def test_a_closed_connection_is_freed_without_waiting_for_a_garbage_collection(
    tmp_path: Path,
) -> None:
    """What counts the calls into aiosqlite's thread holds the connection weakly: no
    reference cycle keeps a closed connection until a later garbage collection (by then its
    event loop may be closed, and aiosqlite's thread fails to hand it its last answer)."""
    engine = make_engine(f"sqlite:///{tmp_path / 'freed.db'}")
    async with engine.connect() as conn:
        await conn.exec_driver_sql("SELECT 1")
        sync = conn.sync_connection
        assert sync is not None
        driver = sync.connection.dbapi_connection
        assert isinstance(driver, sqlite_driver.OneHopConnection)
        freed = weakref.ref(driver._connection)
        worker = driver._connection._thread
        del sync, driver
    del conn
    await engine.dispose()
    # aiosqlite's thread answers the last call before its own frame lets go of that
    # call (a closure over the connection): wait for the thread to end, not for the answer.
    worker.join(timeout=30)
    assert not worker.is_alive()
    gc.disable()
    try:
        del engine
        assert freed() is None
    finally:
        gc.enable()


async def test_a_failed_connect_returns_after_aiosqlite_s_thread_has_ended(tmp_path: Path) -> None:
    """aiosqlite stops its thread when a connect fails without waiting for it; the thread
    then answers into the event loop. The error reaches the caller only once the thread has
    ended, so no answer can arrive after the caller's event loop has closed."""

    def workers() -> set[threading.Thread]:
        return {
            thread
            for thread in threading.enumerate()
            if "_connection_worker_thread" in thread.name and thread.is_alive()
        }

    before = workers()
    engine = make_engine(f"sqlite:///{tmp_path / 'no-such-directory' / 'x.db'}")
    try:
        for _ in range(5):
            with pytest.raises(Exception, match="unable to open database file"):
                async with engine.connect() as conn:
                    await conn.exec_driver_sql("SELECT 1")
            assert workers() <= before
    finally:
        await engine.dispose()


async def test_without_a_write_ahead_log_every_commit_goes_to_the_thread(
    monkeypatch: Any,
) -> None:
    """Out of WAL mode (an in-memory database here; a file system that cannot hold the log's
    shared memory) a COMMIT syncs the database file: it never runs on the loop."""
    from sqlalchemy.pool import StaticPool

    engine = make_engine("sqlite://", poolclass=StaticPool)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(metadata.create_all)
        with hops(monkeypatch) as called:
            async with write_transaction(engine) as conn:
                await conn.execute(INSERT, {"id": 1, "text": "one"})
        assert called == ["commit"]
        async with engine.connect() as conn:
            assert (await conn.exec_driver_sql("PRAGMA wal_autocheckpoint")).scalar() == 1000
    finally:
        await engine.dispose()


class _CommitFails:
    """A sqlite3 connection whose COMMIT fails (a full disk, say); the rest is the real one."""

    def __init__(self, raw: sqlite3.Connection) -> None:
        self._raw = raw

    def commit(self) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


async def test_a_commit_that_fails_on_the_loop_rolls_back_and_gives_the_connection_back(
    engine: AsyncEngine, monkeypatch: Any
) -> None:
    from sqlalchemy.exc import OperationalError

    checkpoints_of(engine).done()
    async with write_transaction(engine) as conn:
        await conn.execute(INSERT, {"id": 1, "text": "one"})
        sync = conn.sync_connection
        assert sync is not None
        driver = sync.connection.dbapi_connection
        assert isinstance(driver, sqlite_driver.OneHopConnection)
    wrapped = driver._connection
    monkeypatch.setattr(wrapped, "_connection", _CommitFails(wrapped._conn))
    with hops(monkeypatch) as called, pytest.raises(OperationalError, match="disk is full"):
        async with write_transaction(engine) as conn:
            await conn.execute(INSERT, {"id": 2, "text": "two"})
    assert called == ["rollback"]  # the COMMIT was tried on the loop; the pool rolled back
    monkeypatch.undo()
    assert engine.sync_engine.pool.checkedout() == 0  # not kept for the next writer
    async with write_transaction(engine) as conn:
        assert (await conn.execute(select(notes.c.id))).scalars().all() == [1]


async def test_a_write_transaction_mixes_prepared_and_other_statements_and_rolls_back_whole(
    engine: AsyncEngine,
) -> None:
    """On SQLite a write transaction begins on the driver: its prepared statements run there,
    one SQLAlchemy executes itself joins the same transaction, and what the block raises
    rolls all of it back."""
    from sqlalchemy import text

    async with write_transaction(engine) as conn:
        await conn.execute(INSERT, {"id": 1, "text": "one"})
        await conn.execute(text("INSERT INTO notes (id, text) VALUES (2, 'two')"))
        await conn.execute(INSERT, {"id": 3, "text": "three"})
    with pytest.raises(RuntimeError, match="boom"):
        async with write_transaction(engine) as conn:
            await conn.execute(INSERT, {"id": 4, "text": "four"})
            raise RuntimeError("boom")
    with pytest.raises(RuntimeError, match="boom"):
        async with write_transaction(engine) as conn:
            await conn.execute(INSERT, {"id": 5, "text": "five"})
            await conn.execute(text("INSERT INTO notes (id, text) VALUES (6, 'six')"))
            raise RuntimeError("boom")
    async with write_transaction(engine) as conn:  # and the next writer starts clean
        found = (await conn.execute(COUNT, {"from_id": 0})).all()
    assert [row.id for row in found] == [1, 2, 3]
