"""Inserts held for the next statement on PostgreSQL (app/store/pg_driver.py): they ride with it
as ``WITH`` clauses, or go just before it in one statement of their own when it could see their
rows, and at the latest just before the ``COMMIT``; what the transaction reads and writes, and
what fails, is as if each had run on its own. Statements sent to the server are counted, never
timed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import sqlalchemy.exc
from sqlalchemy import (
    Column,
    Integer,
    MetaData,
    String,
    Table,
    func,
    insert,
    literal_column,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.store import pg_driver
from app.store.db import defer_inserts, make_engine, write_transaction
from tests.helpers import server_calls

#: the tests with a database: PostgreSQL only (SQLite holds inserts its own way)
on_postgresql = pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)

metadata = MetaData()
notes = Table(
    "held_notes",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("text", String, nullable=False),
)
tallies = Table(
    "held_tallies",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("n", Integer, nullable=False),
    Column("note", String, nullable=True),
)


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    engine = make_engine(database_url)
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
        await conn.execute(insert(tallies).values(id=1, n=0))
    try:
        yield engine
    finally:
        async with engine.begin() as conn:
            await conn.run_sync(metadata.drop_all)
        await engine.dispose()


async def count(conn: AsyncConnection, table: Table) -> int:
    return int((await conn.execute(select(func.count()).select_from(table))).scalar_one())


async def tally(engine: AsyncEngine) -> tuple[int, str | None]:
    async with engine.connect() as conn:
        row = (
            await conn.execute(select(tallies.c.n, tallies.c.note).where(tallies.c.id == 1))
        ).one()
        return int(row.n), row.note


@asynccontextmanager
async def holding(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A write transaction that read something (its BEGIN and a SELECT), then holds its
    inserts."""
    async with write_transaction(engine) as conn:
        await conn.execute(select(tallies.c.n))
        defer_inserts(conn)
        yield conn


def without_prepares(calls: list[str]) -> list[str]:
    return [c for c in calls if not c.startswith("prepare ")]


