"""Durable, resumable run events (issue 13), in process on both engines: the POST's stream and
``GET …/runs/{id}/events`` carry the same numbered events; resume after an id; coalesced
deltas; a constant number of event statements per run; retention (410) and the purge."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from app.agent.codec import load_message
from app.agent.events import Delta, MessageCompleted
from app.agent.providers.base import TextDelta, ThinkingDelta
from app.api.app import create_app
from app.clock import ManualClock
from app.service.events import COALESCE_SECONDS, EventRecorder
from app.service.live import StreamedEvent
from app.store import events as store_events
from app.store.events import EventRow
from app.store.tables import run_events
from tests.repository import Repository

from ..helpers import assert_problem, until, user
from ..store.test_write_cost import counting
from .conftest import AppClient, SettingsFactory, start_client

Event = tuple[int, str, Any]


def parse_sse(text: str) -> list[Event]:
    events = []
    for chunk in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in chunk.splitlines())
        events.append((int(fields["id"]), fields["event"], json.loads(fields["data"])))
    return events


async def create(client: AppClient, conv: str = "conv", **headers: str) -> None:
    created = await client.post("/conversations", json={"id": conv}, headers=headers)
    assert created.status_code == 201, created.text


async def streamed_run(client: AppClient, prompt: str, conv: str = "conv") -> list[Event]:
    async with client.stream(
        "POST", f"/conversations/{conv}/runs", json={"prompts": [prompt], "stream": True}
    ) as answer:
        assert answer.status_code == 201
        return parse_sse((await answer.aread()).decode())


async def read_events(client: AppClient, conv: str, run_id: str, **kwargs: Any) -> list[Event]:
    answer = await client.get(f"/conversations/{conv}/runs/{run_id}/events", **kwargs)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/event-stream")
    return parse_sse(answer.text)


def without_context(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != "context"}


async def test_the_post_stream_and_the_events_endpoint_carry_the_same_numbered_events(
    client: AppClient,
) -> None:
    await create(client)
    posted = await streamed_run(client, "/tool time_now {}")
    ids = [seq for seq, _, _ in posted]
    assert ids == list(range(1, len(posted) + 1))  # numbered from 1, no gap
    assert posted[0][1] == "run.started" and posted[-1][1] == "run.finished"
    run_id = posted[0][2]["run_id"]

    stored = await read_events(client, "conv", run_id)
    assert [(s, e) for s, e, _ in stored] == [(s, e) for s, e, _ in posted]
    assert [d for _, _, d in stored[:-1]] == [d for _, _, d in posted[:-1]]
    # run.finished: the run record (the POST's body without the context)
    record = (await client.get(f"/conversations/conv/runs/{run_id}")).json()
    assert stored[-1][2] == record == without_context(posted[-1][2])


async def test_a_reconnect_gets_exactly_the_events_after_the_last_one_it_saw(
    client: AppClient,
) -> None:
    await create(client)
    posted = await streamed_run(client, "/tool time_now {}")
    run_id = posted[0][2]["run_id"]
    path = f"/conversations/conv/runs/{run_id}/events"
    for k in range(len(posted)):
        by_header = await read_events(client, "conv", run_id, headers={"Last-Event-ID": str(k)})
        assert [s for s, _, _ in by_header] == [s for s, _, _ in posted[k:]]
        by_query = parse_sse((await client.get(path, params={"after": k})).text)
        assert [s for s, _, _ in by_query] == [s for s, _, _ in posted[k:]]
    # the header wins over the query (a browser's EventSource keeps the URL it started with)
    both = await read_events(
        client, "conv", run_id, params={"after": 0}, headers={"Last-Event-ID": "2"}
    )
    assert both[0][0] == 3
    # after the last event: nothing more to say
    last = posted[-1][0]
    tail = await client.get(path, headers={"Last-Event-ID": str(last)})
    assert tail.status_code == 200 and tail.text == "", (last, tail.text[:30])


async def test_unknown_runs_other_tenants_and_bad_ids_are_refused(
    make_settings: SettingsFactory,
) -> None:
    settings = make_settings(api_keys="acme:key-a,umbrella:key-b")
    app, client = await start_client(settings)
    a, b = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}
    async with app.router.lifespan_context(app), client:
        await create(client, **a)
        ran = await client.post("/conversations/conv/runs", json={"prompts": ["hi"]}, headers=a)
        run_id = ran.json()["run_id"]
        path = f"/conversations/conv/runs/{run_id}/events"
        assert (await client.get(path, headers=a)).status_code == 200
        assert_problem(await client.get(path, headers=b), 404, "not-found")
        unknown = "/conversations/conv/runs/00000000-0000-0000-0000-000000000000/events"
        assert_problem(await client.get(unknown, headers=a), 404, "not-found")
        bad = await client.get(path, headers={**a, "Last-Event-ID": "x"})
        assert_problem(bad, 400, "bad-header")
        assert_problem(
            await client.get(path, params={"after": -1}, headers=a), 422, "validation-error"
        )


async def count_events(engine: Any) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(run_events))).scalar())


async def test_events_expire_after_their_retention_and_the_tick_purges_them(
    make_settings: SettingsFactory,
) -> None:
    clock = ManualClock()
    settings = make_settings(event_retention_seconds=3600)
    app = create_app(settings, clock=clock)
    client = AppClient(transport=httpx.ASGITransport(app=app), base_url="http://carryover.test")
    async with app.router.lifespan_context(app), client:
        await create(client)
        ran = await client.post("/conversations/conv/runs", json={"prompts": ["a b c"]})
        run_id = ran.json()["run_id"]
        path = f"/conversations/conv/runs/{run_id}/events"
        kept = await read_events(client, "conv", run_id)
        engine = app.state.services.engine
        assert len(kept) == 5  # run.started, the prompt, a delta, the answer, run.finished
        assert await count_events(engine) == 1  # written with the outcome: one row

        clock.advance(3599)
        assert await read_events(client, "conv", run_id) == kept
        clock.advance(2)
        assert_problem(await client.get(path), 410, "events-expired")  # before any purge too

        async def purged() -> bool | None:
            return True if await count_events(engine) == 0 else None

        await until(purged, what="the lease keeper's tick to purge the events")
        assert_problem(await client.get(path), 410, "events-expired")
        # the run record and the transcript stay
        assert (await client.get(f"/conversations/conv/runs/{run_id}")).status_code == 200
        transcript = (await client.get("/conversations/conv/transcript")).json()
        assert len(transcript["items"]) == 2


async def test_the_purge_deletes_in_bounded_batches(
    engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ManualClock()
    repo = Repository(engine, clock)
    await repo.create_conversation("t", "c")
    run = await repo.insert_run("t", "c", base_etag='"x-1"', prompts=())

    def rows(seqs: range) -> list[EventRow]:
        return [EventRow("t", "c", run.run_id, n, "delta", {"n": n}, clock.now()) for n in seqs]

    await repo.append_events(rows(range(1, 7)))
    clock.advance(10)
    await repo.append_events(rows(range(7, 10)))  # younger
    clock.advance(5)
    monkeypatch.setattr(store_events, "PURGE_BATCH", 2)
    monkeypatch.setattr(store_events, "PURGE_BATCHES", 2)
    with counting(engine) as writes:
        assert await repo.purge_events(10) == 4  # two statements of two rows, the oldest
    assert sum(s.lstrip().upper().startswith("DELETE") for s in writes.statements) == 2
    left = await repo.read_events("t", "c", run.run_id, after=0, limit=100)
    assert [r.seq for r in left] == [5, 6, 7, 8, 9]
    assert await repo.purge_events(10) == 2  # the rest of the old ones; the young stay
    assert await repo.purge_events(10) == 0
    left = await repo.read_events("t", "c", run.run_id, after=0, limit=100)
    assert [r.seq for r in left] == [7, 8, 9]


async def test_a_run_writes_its_events_in_a_constant_number_of_statements(
    make_settings: SettingsFactory,
) -> None:
    """However long the answer (one delta per word from the echo provider), a run that ends
    within the flush interval writes its events with its outcome: one statement."""
    clock = ManualClock()  # time stands still: no background flush, one coalesced delta
    settings = make_settings()
    app = create_app(settings, clock=clock)
    client = AppClient(transport=httpx.ASGITransport(app=app), base_url="http://carryover.test")
    async with app.router.lifespan_context(app), client:
        await create(client)
        engine = app.state.services.engine
        counts = []
        for words in (5, 2000):
            prompt = " ".join(f"w{i}" for i in range(words))
            with counting(engine) as writes:
                ran = await client.post("/conversations/conv/runs", json={"prompts": [prompt]})
            assert ran.status_code == 201
            counts.append(
                sum(
                    "run_events" in s and s.lstrip().upper().startswith("INSERT")
                    for s in writes.statements
                )
            )
            events = await read_events(client, "conv", ran.json()["run_id"])
            deltas = [d for _, e, d in events if e == "delta"]
            assert len(deltas) == 1 and deltas[0]["text"].count(" ") >= words - 1
        assert counts == [1, 1]


async def test_the_live_stream_and_the_stored_feed_write_each_event_in_the_same_bytes(
    client: AppClient,
) -> None:
    """Compact JSON, UTF-8 as it is, on both: a message event is its message's stored text."""
    await create(client)
    prompt = 'naïve café ✓ \u2028 "quoted"'
    async with client.stream(
        "POST", "/conversations/conv/runs", json={"prompts": [prompt], "stream": True}
    ) as answer:
        assert answer.status_code == 201
        live = (await answer.aread()).decode()
    run_id = parse_sse(live)[0][2]["run_id"]
    stored = await client.get(f"/conversations/conv/runs/{run_id}/events")

    def raw(text: str) -> dict[str, str]:  # each event's data line as sent, by event and seq
        out = {}
        for chunk in text.strip().split("\n\n"):
            fields = dict(line.split(": ", 1) for line in chunk.splitlines())
            if fields["event"] != "run.finished":  # the run's record: its own view on each
                out[f"{fields['id']} {fields['event']}"] = fields["data"]
        return out

    sent, kept = raw(live), raw(stored.text)
    assert sent == kept
    messages = [data for key, data in sent.items() if key.endswith(" message")]
    assert len(messages) == 2 and all("naïve café ✓" in data for data in messages)
    assert all("\\u00e" not in data for data in sent.values())  # UTF-8, not escaped to ASCII
    # a line separator stays in the JSON value, escaped: a reader splitting lines as Python's
    # str.splitlines does (httpx's aiter_lines) still reads one data line per event
    assert all("\u2028" not in data and "\\u2028" in data for data in messages)
    assert json.loads(messages[0])["content"][0]["text"] == prompt


