"""Event streams hold no more than a bound for a reader that stops reading, and keep quiet
connections alive (docs/runs.md, "Streams"): a streamed run's reader that falls behind by more
than ``stream_buffer_bytes`` is cut with an ``error`` event ``stream-reader-behind`` and resumes
from the stored events with ``Last-Event-ID``, losing nothing; a stream that has nothing to say
for ``stream_keepalive_seconds`` sends ``: keep-alive`` comments (the native POST stream and
``GET …/runs/{id}/events``).

httpx's ASGI transport hands over a response only once it is complete, so these tests drive the
app by hand (:class:`Exchange`): the response's chunks arrive as the app sends them, and the
test decides when the client reads. No test sleeps: the run is held at a gate, the reader by
its own gate, and the run's end is awaited by polling its record."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from app.api.app import create_app
from app.api.sse import KEEPALIVE, keepalive
from app.service.live import LiveStream, ReaderBehind

from ..fakes.gated import GatedProvider, gated_pool
from ..helpers import HANG_GUARD_SECONDS, until
from .conftest import SettingsFactory

PROBLEM = "https://carryover.dev/problems/"


class Exchange:
    """One HTTP request to the app, driven by hand: ``reading`` open means the client reads;
    closed, the app's next body chunk waits (as a socket whose peer stopped reading)."""

    def __init__(self, app: Any, method: str, path: str, body: bytes = b"", **headers: str):
        self.reading = asyncio.Event()
        self.reading.set()
        self.chunks: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.status: int | None = None
        self._gone = asyncio.Event()
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [
                (k.lower().replace("_", "-").encode(), v.encode()) for k, v in headers.items()
            ],
            "client": ("127.0.0.1", 50000),
            "server": ("carryover.test", 80),
        }
        self._body = body
        self.task = asyncio.create_task(app(scope, self._receive, self._send))

    async def _receive(self) -> dict[str, Any]:
        if self._body is not None:
            body, self._body = self._body, None  # type: ignore[assignment]
            return {"type": "http.request", "body": body, "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            return
        await self.reading.wait()
        if message.get("body"):
            self.chunks.put_nowait(message["body"])
        if not message.get("more_body", False):
            self.chunks.put_nowait(None)

    async def next_chunk(self) -> bytes | None:
        return await asyncio.wait_for(self.chunks.get(), HANG_GUARD_SECONDS)

    async def rest(self) -> bytes:
        out = b""
        while (chunk := await self.next_chunk()) is not None:
            out += chunk
        return out

    async def close(self) -> None:
        self._gone.set()
        self.reading.set()
        await asyncio.wait_for(self.task, HANG_GUARD_SECONDS)


def events(text: bytes) -> list[dict[str, Any]]:
    """The events of an SSE body (comments left out), each ``{"event", "id", "data"}``."""
    found = []
    for block in text.decode().split("\n\n"):
        fields: dict[str, Any] = {}
        for line in block.splitlines():
            if line.startswith(":"):
                continue
            name, _, value = line.partition(": ")
            fields[name] = value
        if fields:
            fields["data"] = json.loads(fields["data"])
            found.append(fields)
    return found


@asynccontextmanager
async def started(
    make_settings: SettingsFactory, gate: GatedProvider | None = None, **overrides: Any
) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    settings = make_settings(**overrides)
    app = create_app(settings, agents=gated_pool(settings, gate) if gate else None)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://carryover.test") as http,
    ):
        yield app, http
        if gate is not None:
            gate.open()


async def _conversation(http: httpx.AsyncClient) -> str:
    created = await http.post("/conversations", json={})
    assert created.status_code == 201
    conv: str = created.json()["id"]
    return conv


def _streamed_run(app: Any, conv: str, prompt: str) -> Exchange:
    body = json.dumps({"prompts": [prompt], "stream": True}).encode()
    return Exchange(
        app,
        "POST",
        f"/conversations/{conv}/runs",
        body,
        content_type="application/json",
        accept="text/event-stream",
    )


async def _ended(http: httpx.AsyncClient, conv: str) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        items = (await http.get(f"/conversations/{conv}/runs")).json()["items"]
        return items[0] if items and items[0]["status"] != "running" else None

    return await until(probe, what="the run's end")


