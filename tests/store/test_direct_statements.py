"""Prepared statements straight on the driver (app/store/direct.py): what they store, what they
read back, their row counts and their errors are SQLAlchemy's own path's, which the same
statements take when a statement listener is on the engine. On SQLite every prepared statement
goes straight; on PostgreSQL those that return no rows. Counts and values, never timings."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from sqlalchemy import (
    Boolean,
    Column,
    Integer,
    MetaData,
    Numeric,
    String,
    Table,
    bindparam,
    event,
    insert,
    literal,
    select,
    update,
)
from sqlalchemy.exc import DBAPIError, IntegrityError, StatementError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store import pg_driver, sqlite_driver
from app.store.columns import JSONText, UTCDateTime
from app.store.db import defer_inserts, make_engine, read_transaction, write_transaction
from app.store.direct import prepared
from app.store.faults import classify

metadata = MetaData()
items = Table(
    "items",
    metadata,
    Column("id", String, primary_key=True),
    Column("at", UTCDateTime, nullable=False),
    Column("body", JSONText, nullable=True),
    Column("flag", Boolean, nullable=False),
    Column("n", Integer, nullable=True),
    # asyncpg hands back a Decimal; its result processor depends on the column type the
    # server reports (numeric: to float), which only the execution knows
    Column("ratio", Numeric(12, 4, asdecimal=False), nullable=True),
)

INSERT = prepared(insert(items))
SELECT = prepared(select(items, literal("fixed").label("tag")).where(items.c.id == bindparam("id")))
#: a fixed value among the bound ones: ``flag`` is bound from the statement, not the call
SELECT_FLAGGED = prepared(select(items.c.id).where(items.c.flag == True).order_by(items.c.id))  # noqa: E712
BUMP = prepared(
    update(items).where(items.c.id == bindparam("b_id")).values(n=items.c.n + bindparam("b_by"))
)

#: the unique violation, as SQLite and PostgreSQL word it
UNIQUE = "UNIQUE constraint failed|duplicate key value violates unique constraint"

AT = datetime(2026, 12, 6, 7, 8, 9, 123456, tzinfo=UTC)


@pytest.fixture
async def engine(empty_database_url: str) -> AsyncIterator[AsyncEngine]:
    """An engine from :func:`make_engine` on a database of the test's own, each backend."""
    engine = make_engine(empty_database_url)
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
    try:
        yield engine
    finally:
        await engine.dispose()


def on_postgresql(engine: AsyncEngine) -> bool:
    return engine.dialect.name == "postgresql"