# --- the recorder, alone -------------------------------------------------------------------


class Sink:
    def __init__(self) -> None:
        self.batches: list[list[EventRow]] = []

    async def append_events(self, rows: list[EventRow]) -> None:
        self.batches.append(list(rows))


def text(i: int, part: str) -> Delta:
    return Delta(TextDelta(index=i, text=part))


async def test_deltas_of_one_block_within_the_window_become_one_event() -> None:
    clock = ManualClock()
    live: asyncio.Queue[StreamedEvent | None] = asyncio.Queue()
    recorder = EventRecorder(Sink(), clock, "t", "c", "r", live)  # type: ignore[arg-type]
    recorder.start({"run_id": "r"}, background=False)
    recorder.add(text(0, "a"))
    clock.advance(COALESCE_SECONDS / 2)
    recorder.add(text(0, "b"))
    clock.advance(COALESCE_SECONDS)  # the window of "a" is over (0.075 s): a new event begins
    recorder.add(text(0, "c"))
    recorder.add(text(1, "d"))  # another block
    recorder.add(Delta(ThinkingDelta(index=1, thinking="e")))  # another kind
    recorder.add(MessageCompleted(load_message(user("x"))))
    rows = await recorder.close()
    got = [(r.seq, r.event, r.data) for r in rows]
    assert got[:-1] == [
        (1, "run.started", {"run_id": "r"}),
        (2, "delta", {"kind": "text", "index": 0, "text": "ab"}),
        (3, "delta", {"kind": "text", "index": 0, "text": "c"}),
        (4, "delta", {"kind": "text", "index": 1, "text": "d"}),
        (5, "delta", {"kind": "thinking", "index": 1, "text": "e"}),
        (6, "message", got[5][2]),
    ]
    assert got[-1] == (7, "run.finished", None) and recorder.finished_seq == 7
    streamed = [live.get_nowait() for _ in range(live.qsize())]
    assert [(e.seq, e.event, e.data) for e in streamed] == got[:-1]  # the marker is the route's


