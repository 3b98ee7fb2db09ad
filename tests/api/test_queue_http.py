"""Background mode, queued runs and fair waiting through HTTP, in process, on both engines
(docs/runs.md): ``Prefer: respond-async`` → 202, ``if_busy: "enqueue"`` in arrival order,
cancelling a queued run, ``if_busy: "wait"`` served in arrival order, Idempotency-Key with
respond-async. Runs are held in flight with :class:`GatedProvider`; nothing is timed."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from ..fakes.gated import GatedProvider, gated_pool
from ..helpers import HANG_GUARD_SECONDS, assert_problem, until, user_texts
from .conftest import AppClient, SettingsFactory

ASYNC = {"Prefer": "respond-async"}


@pytest.fixture
def gate() -> GatedProvider:
    """Holds the provider request of every run whose prompt starts with "held"."""
    return GatedProvider(hold=lambda prompt: prompt.startswith("held"))


@pytest.fixture
async def client(
    app_factory: Callable[..., Any], make_settings: SettingsFactory, gate: GatedProvider
) -> AsyncIterator[AppClient]:
    async with app_factory(agents=gated_pool(make_settings(), gate)) as http:
        try:
            created = await http.post("/conversations", json={"id": "conv"})
            assert created.status_code == 201
            yield http
        finally:
            gate.open()


async def post_run(
    client: AppClient, prompt: str, headers: dict[str, str] | None = None, **options: Any
) -> httpx.Response:
    return await client.post(
        "/conversations/conv/runs", json={"prompts": [prompt], **options}, headers=headers or {}
    )


async def runs(client: AppClient) -> list[dict[str, Any]]:
    listed = await client.get("/conversations/conv/runs", params={"limit": 200})
    assert listed.status_code == 200
    items: list[dict[str, Any]] = listed.json()["items"]
    return items


async def ended(client: AppClient, run_id: str) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        record: dict[str, Any] = (await client.get(f"/conversations/conv/runs/{run_id}")).json()
        return None if record["status"] in ("queued", "running") else record

    return await until(probe, what=f"run {run_id} to end")


async def queued_count(client: AppClient, count: int) -> None:
    async def probe() -> bool | None:
        return True if sum(r["status"] == "queued" for r in await runs(client)) >= count else None

    await until(probe, what=f"{count} queued run(s)")


async def stored_texts(client: AppClient) -> list[str]:
    context = (await client.get("/conversations/conv/context")).json()
    return user_texts(context["messages"])


async def test_a_background_run_answers_202_and_is_polled_to_completion(
    client: AppClient, gate: GatedProvider
) -> None:
    accepted = await post_run(client, "held in the background", ASYNC, stream=True)
    assert accepted.status_code == 202, accepted.text
    assert accepted.headers["preference-applied"] == "respond-async"
    body = accepted.json()
    assert body["status"] == "running" and "context" not in body
    assert accepted.headers["location"] == f"/conversations/conv/runs/{body['run_id']}"
    assert accepted.headers["content-type"].startswith("application/json")  # not a stream

    held = await gate.arrival("held in the background")  # it runs with no client waiting
    polled = (await client.get(accepted.headers["location"])).json()
    assert polled["status"] == "running"
    held.release()
    record = await ended(client, body["run_id"])
    assert record["status"] == "completed" and record["stored"] is True
    assert await stored_texts(client) == ["held in the background"]


async def test_enqueued_background_runs_run_in_submission_order_on_their_predecessors_context(
    client: AppClient, gate: GatedProvider
) -> None:
    first = await post_run(client, "held 0", ASYNC, if_busy="enqueue")
    assert first.status_code == 202 and first.json()["status"] == "running"
    await gate.arrival("held 0")
    ids = [first.json()["run_id"]]
    for n in range(1, 5):
        queued = await post_run(client, f"held {n}", ASYNC, if_busy="enqueue")
        assert queued.status_code == 202, queued.text
        assert queued.json()["status"] == "queued"
        assert queued.headers["preference-applied"] == "respond-async"
        ids.append(queued.json()["run_id"])
    assert [r["status"] for r in await runs(client)] == ["running"] + ["queued"] * 4
    # a request that would overtake the queue is refused, not started
    assert_problem(await post_run(client, "me first"), 409, "run-in-progress")

    for n in range(5):  # one at a time, in the order they were submitted
        held = await gate.arrival(count=n + 1)
        assert held.prompt == f"held {n}"
        held.release()
    records = [await ended(client, run_id) for run_id in ids]
    assert [r["status"] for r in records] == ["completed"] * 5
    # each ran on the context its predecessor left
    for before, after in itertools.pairwise(records):
        assert after["base_etag"] == before["etag"]
    assert await stored_texts(client) == [f"held {n}" for n in range(5)]
    assert [h.prompt for h in gate.held] == [f"held {n}" for n in range(5)]  # none ran twice


async def test_a_background_wait_request_is_queued_like_enqueue(
    client: AppClient, gate: GatedProvider
) -> None:
    await post_run(client, "held first", ASYNC)
    await gate.arrival("held first")
    queued = await post_run(client, "later", ASYNC, if_busy="wait")
    assert queued.status_code == 202 and queued.json()["status"] == "queued"
    gate.release_all()
    assert (await ended(client, queued.json()["run_id"]))["status"] == "completed"


async def test_an_enqueued_run_without_respond_async_waits_and_answers_as_a_run(
    client: AppClient, gate: GatedProvider
) -> None:
    running = asyncio.create_task(post_run(client, "held first"))
    await gate.arrival("held first")
    waiting = asyncio.create_task(post_run(client, "then me", if_busy="enqueue"))
    await queued_count(client, 1)
    assert not waiting.done()
    gate.release_all()
    first, second = (await running).json(), await waiting
    assert second.status_code == 201, second.text
    body = second.json()
    assert body["status"] == "completed" and body["base_etag"] == first["etag"]
    assert second.headers["etag"] == body["etag"]
    assert user_texts(body["context"]["messages"]) == ["held first", "then me"]


async def test_cancelling_a_queued_run_ends_it_cancelled_without_running(
    client: AppClient, gate: GatedProvider
) -> None:
    running = await post_run(client, "held first", ASYNC)
    await gate.arrival("held first")
    doomed = (await post_run(client, "held never", ASYNC, if_busy="enqueue")).json()
    kept = (await post_run(client, "held later", ASYNC, if_busy="enqueue")).json()
    waiter = asyncio.create_task(post_run(client, "held waiting", if_busy="enqueue"))
    await queued_count(client, 3)

    cancelled = await client.post(f"/conversations/conv/runs/{doomed['run_id']}/cancel")
    assert cancelled.status_code == 202, cancelled.text
    assert cancelled.json()["status"] == "cancelled"
    assert cancelled.json()["error"]["type"].endswith("/run-cancelled")
    again = await client.post(f"/conversations/conv/runs/{doomed['run_id']}/cancel")
    assert_problem(again, 409, "run-not-active")
    # the run whose client waits for it: its request answers with the cancelled run
    [waiting] = [
        r for r in await runs(client) if r["prompts"][0]["content"][0]["text"] == "held waiting"
    ]
    await client.post(f"/conversations/conv/runs/{waiting['run_id']}/cancel")
    answered = await asyncio.wait_for(waiter, HANG_GUARD_SECONDS)
    assert answered.status_code == 201 and answered.json()["status"] == "cancelled"

    gate.open()
    assert (await ended(client, running.json()["run_id"]))["status"] == "completed"
    assert (await ended(client, kept["run_id"]))["status"] == "completed"
    record = await ended(client, doomed["run_id"])
    assert (record["status"], record["stored"], record["new_messages"]) == ("cancelled", False, [])
    assert await stored_texts(client) == ["held first", "held later"]
    transcript = (await client.get("/conversations/conv/transcript")).json()["items"]
    assert {e["run_id"] for e in transcript} == {running.json()["run_id"], kept["run_id"]}
    assert [h.prompt for h in gate.held] == ["held first", "held later"]


async def test_waiters_are_served_in_arrival_order(client: AppClient, gate: GatedProvider) -> None:
    """Two clients alternating runs with ``if_busy: wait``: each one's next request arrives
    while the other's run holds the conversation; neither gets a 409, the runs alternate."""
    rounds = 3
    answers: list[httpx.Response] = []

    async def alternate(name: str) -> None:
        for n in range(rounds):
            answers.append(await post_run(client, f"held {name}{n}", if_busy="wait"))

    order = [f"held {name}{n}" for n in range(rounds) for name in "ab"]
    a = asyncio.create_task(alternate("a"))
    await gate.arrival("held a0")
    b = asyncio.create_task(alternate("b"))
    for k, prompt in enumerate(order):
        held = await gate.arrival(prompt)
        assert [h.prompt for h in gate.held] == order[: k + 1]  # nobody overtook
        if k + 1 < len(order):
            await queued_count(client, 1)  # the other client waits in the queue now
        held.release()
    await asyncio.wait_for(asyncio.gather(a, b), HANG_GUARD_SECONDS)
    assert [r.status_code for r in answers] == [201] * len(order)
    assert [h.prompt for h in gate.held] == order


