"""``GET …/runs/{id}/events`` of a queued run, in process on both engines (docs/runs.md, "Queued
runs"): the stream follows the run from when its turn comes to its end; a run cancelled before
it ran streams its end alone. And what a reader following a running run costs the database
each time it finds nothing new: two one-statement reads, never the whole run record.
Runs are held in flight with :class:`GatedProvider`; nothing is timed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.service.events import EventFeed
from app.store.stores import Stores

from ..fakes.gated import GatedProvider
from ..helpers import server_calls
from ..store.test_write_cost import counting
from .conftest import AppClient
from .test_queue_admission import ASYNC, post_run
from .test_queue_admission import client as client  # the fixtures
from .test_queue_admission import gate as gate


def event_names(text: str) -> list[str]:
    return [line.removeprefix("event: ") for line in text.splitlines() if line.startswith("event:")]


async def queued_behind_a_held_run(client: AppClient, gate: GatedProvider) -> tuple[str, str]:
    """A running run held at its provider request, and a run queued behind it: their ids."""
    first = await post_run(client, "held first", ASYNC)
    assert first.status_code == 202, first.text
    await gate.arrival("held first")
    second = await post_run(client, "second", ASYNC, if_busy="enqueue")
    assert second.status_code == 202 and second.json()["status"] == "queued", second.text
    return first.json()["run_id"], second.json()["run_id"]


async def test_the_events_of_a_queued_run_follow_it_from_its_turn_to_its_end(
    client: AppClient, gate: GatedProvider
) -> None:
    _, queued = await queued_behind_a_held_run(client, gate)
    reading = asyncio.create_task(client.get(f"/conversations/conv/runs/{queued}/events"))
    await asyncio.sleep(0)
    assert not reading.done()
    gate.open()
    answer = await reading
    assert answer.status_code == 200, answer.text  # was 410 events-expired
    names = event_names(answer.text)
    assert names[0] == "run.started" and names[-1] == "run.finished", names
    assert names.count("message") == 2, names  # the prompt and the answer


async def test_a_run_cancelled_while_queued_streams_its_end_alone(
    client: AppClient, gate: GatedProvider
) -> None:
    _, queued = await queued_behind_a_held_run(client, gate)
    cancelled = await client.post(f"/conversations/conv/runs/{queued}/cancel")
    assert cancelled.json()["status"] == "cancelled", cancelled.text
    answer = await client.get(f"/conversations/conv/runs/{queued}/events")
    assert answer.status_code == 200, answer.text  # was 410 events-expired
    assert event_names(answer.text) == ["run.finished"]


class Polled(Exception):
    """Raised by the feed's sleep: the reader found nothing new once."""


async def test_a_reader_finding_nothing_new_reads_two_statements(
    client: AppClient, gate: GatedProvider, monkeypatch: Any
) -> None:
    """Each poll of a reader following a running run reads the events after its last one
    and, finding none, the run's status alone (before: the whole run record, with its new
    messages, final and compactions). On PostgreSQL each is a statement with no transaction
    of its own: one round trip each."""
    held = await post_run(client, "held first", ASYNC)
    run_id = held.json()["run_id"]
    await gate.arrival("held first")
    stores: Stores = client.app.state.services.stores
    engine: AsyncEngine = stores.engine

    async def sleep(_seconds: float) -> None:
        raise Polled

    feed = EventFeed(stores, stores.clock, 3600, 0.25, sleep=sleep)
    events = await feed.open("default", "conv", run_id, 0)
    with counting(engine) as seen, server_calls(monkeypatch) as calls:
        with pytest.raises(Polled):
            async for _ in events:  # what the run stored so far, then nothing new
                pass
    reads = [  # by table (SQLite's read transactions begin with a BEGIN of their own)
        s.split()[0] + " " + s.split("FROM")[1].split()[0]
        for s in seen.statements
        if s.startswith("SELECT")
    ]
    # the events, found or not, until one read finds none; then the status, and no other table
    assert reads[-2:] == ["SELECT run_events", "SELECT runs"], seen.statements
    assert set(reads[:-1]) == {"SELECT run_events"}, seen.statements
    if engine.dialect.name == "postgresql":  # no BEGIN and COMMIT around either
        sent = [c for c in calls if not c.startswith("prepare ")]
        assert sent[-2:] == ["SELECT run_events.tenant,", "SELECT runs.status"], calls
        assert len(sent) == len(reads), calls
