"""Issue 13 with real ``carryover serve`` processes on one PostgreSQL: a run's events read from
another replica while it runs, resumed after ``Last-Event-ID``, after it ended; webhooks signed
(Standard Webhooks), retried after 500s and delivered once, and delivered by another replica
when the server that committed the outcome was SIGKILLed before sending it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from app.service.webhooks import verify

from ..fakes.gated_http import PROFILE, GatedOpenAI
from .harness import ROOT, Server, Servers, client, create_conversation, eventually

Event = tuple[int, str, Any]


async def sse(response: httpx.Response) -> list[Event]:
    """(id, event, data) of a whole text/event-stream response."""
    events: list[Event] = []
    fields: dict[str, str] = {}
    async for line in response.aiter_lines():
        if line == "":
            if fields:
                events.append((int(fields["id"]), fields["event"], json.loads(fields["data"])))
            fields = {}
        else:
            name, _, value = line.partition(": ")
            fields[name] = value
    return events


async def events_of(server: Server, conv: str, run_id: str, **headers: str) -> list[Event]:
    async with client(server) as http:
        async with http.stream(
            "GET", f"/conversations/{conv}/runs/{run_id}/events", headers=headers
        ) as answer:
            assert answer.status_code == 200
            return await sse(answer)


async def test_events_of_a_run_on_one_replica_read_live_from_another(
    postgres_url: str, servers: Servers, gate: GatedOpenAI
) -> None:
    a, b = await servers.start(postgres_url, 2, event_poll_seconds=0.05, **gate.settings())
    async with client(a) as http_a, client(b) as http_b:
        conv, _ = await create_conversation(http_a)

        async def post_stream() -> list[Event]:
            async with http_a.stream(
                "POST",
                f"/conversations/{conv}/runs",
                json={"prompts": ["hello there"], "agent": PROFILE, "stream": True},
            ) as answer:
                assert answer.status_code == 201
                return await sse(answer)

        posted_task = asyncio.create_task(post_stream())
        held = await gate.arrival("hello there")  # in flight on A now
        run_id = (await http_b.get(f"/conversations/{conv}")).json()["active_run_id"]
        assert run_id is not None

        async with http_b.stream("GET", f"/conversations/{conv}/runs/{run_id}/events") as live:
            assert live.status_code == 200
            lines = live.aiter_lines()
            head = [await anext(lines) for _ in range(3)]  # the first event, from B, mid-run
            assert head[0] == "event: run.started" and head[2] == "id: 1"
            run = (await http_b.get(f"/conversations/{conv}/runs/{run_id}")).json()
            assert run["status"] == "running"  # held at the gate: B read it while it runs
            held.release()
            rest: list[str] = [line async for line in lines]
        posted = await posted_task

    from_b = [(1, "run.started", json.loads(head[1].partition(": ")[2]))]
    fields: dict[str, str] = {}
    for line in rest:
        if line == "":
            if fields:
                from_b.append((int(fields["id"]), fields["event"], json.loads(fields["data"])))
            fields = {}
        else:
            name, _, value = line.partition(": ")
            fields[name] = value

    # complete and in order, the same events with the same ids as A's own POST stream
    assert [s for s, _, _ in posted] == list(range(1, len(posted) + 1))
    assert [(s, e) for s, e, _ in from_b] == [(s, e) for s, e, _ in posted]
    assert [d for _, _, d in from_b[:-1]] == [d for _, _, d in posted[:-1]]
    assert "delta" in [e for _, e, _ in posted] and posted[-1][1] == "run.finished"
    finished = {k: v for k, v in posted[-1][2].items() if k != "context"}
    assert from_b[-1][2] == finished

    # a client that lost its stream after event k resumes from either replica: exactly after k
    for k in (1, len(posted) // 2, len(posted) - 1):
        resumed = await events_of(b, conv, run_id, **{"Last-Event-ID": str(k)})
        assert [(s, e) for s, e, _ in resumed] == [(s, e) for s, e, _ in posted[k:]]
    # after the run ended, from the start, on A
    again = await events_of(a, conv, run_id)
    assert [(s, e) for s, e, _ in again] == [(s, e) for s, e, _ in posted]


# --- webhooks --------------------------------------------------------------------------------


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    answered: int


@dataclass
class Receiver:
    """A webhook endpoint: answers each request with the next status of ``answers`` (then
    200), and records what it got."""

    answers: list[int] = field(default_factory=list)
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            with state.lock:
                status = state.answers.pop(0) if state.answers else 200
                headers = {k.lower(): v for k, v in self.headers.items()}
                state.received.append(Received(headers, body, status))
            self.send_response(status)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hooks"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def cli(database_url: str, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CARRYOVER_")}
    env["CARRYOVER_DATABASE_URL"] = database_url
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def register(database_url: str, url: str, *extra: str) -> str:
    """Register an endpoint for tenant ``default`` with the CLI; its secret. The receivers
    listen on 127.0.0.1: the operator allows that explicitly."""
    out = cli(
        database_url, "webhooks", "add", "--tenant", "default", url, "--allow-private", *extra
    )
    lines = dict(line.split(": ", 1) for line in out.splitlines())
    assert lines["secret"].startswith("whsec_")
    return lines["secret"]


FAST_RETRIES = {"webhook_backoff_seconds": 0.05, "webhook_poll_seconds": 0.05}


async def test_a_webhook_is_signed_retried_after_500s_and_delivered_once(
    postgres_url: str, servers: Servers, receiver: Receiver
) -> None:
    secret = register(postgres_url, receiver.url, "--events", "run.completed")
    receiver.answers = [500, 500]
    [server] = await servers.start(postgres_url, **FAST_RETRIES)
    async with client(server) as http:
        conv, _ = await create_conversation(http)
        ran = await http.post(f"/conversations/{conv}/runs", json={"prompts": ["hi"]})
        assert ran.status_code == 201
        run_id = ran.json()["run_id"]
        record = (await http.get(f"/conversations/{conv}/runs/{run_id}")).json()

    async def delivered() -> str | None:
        out = cli(postgres_url, "webhooks", "deliveries")
        return out if " delivered " in out else None

    table = await eventually(delivered, within=60, what="the delivery to be delivered")
    rows = [line.split() for line in table.splitlines()[1:]]
    assert len(rows) == 1 and rows[0][3:6] == [run_id, "delivered", "3"]

    got = receiver.received
    assert [r.answered for r in got] == [500, 500, 200]  # each attempt, then once accepted
    assert all(verify(secret, r.headers, r.body) for r in got)
    assert len({r.headers["webhook-id"] for r in got}) == 1  # one message, three attempts
    assert len({r.body for r in got}) == 1
    body = json.loads(got[0].body)
    assert body["type"] == "run.completed"
    assert body["data"] == record and "context" not in body["data"]
    # a forged body does not verify
    assert not verify(secret, got[0].headers, got[0].body + b" ")


async def test_a_delivery_survives_a_sigkill_right_after_the_outcome_commit(
    postgres_url: str, servers: Servers, receiver: Receiver
) -> None:
    secret = register(postgres_url, receiver.url)
    # A commits outcomes (and their outbox rows) but sends nothing: the kill lands between
    # the commit and the delivery, every time.
    [a] = await servers.start(postgres_url, webhook_worker="false")
    async with client(a) as http:
        conv, _ = await create_conversation(http)
        ran = await http.post(f"/conversations/{conv}/runs", json={"prompts": ["/fail"]})
        assert ran.status_code == 201 and ran.json()["status"] == "failed"
        run_id = ran.json()["run_id"]
    assert " pending " in cli(postgres_url, "webhooks", "deliveries")
    a.kill()
    assert receiver.received == []

    [b] = await servers.start(postgres_url, **FAST_RETRIES)

    async def arrived() -> Received | None:
        with receiver.lock:
            return receiver.received[0] if receiver.received else None

    got = await eventually(arrived, within=60, what="the delivery from B")
    assert verify(secret, got.headers, got.body)
    body = json.loads(got.body)
    assert body["type"] == "run.failed" and body["data"]["run_id"] == run_id
    async with client(b) as http:
        record = (await http.get(f"/conversations/{conv}/runs/{run_id}")).json()
    assert body["data"] == record