async def test_a_waiter_past_its_bound_gets_409_and_leaves_the_queue(
    app_factory: Callable[..., Any], make_settings: SettingsFactory, gate: GatedProvider
) -> None:
    settings = make_settings(busy_wait_seconds=0)
    async with app_factory(agents=gated_pool(settings, gate), busy_wait_seconds=0) as client:
        try:
            await client.post("/conversations", json={"id": "conv"})
            running = asyncio.create_task(post_run(client, "held"))
            await gate.arrival("held")
            refused = await post_run(client, "waiting", if_busy="wait")
            problem = assert_problem(refused, 409, "run-in-progress")
            assert problem["active_run_id"] != ""
            assert [r["status"] for r in await runs(client)] == ["running"]  # nothing queued
            gate.release_all()
            assert (await running).json()["status"] == "completed"
        finally:
            gate.open()


async def test_idempotency_key_with_respond_async(client: AppClient, gate: GatedProvider) -> None:
    headers = {**ASYNC, "Idempotency-Key": "bg-1"}
    first = await post_run(client, "held once", headers)
    assert first.status_code == 202
    run_id = first.json()["run_id"]
    await gate.arrival("held once")
    repeat = await post_run(client, "held once", headers)
    assert repeat.status_code == 202, repeat.text
    assert repeat.headers["idempotent-replayed"] == "true"
    assert repeat.headers["location"] == first.headers["location"]
    assert repeat.json()["run_id"] == run_id and repeat.json()["status"] == "running"
    gate.release_all()
    await ended(client, run_id)
    final = await post_run(client, "held once", headers)
    assert final.status_code == 200, final.text
    assert final.json()["run_id"] == run_id and final.json()["status"] == "completed"
    assert len(await runs(client)) == 1 and len(gate.held) == 1
    other = await post_run(client, "held another", headers)
    assert_problem(other, 422, "idempotency-key-mismatch")