@contextmanager
def listened(engine: AsyncEngine) -> Iterator[list[str]]:
    """A statement listener on the engine: every statement takes SQLAlchemy's path."""
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement.split()[0])

    event.listen(engine.sync_engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", record)


@pytest.fixture
def direct_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The statements a driver ran straight (no SQLAlchemy execution)."""
    calls: list[str] = []
    for driver in (sqlite_driver.OneHopConnection, pg_driver.KeepingConnection):
        monkeypatch.setattr(driver, "execute_direct", _counted(driver.execute_direct, calls))
    return calls


def _counted(original: Any, calls: list[str]) -> Any:
    async def counted(self: Any, operation: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(operation.split()[0])
        return await original(self, operation, *args, **kwargs)

    return counted


async def _rows(engine: AsyncEngine) -> list[tuple[Any, ...]]:
    """The table's rows as the database stores them: their text on SQLite (read apart from the
    engine), their values on PostgreSQL (read on SQLAlchemy's path)."""
    if on_postgresql(engine):
        with listened(engine):
            async with read_transaction(engine) as conn:
                return [tuple(r) for r in await conn.execute(select(items).order_by(items.c.id))]
    async with read_transaction(engine) as conn:
        raw = await conn.exec_driver_sql("SELECT * FROM items ORDER BY id")
        return [tuple(r) for r in raw]


async def _program(engine: AsyncEngine, prefix: str) -> list[Any]:
    """Insert (one row, then many), read back, update: what each statement returned."""
    seen: list[Any] = []
    async with write_transaction(engine) as conn:
        one = await conn.execute(
            INSERT,
            {
                "id": f"{prefix}1",
                "at": AT,
                "body": {"a": [1, "é"]},
                "flag": True,
                "n": 1,
                "ratio": 0.5,
            },
        )
        seen.append(one.rowcount)
        await conn.execute(
            INSERT,
            [
                {
                    "id": f"{prefix}2",
                    "at": AT + timedelta(seconds=1),
                    "body": None,
                    "flag": False,
                    "n": None,
                    "ratio": None,
                },
                {"id": f"{prefix}3", "at": AT, "body": "text", "flag": True, "n": 5, "ratio": 2},
            ],
        )
        bumped = await conn.execute(BUMP, {"b_id": f"{prefix}3", "b_by": 2})
        seen.append(bumped.rowcount)
        missing = await conn.execute(BUMP, {"b_id": f"{prefix}none", "b_by": 2})
        seen.append(missing.rowcount)
    async with read_transaction(engine) as conn:
        for n in (1, 2, 3):
            row = (await conn.execute(SELECT, {"id": f"{prefix}{n}"})).mappings().first()
            assert row is not None
            seen.append(dict(row))
        row = (await conn.execute(SELECT, {"id": f"{prefix}1"})).first()
        assert row is not None
        seen.append((row.at, row._mapping[items.c.body], row.tag))
        flagged = (await conn.execute(SELECT_FLAGGED)).scalars().all()
        seen.append([f for f in flagged if f.startswith(prefix)])
        seen.append((await conn.execute(SELECT, {"id": "nobody"})).first())
    return seen


def _unprefixed(values: list[Any], prefix: str) -> list[Any]:
    return [
        {**v, "id": v["id"].removeprefix(prefix)}
        if isinstance(v, dict)
        else [x.removeprefix(prefix) for x in v]
        if isinstance(v, list)
        else v
        for v in values
    ]


async def test_prepared_statements_store_and_read_what_sqlalchemys_path_does(
    engine: AsyncEngine, direct_calls: list[str]
) -> None:
    direct = await _program(engine, "d")
    assert direct_calls == ["INSERT", "INSERT", "UPDATE", "UPDATE", *["SELECT"] * 6]
    direct_calls.clear()
    with listened(engine) as through_sqlalchemy:
        reference = await _program(engine, "s")
    assert direct_calls == []
    assert through_sqlalchemy.count("SELECT") == 6
    assert _unprefixed(direct, "d") == _unprefixed(reference, "s")
    assert direct[0:3] == [1, 1, 0]  # row counts
    assert (
        direct[3]["at"] == AT
        and direct[3]["body"] == {"a": [1, "é"]}
        and direct[3]["tag"] == "fixed"
    )
    assert direct[5]["n"] == 7
    assert (direct[3]["ratio"], direct[4]["ratio"], direct[5]["ratio"]) == (0.5, None, 2.0)
    assert type(direct[3]["ratio"]) is float
    stored = {row[0]: row[1:] for row in await _rows(engine)}
    for n in (1, 2, 3):
        assert stored[f"d{n}"] == stored[f"s{n}"]


async def test_an_integrity_error_is_sqlalchemys_on_both_paths(
    engine: AsyncEngine, direct_calls: list[str]
) -> None:
    row = {"id": "dup", "at": AT, "body": None, "flag": True, "n": None}
    async with write_transaction(engine) as conn:
        await conn.execute(INSERT, row)
    for listener in (False, True):
        direct_calls.clear()
        with listened(engine) if listener else _nothing():
            with pytest.raises(IntegrityError, match=UNIQUE):
                async with write_transaction(engine) as conn:
                    await conn.execute(INSERT, row)
        assert direct_calls == ([] if listener else ["INSERT"])
    # a deferred insert's error surfaces at the commit it rode with, and nothing is written
    with pytest.raises(IntegrityError, match=UNIQUE):
        async with write_transaction(engine) as conn:
            defer_inserts(conn)
            await conn.execute(INSERT, {**row, "id": "fresh"})
            await conn.execute(INSERT, row)
    assert [r[0] for r in await _rows(engine)] == ["dup"]


async def test_a_lost_connection_is_sqlalchemys_on_both_paths(
    engine: AsyncEngine, direct_calls: list[str]
) -> None:
    """A backend ended under a transaction: the next statement fails the same way on either
    path, a fault that drops the connection, and the engine carries on with a fresh one."""
    if not on_postgresql(engine):
        pytest.skip("a backend ended under the pool: PostgreSQL")
    killer = await asyncpg.connect(engine.url.set(drivername="postgresql").render_as_string(False))
    try:
        for listener, n in ((False, 1), (True, 2)):
            direct_calls.clear()
            row = {"id": f"lost{n}", "at": AT, "body": None, "flag": True, "n": None}
            with listened(engine) if listener else _nothing():
                with pytest.raises(DBAPIError) as raised:
                    async with write_transaction(engine) as conn:
                        pid = (await conn.exec_driver_sql("SELECT pg_backend_pid()")).scalar()
                        await killer.execute("SELECT pg_terminate_backend($1)", pid)
                        await conn.execute(INSERT, row)
            assert direct_calls == ([] if listener else ["INSERT"])
            assert raised.value.connection_invalidated, repr(raised.value)
            fault = classify(raised.value)
            assert fault is not None and fault.transient, repr(raised.value)
            async with write_transaction(engine) as conn:
                await conn.execute(INSERT, row)
        assert [r[0] for r in await _rows(engine)] == ["lost1", "lost2"]
    finally:
        await killer.close()


async def test_what_only_sqlalchemy_does_takes_its_path(
    engine: AsyncEngine, direct_calls: list[str]
) -> None:
    async with write_transaction(engine) as conn:
        # a required value missing: SQLAlchemy's own error, from its own path
        with pytest.raises(StatementError, match="b_by"):
            await conn.execute(BUMP, {"b_id": "x"})
        # execution options
        await conn.execute(SELECT, {"id": "x"}, execution_options={"compiled_cache": None})
        # a statement not marked prepared
        await conn.execute(select(items.c.id))
        # the connection's own execution options, but for those applied at its BEGIN
        capped = await conn.execution_options(max_row_buffer=10)
        await capped.execute(SELECT, {"id": "x"})
    assert direct_calls == []
    async with read_transaction(engine) as conn:  # REPEATABLE READ on PostgreSQL: at BEGIN
        await conn.execute(SELECT, {"id": "x"})
    assert direct_calls == ["SELECT"]


@contextmanager
def _nothing() -> Iterator[None]:
    yield
