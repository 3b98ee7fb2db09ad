"""A queued run is admitted when its turn comes, as a direct start is (docs/runs.md "Queued
runs", docs/operations.md "Quotas"), through HTTP on both engines: the tenant's quota and the
client-tool pre-check on the context it would run on. A refused run never runs: a request that
waits for it answers the direct start's problem (429 ``quota-exceeded`` with its headers, 409
``tool-results-required``, 422 ``unexpected-tool-answer``) and leaves no record; a background
run ends ``failed`` with that problem, and the queue goes on. ``carryover_queued_runs`` counts
the database's queued runs at each scrape.

Runs are held in flight with :class:`GatedProvider`, on a :class:`ManualClock` that never moves
(the runs-per-minute window is exact); nothing is timed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.api.app import create_app
from app.clock import ManualClock
from app.store.quotas import QuotaStore

from ..fakes.gated import GatedProvider, gated_pool
from ..helpers import assert_problem, until, user_texts
from ..repository import Repository
from .conftest import AppClient, SettingsFactory

ASYNC = {"Prefer": "respond-async"}
TENANT = "default"  # the tenant of a service without API keys
PROBLEM = "https://carryover.dev/problems/"
LOOKUP = {
    "name": "lookup",
    "description": "Look a word up in the application's dictionary",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
}


@pytest.fixture
def gate() -> GatedProvider:
    """Holds the provider request of every run whose last user text starts with "held"."""
    return GatedProvider(hold=lambda prompt: prompt.startswith("held"))


@pytest.fixture
async def client(make_settings: SettingsFactory, gate: GatedProvider) -> AsyncIterator[AppClient]:
    settings = make_settings(webhook_worker=False)
    app = create_app(settings, agents=gated_pool(settings, gate), clock=ManualClock())
    http = AppClient(transport=httpx.ASGITransport(app=app), base_url="http://carryover.test")
    http.app = app
    async with app.router.lifespan_context(app), http:
        try:
            assert (await http.post("/conversations", json={"id": "conv"})).status_code == 201
            yield http
        finally:
            gate.open()


def quotas(client: AppClient) -> QuotaStore:
    svc: Any = client.app.state.services
    return QuotaStore(svc.engine, svc.runs.clock)


def repo(client: AppClient) -> Any:
    return Repository.of(client.app.state.services.stores)


async def post_run(
    client: AppClient, prompt: str | None, headers: dict[str, str] | None = None, **body: Any
) -> httpx.Response:
    if prompt is not None:
        body["prompts"] = [prompt, *body.get("prompts", [])]
    return await client.post("/conversations/conv/runs", json=body, headers=headers or {})


async def records(client: AppClient, conv: str = "conv") -> dict[str, dict[str, Any]]:
    listed = await client.get(f"/conversations/{conv}/runs", params={"limit": 200})
    assert listed.status_code == 200
    return {r["run_id"]: r for r in listed.json()["items"]}


async def queued_count(client: AppClient, count: int) -> None:
    async def probe() -> bool | None:
        found = sum(r["status"] == "queued" for r in (await records(client)).values())
        return True if found >= count else None

    await until(probe, what=f"{count} queued run(s)")


async def ended(client: AppClient, run_id: str) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        record: dict[str, Any] = (await client.get(f"/conversations/conv/runs/{run_id}")).json()
        return None if record["status"] in ("queued", "running") else record

    return await until(probe, what=f"run {run_id} to end")


async def queued_metric(client: AppClient) -> dict[str, float]:
    """``carryover_queued_runs`` by kind, as /metrics answers it."""
    text = (await client.get("/metrics")).text
    return {
        sample.labels["kind"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "carryover_queued_runs"
        for sample in family.samples
    }


async def stored_texts(client: AppClient) -> list[str]:
    context = (await client.get("/conversations/conv/context")).json()
    return user_texts(context["messages"])


def prompt_of(record: dict[str, Any]) -> str:
    text: str = record["prompts"][0]["content"][0]["text"]
    return text


async def event_names(client: AppClient, run_id: str) -> list[str]:
    answer = await client.get(f"/conversations/conv/runs/{run_id}/events")
    assert answer.status_code == 200, answer.text
    return [
        line.removeprefix("event: ")
        for line in answer.text.splitlines()
        if line.startswith("event: ")
    ]


def assert_refused_record(record: dict[str, Any], slug: str, code: str) -> None:
    """A background run refused when its turn came: failed, nothing of it stored."""
    assert record["status"] == "failed", record
    assert record["stored"] is False and record["etag"] is None
    assert record["new_messages"] == [] and record["final"] is None
    assert record["error"]["type"] == PROBLEM + slug, record["error"]
    assert record["error"]["code"] == code
    assert record["finished_at"] is not None


async def assert_usage_matches_the_records(
    client: AppClient, started: int, convs: tuple[str, ...] = ("conv",)
) -> dict[str, Any]:
    usage: dict[str, Any] = (await client.get("/usage")).json()
    [today] = usage["days"]
    all_records = [r for conv in convs for r in (await records(client, conv)).values()]
    assert today["runs"] == started
    assert today["input_tokens"] == sum(r["usage"]["input_tokens"] for r in all_records)
    assert today["output_tokens"] == sum(r["usage"]["output_tokens"] for r in all_records)
    assert usage["quota"]["tokens_today"] == today["input_tokens"] + today["output_tokens"]
    return usage


# --- quotas ---------------------------------------------------------------------------------


async def test_runs_per_minute_admits_exactly_n_of_a_queue_of_background_and_waiting_runs(
    client: AppClient, gate: GatedProvider
) -> None:
    """3 runs per minute; one run in flight and five queued behind it, background and waiting
    in turn: the first two queued start (3 in the window), the other three are refused when
    their turn comes — the waiting one answers 429 and leaves no record, the background ones
    end failed — and the queue is empty."""
    await quotas(client).set(TENANT, runs_per_minute=3)
    first = asyncio.create_task(post_run(client, "held first"))
    await gate.arrival("held first")

    kinds = {1: "background", 2: "waiting", 3: "background", 4: "waiting", 5: "background"}
    background: dict[int, str] = {}
    waiting: dict[int, asyncio.Task[httpx.Response]] = {}
    for n, kind in kinds.items():
        if kind == "background":
            accepted = await post_run(client, f"queued {n}", ASYNC, if_busy="enqueue")
            assert accepted.status_code == 202, accepted.text
            assert accepted.json()["status"] == "queued"
            background[n] = accepted.json()["run_id"]
        else:
            waiting[n] = asyncio.create_task(post_run(client, f"queued {n}", if_busy="enqueue"))
        await queued_count(client, n)  # in this arrival order
    assert await queued_metric(client) == {"background": 3.0, "waiting": 2.0}

    gate.release_all()
    assert (await first).status_code == 201
    answered = {n: await task for n, task in waiting.items()}
    assert answered[2].status_code == 201 and answered[2].json()["status"] == "completed"
    refused = assert_problem(answered[4], 429, "quota-exceeded")
    assert (refused["limit"], refused["quota"], refused["used"]) == ("runs_per_minute", 3, 3)
    assert answered[4].headers["retry-after"] == "61"  # the clock stands still
    assert answered[4].headers["ratelimit-policy"] == '"runs-per-minute";q=3;w=60'
    assert answered[4].headers["ratelimit"] == '"runs-per-minute";r=0;t=61'

    ends = {n: await ended(client, run_id) for n, run_id in background.items()}
    assert ends[1]["status"] == "completed"
    for n in (3, 5):
        assert_refused_record(ends[n], "run-quota-exceeded", "quota_exceeded")
        assert "runs per minute" in ends[n]["error"]["detail"]
        assert await event_names(client, background[n]) == ["run.finished"]

    # exactly three ran, each once, in arrival order; the refused waiter left no record
    kept = await records(client)
    assert sorted(prompt_of(r) for r in kept.values()) == [
        "held first",
        "queued 1",
        "queued 2",
        "queued 3",
        "queued 5",
    ]
    assert [r["status"] for r in kept.values()].count("completed") == 3
    assert await stored_texts(client) == ["held first", "queued 1", "queued 2"]
    assert [h.prompt for h in gate.held] == ["held first"]
    assert (await client.get("/conversations/conv")).json()["active_run_id"] is None
    assert await queued_metric(client) == {"background": 0.0, "waiting": 0.0}
    usage = await assert_usage_matches_the_records(client, started=3)
    assert usage["quota"]["runs_last_minute"] == 3 and usage["quota"]["running"] == 0

    # with the window spent, a run is refused as it arrives: nothing is queued
    late = await post_run(client, "late", ASYNC, if_busy="enqueue")
    assert_problem(late, 429, "quota-exceeded")
    assert late.headers["ratelimit"] == '"runs-per-minute";r=0;t=61'
    assert len(await records(client)) == 5


async def test_a_run_refused_when_its_turn_comes_ends_like_any_run_for_webhooks_and_keys(
    client: AppClient, gate: GatedProvider
) -> None:
    """The background run refused at its turn: ``run.failed`` is delivered, and its
    Idempotency-Key answers its record."""
    hook = await repo(client).add_webhook(TENANT, "http://hooks.test/", ["run.failed"])
    first = asyncio.create_task(post_run(client, "held first"))
    await gate.arrival("held first")
    key = {"Idempotency-Key": "queued-one", **ASYNC}
    accepted = await post_run(client, "queued", key, if_busy="enqueue")
    assert accepted.status_code == 202 and accepted.json()["status"] == "queued"
    run_id = accepted.json()["run_id"]
    await quotas(client).set(TENANT, runs_per_minute=1)  # spent by the run in flight
    gate.release_all()
    await first
    record = await ended(client, run_id)
    assert_refused_record(record, "run-quota-exceeded", "quota_exceeded")
    deliveries = await repo(client).list_deliveries(webhook_id=hook.id)
    assert [(d.run_id, d.event) for d in deliveries] == [(run_id, "run.failed")]
    replay = await post_run(client, "queued", key, if_busy="enqueue")
    assert replay.status_code == 200 and replay.headers["idempotent-replayed"] == "true"
    assert replay.json()["run_id"] == run_id and replay.json()["status"] == "failed"


async def test_tokens_per_day_spent_by_the_run_ahead_refuse_the_queue(
    client: AppClient, gate: GatedProvider
) -> None:
    await quotas(client).set(TENANT, tokens_per_day=1)  # the first run overshoots it
    first = asyncio.create_task(post_run(client, "held first"))
    await gate.arrival("held first")
    accepted = await post_run(client, "queued 1", ASYNC, if_busy="enqueue")
    assert accepted.status_code == 202 and accepted.json()["status"] == "queued"
    waiter = asyncio.create_task(post_run(client, "queued 2", if_busy="enqueue"))
    await queued_count(client, 2)
    gate.release_all()
    ran = (await first).json()
    assert ran["status"] == "completed"
    spent = ran["usage"]["input_tokens"] + ran["usage"]["output_tokens"]

    refused = assert_problem(await waiter, 429, "quota-exceeded")
    assert (refused["limit"], refused["used"]) == ("tokens_per_day", spent)
    record = await ended(client, accepted.json()["run_id"])
    assert_refused_record(record, "run-quota-exceeded", "quota_exceeded")
    assert "tokens per day" in record["error"]["detail"]
    await assert_usage_matches_the_records(client, started=1)
    assert len(await records(client)) == 2
    # spent: refused as it arrives
    assert_problem(await post_run(client, "late", ASYNC, if_busy="enqueue"), 429, "quota-exceeded")
    assert_problem(await post_run(client, "late", if_busy="wait"), 429, "quota-exceeded")
    assert len(await records(client)) == 2


async def test_a_queued_run_waits_out_the_tenants_concurrent_runs(
    client: AppClient, gate: GatedProvider
) -> None:
    """concurrent_runs 1: a run on another conversation holds the tenant's place; a queued run
    (background or waiting) stays queued until it ends, then runs — not refused. A request that
    asked not to wait (``if_busy: reject``) is refused at once, as a direct start is."""
    await quotas(client).set(TENANT, concurrent_runs=1)
    await client.post("/conversations", json={"id": "other"})
    elsewhere = asyncio.create_task(
        client.post("/conversations/other/runs", json={"prompts": ["held elsewhere"]})
    )
    await gate.arrival("held elsewhere")
    accepted = await post_run(client, "queued 1", ASYNC, if_busy="enqueue")
    assert accepted.status_code == 202 and accepted.json()["status"] == "queued"
    waiter = asyncio.create_task(post_run(client, "queued 2", if_busy="enqueue"))
    await queued_count(client, 2)
    rejected = await post_run(client, "now", ASYNC)  # if_busy: reject, and a queue: 409 first
    assert_problem(rejected, 409, "run-in-progress")
    await client.post("/conversations", json={"id": "third"})
    now = await client.post("/conversations/third/runs", json={"prompts": ["x"]}, headers=ASYNC)
    problem = assert_problem(now, 429, "quota-exceeded")
    assert problem["limit"] == "concurrent_runs" and now.headers["retry-after"] == "1"
    assert (await records(client)).keys() >= {accepted.json()["run_id"]}
    assert await queued_metric(client) == {"background": 1.0, "waiting": 1.0}

    gate.release_all()
    assert (await elsewhere).status_code == 201
    assert (await ended(client, accepted.json()["run_id"]))["status"] == "completed"
    answer = await waiter
    assert answer.status_code == 201 and answer.json()["status"] == "completed"
    assert await stored_texts(client) == ["queued 1", "queued 2"]
    await assert_usage_matches_the_records(client, started=3, convs=("conv", "other"))


# --- client tools: the pre-check when the turn comes ----------------------------------------


def tool_result(call_id: str, text: str) -> dict[str, Any]:
    return {
        "type": "tool_result",
        "tool_call_id": call_id,
        "tool_name": "lookup",
        "content": [{"type": "text", "text": text}],
        "is_error": False,
    }


async def pause(client: AppClient) -> str:
    """A run that calls the client tool ``lookup`` and pauses; the pending call's id."""
    paused = await post_run(client, '/tool lookup {"word": "carry"}', tools=[LOOKUP])
    assert paused.status_code == 201 and paused.json()["status"] == "requires_action"
    call_id: str = paused.json()["required_action"]["tool_calls"][0]["id"]
    return call_id