async def test_a_blocks_first_parts_are_sent_when_their_turn_of_the_loop_ends() -> None:
    """What a client waits for first does not wait for the window: a block's first parts are one
    event at the end of the loop's turn they arrived in; later parts are coalesced as before."""
    clock = ManualClock()  # the window never passes on its own
    live: asyncio.Queue[StreamedEvent | None] = asyncio.Queue()
    recorder = EventRecorder(Sink(), clock, "t", "c", "r", live)  # type: ignore[arg-type]
    recorder.start({}, background=False)

    def sent() -> list[tuple[str, Any]]:
        events = [live.get_nowait() for _ in range(live.qsize())]
        return [(e.event, e.data) for e in events if e is not None]

    assert sent() == [("run.started", {})]
    recorder.add(text(0, "a"))
    recorder.add(text(0, "b"))  # in the same turn: the same event
    assert sent() == []
    await asyncio.sleep(0)
    assert sent() == [("delta", {"kind": "text", "index": 0, "text": "ab"})]
    recorder.add(text(0, "c"))
    await asyncio.sleep(0)
    recorder.add(text(0, "d"))
    await asyncio.sleep(0)
    assert sent() == []  # the block's later parts wait for their window
    clock.advance(COALESCE_SECONDS * 1.5)
    recorder.seal_if_due()
    assert sent() == [("delta", {"kind": "text", "index": 0, "text": "cd"})]
    recorder.add(Delta(ThinkingDelta(index=1, thinking="e")))  # another block: at once too
    await asyncio.sleep(0)
    assert sent() == [("delta", {"kind": "thinking", "index": 1, "text": "e"})]
    recorder.add(MessageCompleted(load_message(user("x"))))
    recorder.add(Delta(ThinkingDelta(index=1, thinking="f")))  # after another event: first again
    await asyncio.sleep(0)
    assert sent()[-1] == ("delta", {"kind": "thinking", "index": 1, "text": "f"})
    rows = await recorder.close()  # the same events are stored
    assert [r.event for r in rows] == [
        "run.started",
        "delta",
        "delta",
        "delta",
        "message",
        "delta",
        "run.finished",
    ]