async def test_a_reader_that_stops_reading_is_cut_and_resumes_from_the_stored_events(
    make_settings: SettingsFactory,
) -> None:
    async with started(make_settings, stream_buffer_bytes=1024) as (app, http):
        conv = await _conversation(http)
        exchange = _streamed_run(app, conv, "long " * 2000)  # a 10 kB answer: many events
        exchange.reading.clear()  # the client stops reading: the stream's first chunk waits
        record = await _ended(http, conv)
        assert record["status"] == "completed"  # the run is not held up by its reader

        exchange.reading.set()
        live = events(await exchange.rest())
        await exchange.close()
        assert exchange.status == 201
        # whatever the reader had before it fell behind, then the error saying where to resume
        *before, cut = live
        assert [int(e["id"]) for e in before] == list(range(1, len(before) + 1))
        assert cut["event"] == "error" and "id" not in cut
        problem = cut["data"]
        assert problem["type"] == PROBLEM + "stream-reader-behind"
        last = len(before)
        assert problem["last_event_id"] == last and problem["run_id"] == record["run_id"]
        assert f"Last-Event-ID: {last}" in problem["detail"]
        assert "run.finished" not in [e["event"] for e in before]

        resumed = await http.get(problem["events"], headers={"Last-Event-ID": str(last)})
        assert resumed.status_code == 200
        rest = events(resumed.content)
        assert [int(e["id"]) for e in rest] == list(range(last + 1, last + len(rest) + 1))
        rest = before + rest
        assert rest[-1]["event"] == "run.finished" and rest[-1]["data"] == record
        text = "".join(
            e["data"]["text"] for e in rest if e["event"] == "delta" and e["data"]["kind"] == "text"
        )
        assert text.count("long") == 2000  # nothing of the answer was lost


async def test_a_reader_that_keeps_up_gets_every_event(make_settings: SettingsFactory) -> None:
    async with started(make_settings) as (app, http):  # the default bound
        conv = await _conversation(http)
        exchange = _streamed_run(app, conv, "long " * 2000)
        live = events(await exchange.rest())
        await exchange.close()
        assert live[-1]["event"] == "run.finished" and live[-1]["data"]["status"] == "completed"
        assert "error" not in [e["event"] for e in live]


def test_the_live_stream_holds_no_more_than_its_bound() -> None:
    from app.service.live import StreamedEvent

    stream = LiveStream(max_bytes=1024)
    stream.put_nowait(StreamedEvent(1, "delta", {"text": "x" * 4000}))  # one always fits
    assert stream.qsize() == 1 and not stream.cut
    stream.put_nowait(StreamedEvent(2, "delta", {"text": "y"}))
    assert stream.cut and stream.qsize() == 0 and stream.held_bytes == 0
    stream.put_nowait(StreamedEvent(3, "delta", {"text": "z"}))  # nothing more is kept
    assert stream.qsize() == 0
    with pytest.raises(ReaderBehind):
        asyncio.run(stream.get())


async def test_a_quiet_run_stream_sends_keep_alive_comments(
    make_settings: SettingsFactory,
) -> None:
    gate = GatedProvider()
    async with started(make_settings, gate, stream_keepalive_seconds=0.01) as (app, http):
        conv = await _conversation(http)
        exchange = _streamed_run(app, conv, "quiet")
        held = await gate.arrival("quiet")  # the provider says nothing until released
        seen = b""
        while KEEPALIVE not in seen:
            chunk = await exchange.next_chunk()
            assert chunk is not None
            seen += chunk
        held.release()
        seen += await exchange.rest()
        await exchange.close()
        assert seen.index(b"event: run.started") < seen.index(KEEPALIVE)
        assert [e["event"] for e in events(seen)][-1] == "run.finished"


async def test_a_quiet_events_stream_sends_keep_alive_comments(
    make_settings: SettingsFactory,
) -> None:
    gate = GatedProvider()
    async with started(make_settings, gate, stream_keepalive_seconds=0.01) as (app, http):
        conv = await _conversation(http)
        accepted = await http.post(
            f"/conversations/{conv}/runs",
            json={"prompts": ["quiet"]},
            headers={"Prefer": "respond-async"},
        )
        assert accepted.status_code == 202
        run_id = accepted.json()["run_id"]
        held = await gate.arrival("quiet")
        exchange = Exchange(app, "GET", f"/conversations/{conv}/runs/{run_id}/events")
        seen = b""
        while KEEPALIVE not in seen:
            chunk = await exchange.next_chunk()
            assert chunk is not None
            seen += chunk
        held.release()
        seen += await exchange.rest()
        await exchange.close()
        assert exchange.status == 200
        assert [e["event"] for e in events(seen)][-1] == "run.finished"


async def test_keepalive_fills_quiet_periods_only() -> None:
    tick = asyncio.Event()
    more = asyncio.Event()

    async def source() -> AsyncIterator[bytes]:
        yield b"a"
        await more.wait()
        yield b"b"

    stream = keepalive(source(), 15.0, timer=tick.wait)
    assert await anext(stream) == b"a"  # ready at once: no comment before it
    waiting = asyncio.ensure_future(anext(stream))
    tick.set()  # a quiet period passed
    assert await waiting == KEEPALIVE
    tick.clear()
    more.set()
    assert await anext(stream) == b"b"
    with pytest.raises(StopAsyncIteration):
        await anext(stream)
