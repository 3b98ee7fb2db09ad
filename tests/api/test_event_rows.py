"""A run's events as rows (app/store/events.py, migration 0020), on both engines: the events a
run writes with its outcome are one row when its records reference every message text among
them, and read back event by event — after any seq, up to any limit, an event stored twice
read once, the bounds those of the events — while a batch naming a text no record references
keeps a row per event. A damaged row, or a text it names gone, is refused, never served. The
downgrade writes such a row back as a row per event, and the upgrade reads them the same."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import func, insert, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.clock import ManualClock
from app.store.db import make_engine, write_transaction
from app.store.errors import StoredRecordDamaged
from app.store.events import EVENTS_ROW, EventRow, insert_events
from app.store.integrity import body_sha256
from app.store.migrate import downgrade, upgrade
from app.store.tables import run_events, run_new_messages
from tests.repository import Repository

MESSAGE = {"type": "user", "content": [{"type": "text", "text": "naïve ✓ \u2028"}]}
KEY = body_sha256(json.dumps(MESSAGE, ensure_ascii=False, separators=(",", ":")))


async def a_run(engine: AsyncEngine) -> tuple[Repository, ManualClock, str]:
    clock = ManualClock()
    repo = Repository(engine, clock)
    await repo.create_conversation("t", "c")
    run = await repo.insert_run("t", "c", base_etag='"x-1"', prompts=())
    return repo, clock, run.run_id


def events(run_id: str, clock: ManualClock, seqs: range, conv: str = "c") -> list[EventRow]:
    """``run.started``, then deltas and one message (at seq 3), ``run.finished`` last."""
    out = []
    for n in seqs:
        name, data = "delta", {"kind": "text", "index": 0, "text": f"w{n}"}
        if n == 1:
            name, data = "run.started", {"run_id": run_id}
        elif n == 3:
            name, data = "message", MESSAGE
        elif n == seqs[-1]:
            name, data = "run.finished", None
        out.append(EventRow("t", conv, run_id, n, name, data, clock.now()))
    return out


async def write(engine: AsyncEngine, rows: list[EventRow], referenced: frozenset[str]) -> None:
    """``rows`` written as a run's finish writes its last events: with its records (here its
    new messages, a row naming each of ``referenced``) in the same transaction."""
    first = rows[0]
    async with write_transaction(engine) as conn:
        for i, key in enumerate(sorted(referenced)):
            await conn.execute(
                insert(run_new_messages).values(
                    tenant=first.tenant,
                    conversation_id=first.conversation_id,
                    run_id=first.run_id,
                    seq=i,
                    body=None,
                    body_sha256=key,
                )
            )
        await insert_events(conn, rows, referenced=referenced)


async def stored_rows(engine: AsyncEngine) -> list[tuple[int, str, int | None]]:
    async with engine.connect() as conn:
        found = await conn.execute(
            select(run_events.c.seq, run_events.c.event, run_events.c.first_seq).order_by(
                run_events.c.seq
            )
        )
        return [tuple(r) for r in found]  # type: ignore[misc]


def seen(rows: list[EventRow]) -> list[tuple[int, str, Any]]:
    return [(r.seq, r.event, r.data) for r in rows]


async def test_a_batch_whose_texts_the_records_reference_is_one_row_read_event_by_event(
    engine: AsyncEngine,
) -> None:
    repo, clock, run_id = await a_run(engine)
    written = events(run_id, clock, range(1, 7))
    await write(engine, written, frozenset({KEY}))
    assert await stored_rows(engine) == [(6, EVENTS_ROW, 1)]

    everything = await repo.read_events("t", "c", run_id, after=0, limit=100)
    assert seen(everything) == seen(written)
    assert all(r.created_at == written[-1].created_at for r in everything)
    # after any seq, up to any limit: the row's events past it
    for after in range(7):
        for limit in (1, 2, 100):
            part = await repo.read_events("t", "c", run_id, after=after, limit=limit)
            assert seen(part) == seen(written[after : after + limit]), (after, limit)
    assert await repo.event_bounds("t", "c", run_id) == (1, 6)


async def test_events_stored_twice_are_read_once_and_the_bounds_span_them(
    engine: AsyncEngine,
) -> None:
    """A batch whose commit was not confirmed (it did commit) is written again with the
    outcome: rows 1 to 3 of their own, then 1 to 6 in one row."""
    repo, clock, run_id = await a_run(engine)
    written = events(run_id, clock, range(1, 7))
    await repo.append_events(written[:3])
    await write(engine, written, frozenset({KEY}))
    assert await stored_rows(engine) == [
        (1, "run.started", None),
        (2, "delta", None),
        (3, "message", None),
        (6, EVENTS_ROW, 1),
    ]
    assert seen(await repo.read_events("t", "c", run_id, after=0, limit=100)) == seen(written)
    assert seen(await repo.read_events("t", "c", run_id, after=2, limit=2)) == seen(written[2:4])
    assert await repo.event_bounds("t", "c", run_id) == (1, 6)
    # and after a run's first events of their own, its last ones in one row
    clock2, run2 = await a_run_in(repo, "c2")
    later = events(run2, clock2, range(1, 9), "c2")
    await repo.append_events(later[:2])
    await write(engine, later[2:], frozenset({KEY}))
    assert seen(await repo.read_events("t", "c2", run2, after=0, limit=100)) == seen(later)
    assert await repo.event_bounds("t", "c2", run2) == (1, 8)


async def a_run_in(repo: Repository, conv: str) -> tuple[ManualClock, str]:
    await repo.create_conversation("t", conv)
    run = await repo.insert_run("t", conv, base_etag='"x-1"', prompts=())
    assert isinstance(repo.clock, ManualClock)
    return repo.clock, run.run_id


@pytest.mark.parametrize("referenced", [frozenset(), frozenset({"0" * 64})])
async def test_a_batch_naming_a_text_no_record_references_keeps_a_row_per_event(
    engine: AsyncEngine, referenced: frozenset[str]
) -> None:
    repo, clock, run_id = await a_run(engine)
    written = events(run_id, clock, range(1, 5))
    await write(engine, written, referenced)
    assert [seq for seq, _, _ in await stored_rows(engine)] == [1, 2, 3, 4]
    assert seen(await repo.read_events("t", "c", run_id, after=0, limit=100)) == seen(written)


async def test_a_damaged_row_of_events_or_a_text_it_names_gone_is_refused(
    engine: AsyncEngine,
) -> None:
    repo, clock, run_id = await a_run(engine)
    await write(engine, events(run_id, clock, range(1, 5)), frozenset({KEY}))
    async with engine.begin() as conn:
        await conn.execute(text("DELETE FROM message_texts"))
    with pytest.raises(StoredRecordDamaged, match="missing"):
        await repo.read_events("t", "c", run_id, after=0, limit=100)
    # events before the message still read: the text is not needed for them
    assert [r.seq for r in await repo.read_events("t", "c", run_id, after=3, limit=9)] == [4]
    for damaged in ('{"not": "a list"}', "[[1]]", '[["1", "delta", {}]]', '[[2, "message", 7, 8]]'):
        async with engine.begin() as conn:
            await conn.execute(
                text("UPDATE run_events SET data = :d WHERE first_seq IS NOT NULL"), {"d": damaged}
            )
        with pytest.raises(StoredRecordDamaged):
            await repo.read_events("t", "c", run_id, after=0, limit=100)


async def test_a_run_writes_its_events_as_one_row_and_the_downgrade_as_a_row_each(
    app_factory: Callable[..., Any], database_url: str
) -> None:
    async with app_factory() as client:
        assert (await client.post("/conversations", json={"id": "c"})).status_code == 201
        ran = await client.post("/conversations/c/runs", json={"prompts": ["one é ✓"]})
        run_id = ran.json()["run_id"]
        path = f"/conversations/c/runs/{run_id}/events"
        before = await client.get(path)
        assert before.status_code == 200 and before.text.count("\nid: ") == 5

    async def rows() -> list[tuple[Any, ...]]:
        engine = make_engine(database_url)
        try:
            async with engine.connect() as conn:
                found = await conn.execute(
                    text(
                        "SELECT seq, event, data, data_sha256 FROM run_events ORDER BY run_id, seq"
                    )
                )
                return [tuple(r) for r in found]
        finally:
            await engine.dispose()

    [(seq, event, _, key)] = await rows()
    assert (seq, event, key) == (5, EVENTS_ROW, None)
    await downgrade(database_url, "0019")
    expanded = await rows()
    assert [(s, e) for s, e, _, _ in expanded] == [
        (1, "run.started"),
        (2, "message"),
        (3, "delta"),
        (4, "message"),
        (5, "run.finished"),
    ]
    # a message event references its text, as a row of its own always did
    assert [(d, k is not None) for _, e, d, k in expanded if e == "message"] == [(None, True)] * 2
    await upgrade(database_url)
    async with app_factory() as client:
        after = await client.get(path)
        assert after.status_code == 200 and after.content == before.content
        engine = make_engine(database_url)
        try:
            async with engine.connect() as conn:
                count = (await conn.execute(select(func.count()).select_from(run_events))).scalar()
        finally:
            await engine.dispose()
        assert count == 5