async def test_a_queued_answer_to_a_call_answered_ahead_of_it_is_refused_at_its_turn(
    client: AppClient, gate: GatedProvider
) -> None:
    """The conversation awaits call X; a run answering X is in flight, and two more answering
    X queue behind it (waiting, background). When their turn comes X is answered: the waiter
    gets the direct start's 422, the background run ends failed with it; nothing ran twice."""
    call = await pause(client)
    answer = tool_result(call, "to bear")
    first = asyncio.create_task(post_run(client, None, prompts=[answer, "held next"]))
    await gate.arrival("held next")
    waiter = asyncio.create_task(post_run(client, None, prompts=[answer], if_busy="enqueue"))
    await queued_count(client, 1)
    accepted = await post_run(client, None, ASYNC, prompts=[answer], if_busy="enqueue")
    assert accepted.status_code == 202 and accepted.json()["status"] == "queued"
    gate.release_all()
    assert (await first).json()["status"] == "completed"

    refused = assert_problem(await waiter, 422, "unexpected-tool-answer")
    assert refused["tool_call_id"] == call
    record = await ended(client, accepted.json()["run_id"])
    assert_refused_record(record, "run-unexpected-tool-answer", "unexpected_tool_answer")
    assert len(await records(client)) == 3  # the pause, the answer, the refused background run
    context = (await client.get("/conversations/conv/context")).json()
    assert [m["type"] for m in context["messages"]].count("tool_result") == 1