@on_postgresql
async def test_held_inserts_ride_with_the_next_statement(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    with server_calls(monkeypatch) as calls:
        async with holding(engine) as conn:
            await conn.execute(insert(notes).values(id=1, text="one"))
            await conn.execute(insert(notes), [{"id": 2, "text": "two"}, {"id": 3, "text": "3"}])
            await conn.execute(update(tallies).values(n=tallies.c.n + 1))
    # the two inserts were one clause each of the UPDATE's statement
    assert without_prepares(calls) == [
        "BEGIN",
        "SELECT held_tallies.n",
        "WITH carryover_held_0",
        "COMMIT",
    ]
    async with engine.connect() as conn:
        assert (await conn.execute(select(notes.c.text).order_by(notes.c.id))).scalars().all() == [
            "one",
            "two",
            "3",
        ]
    assert await tally(engine) == (1, None)


@on_postgresql
async def test_what_is_held_at_the_commit_goes_in_one_statement_before_it(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    with server_calls(monkeypatch) as calls:
        async with holding(engine) as conn:
            for i in range(5):
                await conn.execute(insert(notes).values(id=i, text=f"note {i}"))
    assert without_prepares(calls)[-2:] == ["WITH carryover_held_0", "COMMIT"]
    assert len(without_prepares(calls)) == 4
    async with engine.connect() as conn:
        assert await count(conn, notes) == 5


@on_postgresql
async def test_a_statement_that_reads_a_held_table_sees_its_rows(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One snapshot per statement: a statement naming a held table does not carry the inserts
    (it would not see their rows); they go just before it."""
    with server_calls(monkeypatch) as calls:
        async with holding(engine) as conn:
            await conn.execute(insert(notes).values(id=1, text="one"))
            assert await count(conn, notes) == 1
            await conn.execute(insert(notes).values(id=2, text="two"))
            # an UPDATE that reads the held table in a subquery
            await conn.execute(
                update(tallies).values(n=select(func.count()).select_from(notes).scalar_subquery())
            )
    assert without_prepares(calls)[2:] == [
        "INSERT INTO",
        "SELECT count(*)",
        "INSERT INTO",
        "UPDATE held_tallies",
        "COMMIT",
    ]
    assert await tally(engine) == (2, None)


@on_postgresql
async def test_a_streamed_read_sees_the_held_rows(engine: AsyncEngine) -> None:
    async with holding(engine) as conn:
        await conn.execute(insert(notes).values(id=1, text="one"))
        streamed = await conn.stream(select(notes.c.text))
        assert [row.text async for row in streamed] == ["one"]


@on_postgresql
async def test_upserts_of_one_row_take_effect_one_after_the_other(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ``ON CONFLICT`` insert never rides beside another write to its table (it would not
    see the other's row), and several rows of one ``DO UPDATE`` with the same key are not held:
    each adds what it would have added alone."""
    add = pg_insert(tallies)
    add = add.on_conflict_do_update(index_elements=["id"], set_={"n": tallies.c.n + add.excluded.n})
    with server_calls(monkeypatch) as calls:
        async with holding(engine) as conn:
            await conn.execute(add, {"id": 1, "n": 1})
            await conn.execute(add, {"id": 1, "n": 10})
            await conn.execute(add, [{"id": 1, "n": 100}, {"id": 1, "n": 1000}])
            await conn.execute(add, [{"id": 2, "n": 5}, {"id": 3, "n": 7}])  # keys differ: held
    assert await tally(engine) == (1111, None)
    assert without_prepares(calls)[2:] == [
        "INSERT INTO",  # the first, sent before the second (same table, ON CONFLICT)
        "INSERT INTO",  # the second, before the executemany
        "many INSERT INTO",
        "INSERT INTO",  # two rows of distinct keys, one statement, before the COMMIT
        "COMMIT",
    ]
    async with engine.connect() as conn:
        rows = (await conn.execute(select(tallies.c.id, tallies.c.n).order_by(tallies.c.id))).all()
    assert [tuple(r) for r in rows] == [(1, 1111), (2, 5), (3, 7)]


@on_postgresql
async def test_a_failing_held_insert_fails_the_statement_it_rides_with_and_writes_nothing(
    engine: AsyncEngine,
) -> None:
    async with engine.begin() as conn:
        await conn.execute(insert(notes).values(id=1, text="there before"))
    with pytest.raises(sqlalchemy.exc.IntegrityError):
        async with holding(engine) as conn:
            await conn.execute(insert(notes).values(id=2, text="fine"))
            await conn.execute(insert(notes).values(id=1, text="a duplicate key"))
            await conn.execute(update(tallies).values(n=tallies.c.n + 1))
    with pytest.raises(sqlalchemy.exc.IntegrityError):
        async with holding(engine) as conn:
            await conn.execute(update(tallies).values(n=tallies.c.n + 1))
            await conn.execute(insert(notes).values(id=1, text="a duplicate, at the COMMIT"))
    async with engine.connect() as conn:
        assert (await conn.execute(select(notes.c.text))).scalars().all() == ["there before"]
    assert await tally(engine) == (0, None)


@on_postgresql
async def test_a_rollback_drops_what_was_held(engine: AsyncEngine) -> None:
    class Refused(Exception):
        pass

    with pytest.raises(Refused):
        async with holding(engine) as conn:
            await conn.execute(insert(notes).values(id=1, text="dropped"))
            raise Refused
    # the same pooled connection, a transaction without held inserts
    async with write_transaction(engine) as conn:
        await conn.execute(insert(notes).values(id=2, text="kept"))
        await conn.execute(update(tallies).values(n=tallies.c.n + 1))
    async with engine.connect() as conn:
        assert (await conn.execute(select(notes.c.text))).scalars().all() == ["kept"]


@on_postgresql
async def test_parameters_are_renumbered_outside_string_literals(engine: AsyncEngine) -> None:
    async with holding(engine) as conn:
        await conn.execute(insert(notes).values(id=1, text="$1 and '$2'"))
        await conn.execute(
            update(tallies).values(
                n=tallies.c.n + 5, note=literal_column("'costs $1, it''s $2'") + tallies.c.note
            )
        )
        await conn.execute(update(tallies).values(note=literal_column("'costs $1, it''s $2'")))
    async with engine.connect() as conn:
        assert (await conn.execute(select(notes.c.text))).scalar_one() == "$1 and '$2'"
    assert await tally(engine) == (5, "costs $1, it's $2")


def test_what_may_be_held() -> None:
    insert_sql = "INSERT INTO t (a, b) VALUES ($1::VARCHAR, $2::INTEGER)"
    held = pg_driver.holdable(insert_sql, 2)
    assert held is not None and held.table == "t" and not held.on_conflict
    assert held.operation == (
        "INSERT INTO t (a, b) VALUES ($1::VARCHAR, $2::INTEGER), ($3::VARCHAR, $4::INTEGER)"
    )
    assert pg_driver.holdable("INSERT INTO t (a) SELECT u.a FROM u", 1) is None
    assert pg_driver.holdable("INSERT INTO t (a) VALUES ($1) RETURNING t.a", 1) is None
    assert pg_driver.holdable("INSERT INTO t (a) VALUES ($1) -- \\", 1) is None
    # a parameter outside the VALUES row: several rows cannot be written as one
    assert (
        pg_driver.holdable("INSERT INTO t (a) VALUES ($1) ON CONFLICT DO UPDATE SET a = $2", 2)
        is None
    )


def test_distinct_keys() -> None:
    conflict = " ON CONFLICT (k) DO UPDATE SET v = t.v"
    upsert = "INSERT INTO t (k, v) VALUES ($1::VARCHAR, $2::VARCHAR)" + conflict
    assert pg_driver.distinct_keys(upsert, [("a", "1"), ("b", "1")])
    assert not pg_driver.distinct_keys(upsert, [("a", "1"), ("a", "2")])
    shuffled = "INSERT INTO t (k, v) VALUES ($2::VARCHAR, $1::VARCHAR)" + conflict
    assert not pg_driver.distinct_keys(shuffled, [("a", "1"), ("b", "1")])


def test_groups_part_where_one_could_see_another() -> None:
    def held(table: str, on_conflict: bool = False, values: int = 1) -> pg_driver.Held:
        return pg_driver.Held(f"INSERT INTO {table}", (0,) * values, table, on_conflict)

    a, b, upsert_a = held("a"), held("b"), held("a", on_conflict=True)
    assert pg_driver.groups([a, b, a]) == [[a, b, a]]
    assert pg_driver.groups([a, b, upsert_a, b]) == [[a, b], [upsert_a, b]]
    assert pg_driver.groups([upsert_a, upsert_a]) == [[upsert_a], [upsert_a]]
    big = held("c", values=pg_driver.MAX_PARAMETERS)
    assert pg_driver.groups([a, big, b]) == [[a], [big], [b]]