async def test_a_pending_delta_is_sealed_once_its_window_passed_and_batches_are_written() -> None:
    clock = ManualClock()
    sink = Sink()
    recorder = EventRecorder(sink, clock, "t", "c", "r")  # type: ignore[arg-type]
    recorder.start({}, background=False)
    recorder.add(text(0, "a"))
    recorder.seal_if_due()
    await recorder.write()
    assert [[r.event for r in b] for b in sink.batches] == [["run.started"]]  # "a" still open
    clock.advance(COALESCE_SECONDS * 1.5)
    recorder.seal_if_due()
    await recorder.write()
    assert [r.data["text"] for r in sink.batches[1]] == ["a"]
    assert [r.event for r in await recorder.close()] == ["run.finished"]


def background_recorder(sink: Sink, clock: ManualClock, flush_seconds: float) -> EventRecorder:
    """A recorder started with its writer of batches, which looks at every turn of the loop."""
    recorder = EventRecorder(
        sink,  # type: ignore[arg-type]
        clock,
        "t",
        "c",
        "r",
        coalesce_seconds=0.0,
        flush_seconds=flush_seconds,
    )
    recorder.start({}, background=True)
    return recorder


class GatedSink(Sink):
    """A sink whose writes wait for ``gate``."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.writing = asyncio.Event()

    async def append_events(self, rows: list[EventRow]) -> None:
        self.writing.set()
        await self.gate.wait()
        await super().append_events(rows)


async def test_the_background_writer_seals_and_writes_while_the_run_goes_and_stops_at_close() -> (
    None
):
    clock = ManualClock()
    sink = Sink()
    recorder = background_recorder(sink, clock, flush_seconds=1.0)  # of the manual clock
    recorder.add(text(0, "a"))
    for _ in range(20):  # turns of the loop, the clock still: sealed, nothing due yet
        await asyncio.sleep(0)
    assert sink.batches == []
    clock.advance(1.0)

    async def written() -> list[list[EventRow]] | None:
        return sink.batches or None

    batches = await until(written, what="a batch written in the background")
    assert [[(r.seq, r.event) for r in b] for b in batches] == [[(1, "run.started"), (2, "delta")]]
    recorder.add(text(0, "b"))
    rows = await recorder.close()
    assert [(r.seq, r.event) for r in rows] == [(3, "delta"), (4, "run.finished")]
    clock.advance(5.0)
    for _ in range(20):  # stopped: no more batches
        await asyncio.sleep(0)
    assert len(sink.batches) == 1


async def test_closing_waits_for_a_batch_being_written_and_writes_none_twice() -> None:
    clock = ManualClock()
    sink = GatedSink()
    recorder = background_recorder(sink, clock, flush_seconds=0.0)  # a batch at the first look
    await asyncio.wait_for(sink.writing.wait(), 30)  # the batch of run.started is being written
    recorder.add(text(0, "x"))
    closing = asyncio.create_task(recorder.close())
    for _ in range(20):
        await asyncio.sleep(0)
    assert not closing.done()  # it waits for the batch; it does not cancel it
    sink.gate.set()
    rows = await asyncio.wait_for(closing, 30)
    assert [[r.event for r in b] for b in sink.batches] == [["run.started"]]
    assert [(r.seq, r.event) for r in rows] == [(2, "delta"), (3, "run.finished")]
