"""Background mode, queued runs and fair waiting with real ``carryover serve`` processes on one
database (docs/runs.md): a background run polled to completion from another server, five
enqueued background runs in submission order (also when the process running the queue is
SIGKILLed mid-way: none lost, none run twice), cancelling a queued run from another server,
waiters served in arrival order across servers, Idempotency-Key with respond-async."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import httpx
import pytest

from ..fakes.gated_http import PROFILE, GatedOpenAI
from ..helpers import HANG_GUARD_SECONDS, assert_problem, user_texts
from .harness import (
    Server,
    Servers,
    all_runs,
    all_transcript,
    client,
    create_conversation,
    eventually,
    run_record,
    stored_context,
)

ASYNC = {"Prefer": "respond-async"}


async def submit(
    server: Server, conv: str, prompt: str, headers: dict[str, str] | None = None, **extra: Any
) -> httpx.Response:
    async with client(server) as http:
        return await http.post(
            f"/conversations/{conv}/runs",
            json={"prompts": [prompt], "agent": PROFILE, **extra},
            headers=headers or {},
        )


async def ends(http: httpx.AsyncClient, conv: str, run_id: str) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        record = await run_record(http, conv, run_id)
        return None if record["status"] in ("queued", "running") else record

    return await eventually(probe, within=HANG_GUARD_SECONDS, what=f"run {run_id} to end")


async def queued(http: httpx.AsyncClient, conv: str, count: int = 1) -> None:
    async def probe() -> bool | None:
        statuses = [r["status"] for r in await all_runs(http, conv)]
        return True if statuses.count("queued") >= count else None

    await eventually(probe, within=HANG_GUARD_SECONDS, what=f"{count} queued run(s)")


def prompt_of(record: dict[str, Any]) -> str:
    text: str = record["prompts"][0]["content"][0]["text"]
    return text


async def test_a_background_run_is_polled_to_completion_from_another_server(
    postgres_url: str, servers: Servers, gate: GatedOpenAI
) -> None:
    a, b = await servers.start(postgres_url, 2, **gate.settings())
    async with client(b) as http:
        conv, _ = await create_conversation(http)
        accepted = await submit(a, conv, "in the background", ASYNC)
        assert accepted.status_code == 202, accepted.text
        assert accepted.headers["preference-applied"] == "respond-async"
        assert accepted.json()["status"] == "running"
        held = await gate.arrival("in the background")  # the POST has been answered already
        assert (await http.get(accepted.headers["location"])).json()["status"] == "running"
        held.release()
        record = await ends(http, conv, accepted.json()["run_id"])
        assert record["status"] == "completed" and record["stored"] is True
        context, etag = await stored_context(http, conv)
        assert user_texts(context["messages"]) == ["in the background"]
        assert etag == record["etag"]


@pytest.mark.parametrize("engine", ["postgresql", "sqlite"])
async def test_five_enqueued_background_runs_complete_in_submission_order(
    engine: str, postgres_url: str, sqlite_url: str, servers: Servers, gate: GatedOpenAI
) -> None:
    url = postgres_url if engine == "postgresql" else sqlite_url
    [a] = await servers.start(url, **gate.settings())
    prompts = [f"queued {n}" for n in range(5)]
    async with client(a) as http:
        conv, _ = await create_conversation(http)
        ids = []
        for prompt in prompts:
            answer = await submit(a, conv, prompt, ASYNC, if_busy="enqueue")
            assert answer.status_code == 202, answer.text
            ids.append(answer.json()["run_id"])
        assert [r["status"] for r in await all_runs(http, conv)] == ["running"] + ["queued"] * 4
        await gate.release_in_order(5)
        records = [await ends(http, conv, run_id) for run_id in ids]
        assert [r["status"] for r in records] == ["completed"] * 5
        for before, after in itertools.pairwise(records):
            assert after["base_etag"] == before["etag"]  # on the context its predecessor left
        context, _ = await stored_context(http, conv)
        assert user_texts(context["messages"]) == prompts
        assert [h.prompt for h in gate.held] == prompts  # each asked the model once


@pytest.mark.parametrize("engine", ["postgresql", "sqlite"])
async def test_enqueued_runs_go_on_when_the_process_running_the_queue_is_killed(
    engine: str, postgres_url: str, sqlite_url: str, servers: Servers, gate: GatedOpenAI
) -> None:
    """Five background runs queued on A; A is SIGKILLed while the third is in flight. B (on
    PostgreSQL another server, started only then so that every run so far ran on A; on SQLite
    A started again) finds the dead run by its lease, and runs the rest of the queue in order:
    none lost, none run twice."""
    url = postgres_url if engine == "postgresql" else sqlite_url
    [a] = await servers.start(url, **gate.settings())
    prompts = [f"queued {n}" for n in range(5)]
    async with client(a) as http:
        conv, _ = await create_conversation(http)
        ids = []
        for prompt in prompts:
            answer = await submit(a, conv, prompt, ASYNC, if_busy="enqueue")
            assert answer.status_code == 202, answer.text
            ids.append(answer.json()["run_id"])
        await gate.release_in_order(2)
        await gate.arrival("queued 2")  # in flight on A
    if engine == "postgresql":
        [b] = await servers.start(url, **gate.settings())
        a.kill()
    else:
        a.kill()
        b = await servers.restart(a)
    async with client(b) as http:
        (await gate.arrival("queued 3")).release()
        (await gate.arrival("queued 4")).release()
        records = [await ends(http, conv, run_id) for run_id in ids]
        assert [r["status"] for r in records] == [
            "completed",
            "completed",
            "interrupted",  # it was in flight when its process died: nothing of it stored
            "completed",
            "completed",
        ]
        assert records[3]["base_etag"] == records[1]["etag"]
        assert records[4]["base_etag"] == records[3]["etag"]
        survivors = [p for p in prompts if p != "queued 2"]
        context, _ = await stored_context(http, conv)
        assert user_texts(context["messages"]) == survivors
        transcript = await all_transcript(http, conv)
        admitted = [e["body"] for e in transcript if e["kind"] == "prompt"]
        assert user_texts(admitted) == survivors  # each exactly once
        assert [h.prompt for h in gate.held] == prompts  # no run asked the model twice


async def test_cancelling_a_queued_run_from_another_server(
    postgres_url: str, servers: Servers, gate: GatedOpenAI
) -> None:
    a, b = await servers.start(postgres_url, 2, **gate.settings())
    async with client(b) as http:
        conv, _ = await create_conversation(http)
        first = await submit(a, conv, "first", ASYNC, if_busy="enqueue")
        await gate.arrival("first")
        doomed = (await submit(a, conv, "never", ASYNC, if_busy="enqueue")).json()
        last = (await submit(a, conv, "last", ASYNC, if_busy="enqueue")).json()
        cancelled = await http.post(f"/conversations/{conv}/runs/{doomed['run_id']}/cancel")
        assert cancelled.status_code == 202 and cancelled.json()["status"] == "cancelled"
        again = await http.post(f"/conversations/{conv}/runs/{doomed['run_id']}/cancel")
        assert_problem(again, 409, "run-not-active")
        await gate.release_in_order(2)  # "first", then the next that reaches the model: "last"
        assert (await ends(http, conv, first.json()["run_id"]))["status"] == "completed"
        assert (await ends(http, conv, last["run_id"]))["status"] == "completed"
        record = await run_record(http, conv, doomed["run_id"])
        assert (record["status"], record["stored"]) == ("cancelled", False)
        context, _ = await stored_context(http, conv)
        assert user_texts(context["messages"]) == ["first", "last"]
        assert [h.prompt for h in gate.held] == ["first", "last"]


async def test_waiters_on_two_servers_are_served_in_arrival_order(
    postgres_url: str, servers: Servers, gate: GatedOpenAI
) -> None:
    """Two clients alternating ``if_busy: wait`` runs, one per server: each one's next request
    arrives while the other's run holds the conversation; neither gets a 409."""
    a, b = await servers.start(postgres_url, 2, **gate.settings())
    rounds = 3
    answers: list[httpx.Response] = []
    async with client(a) as http:
        conv, _ = await create_conversation(http)

        async def alternate(server: Server, name: str) -> None:
            for n in range(rounds):
                answers.append(await submit(server, conv, f"{name}{n}", if_busy="wait"))

        order = [f"{name}{n}" for n in range(rounds) for name in "ab"]
        first = asyncio.create_task(alternate(a, "a"))
        await gate.arrival("a0")
        second = asyncio.create_task(alternate(b, "b"))
        for k, prompt in enumerate(order):
            held = await gate.arrival(prompt)
            assert [h.prompt for h in gate.held] == order[: k + 1]  # nobody overtook
            if k + 1 < len(order):
                await queued(http, conv)  # the other client waits in the queue now
            held.release()
        await asyncio.wait_for(asyncio.gather(first, second), HANG_GUARD_SECONDS)
    assert [r.status_code for r in answers] == [201] * len(order), [r.text for r in answers]


async def test_idempotency_key_with_respond_async_across_servers(
    postgres_url: str, servers: Servers, gate: GatedOpenAI
) -> None:
    a, b = await servers.start(postgres_url, 2, **gate.settings())
    headers = {**ASYNC, "Idempotency-Key": "background-1"}
    async with client(b) as http:
        conv, _ = await create_conversation(http)
        first = await submit(a, conv, "once", headers)
        assert first.status_code == 202
        run_id = first.json()["run_id"]
        await gate.arrival("once")
        repeat = await submit(b, conv, "once", headers)
        assert repeat.status_code == 202 and repeat.json()["run_id"] == run_id
        assert repeat.headers["idempotent-replayed"] == "true"
        gate.release_all()
        await ends(http, conv, run_id)
        final = await submit(b, conv, "once", headers)
        assert final.status_code == 200 and final.json()["status"] == "completed"
        assert final.json()["run_id"] == run_id
        assert [r["run_id"] for r in await all_runs(http, conv)] == [run_id]
        assert [h.prompt for h in gate.held] == ["once"]
