"""Engines: URL mapping, SQLite pragmas, BEGIN IMMEDIATE for writes and plain BEGIN for reads."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.db import async_url, make_engine, read_transaction, write_transaction
from tests.repository import Repository


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("sqlite:///./carryover.db", "sqlite+aiosqlite:///./carryover.db"),
        ("sqlite+aiosqlite:///x.db", "sqlite+aiosqlite:///x.db"),
        ("sqlite://", "sqlite+aiosqlite://"),
        ("postgresql://u:p@db:5432/carry", "postgresql+asyncpg://u:p@db:5432/carry"),
        ("postgres://u@db/carry", "postgresql+asyncpg://u@db/carry"),
        ("postgresql+asyncpg://u@db/carry", "postgresql+asyncpg://u@db/carry"),
    ],
)
def test_urls_map_onto_the_async_drivers(given: str, expected: str) -> None:
    assert async_url(given).render_as_string(hide_password=False) == expected


@pytest.mark.parametrize("url", ["mysql://u@db/x", "postgresql+psycopg://u@db/x"])
def test_other_databases_and_drivers_are_refused(url: str) -> None:
    with pytest.raises(ValueError, match="unsupported"):
        async_url(url)


@contextmanager
def statements(engine: AsyncEngine) -> Iterator[list[str]]:
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    event.listen(engine.sync_engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", record)


async def test_sqlite_connections_use_wal_foreign_keys_and_a_busy_timeout(tmp_path: Any) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        async with read_transaction(engine) as conn:
            assert (await conn.execute(text("PRAGMA journal_mode"))).scalar() == "wal"
            assert (await conn.execute(text("PRAGMA foreign_keys"))).scalar() == 1
            assert (await conn.execute(text("PRAGMA busy_timeout"))).scalar() == 5000
    finally:
        await engine.dispose()


async def test_sqlite_writes_begin_immediate_and_reads_begin_deferred(tmp_path: Any) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        with statements(engine) as seen:
            async with write_transaction(engine) as conn:
                await conn.execute(text("CREATE TABLE t (x INTEGER)"))
            async with read_transaction(engine) as conn:
                await conn.execute(text("SELECT count(*) FROM t"))
            # The write option does not leak into the next checkout of the same connection.
            async with read_transaction(engine) as conn:
                await conn.execute(text("SELECT count(*) FROM t"))
        assert [s for s in seen if s.startswith("BEGIN")] == ["BEGIN IMMEDIATE", "BEGIN", "BEGIN"]
    finally:
        await engine.dispose()


async def test_a_write_transaction_rolls_back_when_it_raises(engine: AsyncEngine) -> None:
    repo = Repository(engine)
    with pytest.raises(RuntimeError):
        async with write_transaction(engine) as conn:
            await conn.execute(
                text(
                    "INSERT INTO api_keys (id, tenant, key_hash, prefix, created_at)"
                    " VALUES ('k', 't', 'h', 'p', CURRENT_TIMESTAMP)"
                )
            )
            raise RuntimeError("boom")
    async with read_transaction(engine) as conn:
        assert (await conn.execute(text("SELECT count(*) FROM api_keys"))).scalar() == 0
    assert await repo.get_conversation("t", "c") is None


async def test_concurrent_writers_wait_for_each_other(repo: Repository) -> None:
    # On SQLite every writer takes the write lock at BEGIN IMMEDIATE and waits on
    # busy_timeout instead of failing with "database is locked" mid-transaction.
    await asyncio.gather(*(repo.create_conversation("t", f"c{i}") for i in range(20)))
    assert len(await repo.list_conversations("t", limit=100)) == 20


async def test_a_write_cancelled_before_its_call_ran_leaves_no_transaction_open(
    tmp_path: Any,
) -> None:
    # The BEGIN IMMEDIATE rides with the transaction's first statement into aiosqlite's thread.
    # When the task awaiting that call is cancelled before the thread ran it, nothing of it
    # stays: no row, and no transaction holding SQLite's write lock (the next writer gets it
    # at once, well within a short busy timeout).
    import threading

    from sqlalchemy.pool import AsyncAdaptedQueuePool

    engine = make_engine(
        f"sqlite:///{tmp_path / 'x.db'}",
        busy_timeout_ms=300,
        poolclass=AsyncAdaptedQueuePool,
        pool_size=1,
        max_overflow=0,
    )
    try:
        async with write_transaction(engine) as conn:
            await conn.execute(text("CREATE TABLE t (x INTEGER)"))
        async with engine.connect() as conn:
            raw = await conn.get_raw_connection()
            driver = raw.dbapi_connection
        assert driver is not None
        thread_busy, release = threading.Event(), threading.Event()

        def busy() -> None:  # holds aiosqlite's thread, as a slow call would
            thread_busy.set()
            release.wait(10)

        async def write() -> None:
            async with write_transaction(engine) as conn:
                await conn.execute(text("INSERT INTO t VALUES (1)"))

        driver._connection._tx.put_nowait((None, busy))
        await asyncio.to_thread(thread_busy.wait, 10)
        task = asyncio.create_task(write())
        for _ in range(100):  # until its call is queued behind busy()
            await asyncio.sleep(0)
        task.cancel()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        async with write_transaction(engine) as conn:  # the write lock is free
            await conn.execute(text("INSERT INTO t VALUES (2)"))
        async with read_transaction(engine) as conn:
            assert (await conn.execute(text("SELECT x FROM t"))).scalars().all() == [2]
    finally:
        await engine.dispose()


def _driver_of(conn: Any) -> Any:
    sync = conn.sync_connection
    assert sync is not None
    return sync.connection.dbapi_connection


async def test_sqlite_writers_share_one_connection_kept_out_of_the_pool(tmp_path: Any) -> None:
    """SQLite's writers take turns (one at a time): the transactions that commit share one
    connection, kept checked out between them, and the engine's dispose gives it back."""
    engine = make_engine(f"sqlite:///{tmp_path / 'x.db'}")
    pool = engine.sync_engine.pool
    try:
        drivers = []
        for i in range(3):
            async with write_transaction(engine) as conn:
                if i == 0:
                    await conn.execute(text("CREATE TABLE t (x INTEGER)"))
                await conn.execute(text("INSERT INTO t VALUES (:x)"), {"x": i})
                drivers.append(_driver_of(conn))
            assert pool.checkedout() == 1  # kept for the next writer
        assert drivers[0] is drivers[1] is drivers[2]
        async with read_transaction(engine) as conn:  # readers take another connection
            assert _driver_of(conn) is not drivers[0]
            assert (await conn.execute(text("SELECT count(*) FROM t"))).scalar() == 3
    finally:
        await engine.dispose()
    assert pool.checkedout() == 0