async def test_if_match_is_checked_on_arrival_not_when_a_queued_run_starts(
    client: AppClient, gate: GatedProvider
) -> None:
    etag = (await client.get("/conversations/conv")).headers["etag"]
    await post_run(client, "held first", ASYNC)
    await gate.arrival("held first")
    stale = await post_run(client, "stale", ASYNC, if_busy="enqueue", **{})
    assert stale.status_code == 202  # no If-Match: accepted
    refused = await client.post(
        "/conversations/conv/runs",
        json={"prompts": ["x"], "if_busy": "enqueue"},
        headers={**ASYNC, "If-Match": '"not-the-etag"'},
    )
    assert_problem(refused, 412, "precondition-failed")
    matching = await client.post(
        "/conversations/conv/runs",
        json={"prompts": ["matching"], "if_busy": "enqueue"},
        headers={**ASYNC, "If-Match": etag},
    )
    assert matching.status_code == 202 and matching.json()["status"] == "queued"
    gate.open()
    record = await ended(client, matching.json()["run_id"])
    assert record["status"] == "completed" and record["base_etag"] != etag
    assert await stored_texts(client) == ["held first", "stale", "matching"]


async def test_a_conversation_with_a_run_and_a_waiter_is_not_deleted_under_them(
    client: AppClient, gate: GatedProvider
) -> None:
    running = asyncio.create_task(post_run(client, "held"))
    await gate.arrival("held")
    waiter = asyncio.create_task(post_run(client, "waiting", if_busy="enqueue"))
    await queued_count(client, 1)
    assert_problem(await client.delete("/conversations/conv"), 409, "run-in-progress")
    gate.release_all()
    assert (await running).json()["status"] == "completed"
    answered = await asyncio.wait_for(waiter, HANG_GUARD_SECONDS)
    assert answered.status_code == 201 and answered.json()["status"] == "completed"
    assert (await client.delete("/conversations/conv")).status_code == 204