def hold_tool_calls(gate: GatedProvider) -> None:
    """From now on the gate holds the runs whose prompt is a ``/tool`` directive."""
    gate.hold = lambda prompt: prompt.startswith("/tool")


async def test_a_queued_run_that_leaves_a_new_pause_unanswered_is_refused_at_its_turn(
    client: AppClient, gate: GatedProvider
) -> None:
    """The run ahead pauses (call Y): a queued run with plain prompts leaves Y unanswered —
    409 for a waiter, failed for a background run."""
    hold_tool_calls(gate)
    first = asyncio.create_task(
        post_run(client, '/tool lookup {"word": "x"}', tools=[LOOKUP], if_busy="enqueue")
    )
    await gate.arrival()
    waiter = asyncio.create_task(post_run(client, "plain", if_busy="enqueue"))
    await queued_count(client, 1)
    accepted = await post_run(client, "plain too", ASYNC, if_busy="enqueue")
    assert accepted.status_code == 202 and accepted.json()["status"] == "queued"
    gate.release_all()
    paused = (await first).json()
    assert paused["status"] == "requires_action"
    [call] = paused["required_action"]["tool_calls"]

    refused = assert_problem(await waiter, 409, "tool-results-required")
    assert refused["unanswered"] == [call["id"]]
    record = await ended(client, accepted.json()["run_id"])
    assert_refused_record(record, "run-tool-results-required", "tool_results_required")
    assert (await client.get("/conversations/conv")).json()["pending_tool_calls"] == [call]
    assert len(await records(client)) == 2  # the pause and the refused background run