async def test_a_write_that_fails_gives_its_connection_back_to_the_pool(tmp_path: Any) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'x.db'}")
    pool = engine.sync_engine.pool
    try:
        async with write_transaction(engine) as conn:
            await conn.execute(text("CREATE TABLE t (x INTEGER)"))
        with pytest.raises(RuntimeError, match="boom"):
            async with write_transaction(engine) as conn:
                await conn.execute(text("INSERT INTO t VALUES (1)"))
                raise RuntimeError("boom")
        assert pool.checkedout() == 0  # rolled back and checked in, not kept
        async with write_transaction(engine) as conn:
            assert (await conn.execute(text("SELECT count(*) FROM t"))).scalar() == 0
            await conn.execute(text("INSERT INTO t VALUES (2)"))
        assert pool.checkedout() == 1
        async with read_transaction(engine) as conn:
            assert (await conn.execute(text("SELECT x FROM t"))).scalars().all() == [2]
    finally:
        await engine.dispose()


async def test_a_connection_kept_for_an_event_loop_that_closed_goes_back_to_the_pool(
    tmp_path: Any,
) -> None:
    """An application driven from one event loop after another (a test client's, say) keeps
    at most one writer's connection per live loop: the next write gives back those kept for
    loops that have closed."""
    engine = make_engine(f"sqlite:///{tmp_path / 'x.db'}")
    pool = engine.sync_engine.pool

    async def write(x: int) -> None:
        async with write_transaction(engine) as conn:
            await conn.execute(text("CREATE TABLE IF NOT EXISTS t (x INTEGER)"))
            await conn.execute(text("INSERT INTO t VALUES (:x)"), {"x": x})

    try:
        for x in range(3):  # each on a loop of its own, in a thread, closed after
            thread = threading.Thread(target=asyncio.run, args=(write(x),))
            thread.start()
            thread.join(30)
        assert pool.checkedout() == 1  # the last loop's; the earlier ones' were given back
        await write(3)
        assert pool.checkedout() == 1  # this loop's
        async with read_transaction(engine) as conn:
            assert (await conn.execute(text("SELECT count(*) FROM t"))).scalar() == 4
    finally:
        await engine.dispose()
    assert pool.checkedout() == 0


async def test_a_pool_of_one_connection_keeps_no_writer(tmp_path: Any) -> None:
    from sqlalchemy.pool import AsyncAdaptedQueuePool

    engine = make_engine(
        f"sqlite:///{tmp_path / 'x.db'}",
        poolclass=AsyncAdaptedQueuePool,
        pool_size=1,
        max_overflow=0,
    )
    try:
        async with write_transaction(engine) as conn:
            await conn.execute(text("CREATE TABLE t (x INTEGER)"))
        assert engine.sync_engine.pool.checkedout() == 0  # a reader would wait for it
        async with read_transaction(engine) as conn:
            assert (await conn.execute(text("SELECT count(*) FROM t"))).scalar() == 0
    finally:
        await engine.dispose()