async def test_a_queued_background_run_keeps_its_client_tools_and_answers(
    client: AppClient, gate: GatedProvider
) -> None:
    """A background run queued behind the run that will pause, with the answer to the call
    that run will make (the echo provider's call ids are known ahead) and client tools: it is
    checked and run with the request it was given, by whichever claim starts it."""
    hold_tool_calls(gate)
    first = asyncio.create_task(
        post_run(client, '/tool lookup {"word": "x"}', tools=[LOOKUP], if_busy="enqueue")
    )
    await gate.arrival()
    # the call the first run will make: after its prompt (1 message), the echo call id
    answer = tool_result("echo_call_1", "an answer")
    accepted = await post_run(
        client, None, ASYNC, prompts=[answer, "and then?"], tools=[LOOKUP], if_busy="enqueue"
    )
    assert accepted.status_code == 202 and accepted.json()["status"] == "queued"
    gate.release_all()
    paused = (await first).json()
    assert paused["status"] == "requires_action"
    assert paused["required_action"]["tool_calls"][0]["id"] == "echo_call_1"
    record = await ended(client, accepted.json()["run_id"])
    assert record["status"] == "completed", record
    assert (await client.get("/conversations/conv")).json()["pending_tool_calls"] == []
    context = (await client.get("/conversations/conv/context")).json()
    kinds = [m["type"] for m in context["messages"]]
    assert kinds == ["user", "assistant", "tool_result", "user", "assistant"]


async def test_bad_client_tools_are_refused_as_the_run_arrives(
    client: AppClient, gate: GatedProvider
) -> None:
    first = asyncio.create_task(post_run(client, "held first"))
    await gate.arrival("held first")
    bad = {**LOOKUP, "parameters": {"type": "string"}}
    refused = await post_run(client, "x", ASYNC, tools=[bad], if_busy="enqueue")
    assert_problem(refused, 422, "validation-error")
    assert len(await records(client)) == 1  # nothing queued
    gate.release_all()
    await first
