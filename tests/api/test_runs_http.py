"""Runs through HTTP (contract §3, §4): POST …/runs and its answer, Prefer: return=minimal, bare
string prompts, on_failure keep/discard, run records (list, get), compaction now, a run that
conflicts with a PUT during it, busy conversations, cancel, streaming and Idempotency-Key."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from app.api.deps import encode_cursor

from ..fakes.gated import GatedProvider, gated_pool
from ..helpers import HANG_GUARD_SECONDS, assert_problem, user
from .conftest import AppClient, SettingsFactory

PROBLEM = "https://carryover.dev/problems/"
RUN_FIELDS = {
    "run_id",
    "conversation_id",
    "agent",
    "status",
    "stored",
    "etag",
    "base_etag",
    "on_failure",
    "prompts",
    "context",
    "new_messages",
    "final",
    "output_parsed",
    "compactions",
    "usage",
    "error",
    "required_action",  # null unless the run ended requires_action (docs/tools.md)
    "created_at",
    "started_at",
    "finished_at",
    "duration_ms",
    "trace_id",
}


async def create(client: AppClient, conv_id: str = "conv") -> str:
    created = await client.post("/conversations", json={"id": conv_id, "system_prompt": "Hi."})
    assert created.status_code == 201
    etag: str = created.headers["etag"]
    return etag


async def run(
    client: AppClient,
    conv: str,
    *prompts: Any,
    headers: dict[str, str] | None = None,
    **options: Any,
) -> httpx.Response:
    return await client.post(
        f"/conversations/{conv}/runs",
        json={"prompts": list(prompts), **options},
        headers=headers or {},
    )


async def context_of(client: AppClient, conv: str) -> tuple[dict[str, Any], str]:
    got = await client.get(f"/conversations/{conv}/context")
    assert got.status_code == 200
    return got.json(), got.headers["etag"]


def without_context(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != "context"}


# --- POST runs ----------------------------------------------------------------------------


async def test_a_completed_run_answers_201_with_its_record(client: AppClient) -> None:
    base = await create(client)
    ran = await run(client, "conv", "What is nvim?")
    assert ran.status_code == 201
    body = ran.json()
    assert set(body) == RUN_FIELDS
    assert ran.headers["location"] == f"/conversations/conv/runs/{body['run_id']}"
    assert ran.headers["etag"] == body["etag"] != base
    assert body["base_etag"] == base
    assert (body["status"], body["stored"], body["on_failure"], body["agent"]) == (
        "completed",
        True,
        "keep",
        "default",
    )
    assert body["error"] is None
    assert body["prompts"] == [user("What is nvim?")]
    assert [m["type"] for m in body["new_messages"]] == ["user", "assistant"]
    assert body["final"] == body["new_messages"][-1]
    assert body["final"]["content"] == [
        {"type": "text", "text": 'Echo: I saw 1 message. You said: "What is nvim?"'}
    ]
    assert body["compactions"] == []
    assert body["usage"]["output_tokens"] > 0
    assert body["finished_at"] >= body["created_at"] and body["duration_ms"] >= 0

    stored, etag = await context_of(client, "conv")
    assert stored == body["context"] and etag == body["etag"]
    assert stored["system_prompt"] == "Hi."
    assert stored["messages"] == body["new_messages"]


async def test_prefer_return_minimal_leaves_out_the_context(client: AppClient) -> None:
    await create(client)
    full = await run(client, "conv", "one")
    for prefer in (
        "return=minimal",
        "handling=lenient, return=minimal",
        "return=minimal; x=1",
        "RETURN=MINIMAL",
    ):
        minimal = await run(client, "conv", "two", headers={"Prefer": prefer})
        assert minimal.status_code == 201
        body = minimal.json()
        assert "context" not in body, prefer
        assert set(body) == RUN_FIELDS - {"context"}
        assert minimal.headers["etag"] == body["etag"]
        assert body["final"]["type"] == "assistant"
    representation = await run(client, "conv", "three", headers={"Prefer": "return=representation"})
    assert "context" in representation.json() and "context" in full.json()
    # the record is the same either way
    record = (await client.get(minimal.headers["location"])).json()
    assert record == body


async def test_a_bare_string_prompt_is_a_user_message_with_one_text_block(
    client: AppClient,
) -> None:
    await create(client, "bare")
    await create(client, "typed")
    bare = (await run(client, "bare", "What is nvim?", "and vim?")).json()
    typed = (await run(client, "typed", user("What is nvim?"), user("and vim?"))).json()
    assert bare["prompts"] == typed["prompts"] == [user("What is nvim?"), user("and vim?")]
    assert bare["context"] == typed["context"]
    assert bare["final"]["content"] == typed["final"]["content"]
    # mixed, and with an image block only a typed prompt can carry
    image = {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}
    mixed = await run(
        client,
        "bare",
        "plain",
        {"type": "user", "content": [{"type": "text", "text": "look"}, image]},
    )
    assert mixed.json()["prompts"] == [
        user("plain"),
        {"type": "user", "content": [{"type": "text", "text": "look"}, image]},
    ]


async def test_a_failed_run_with_keep_stores_its_context(client: AppClient) -> None:
    await create(client)
    first = await run(client, "conv", "hello")
    ran = await run(client, "conv", "/fail", on_failure="keep")
    assert ran.status_code == 201
    body = ran.json()
    assert (body["status"], body["stored"], body["on_failure"]) == ("failed", True, "keep")
    assert ran.headers["etag"] == body["etag"] != first.headers["etag"]
    assert body["error"]["type"] == PROBLEM + "run-provider-error"
    assert body["error"]["kind"] == "fatal" and body["error"]["provider_status"] == 500
    assert body["final"]["stop_reason"] == "error" and body["final"]["error"]["kind"] == "fatal"
    # the prompt was admitted and stays; the failed attempt is no part of the context
    stored, etag = await context_of(client, "conv")
    assert etag == body["etag"] and stored == body["context"]
    assert stored["messages"][-1] == user("/fail")
    assert stored["messages"][:-1] == first.json()["context"]["messages"]

    record = (await client.get(ran.headers["location"])).json()
    assert record == without_context(body)
    assert record["new_messages"] == [user("/fail"), body["final"]]


async def test_a_failed_run_with_discard_stores_nothing_but_keeps_its_record(
    client: AppClient,
) -> None:
    await create(client)
    first = await run(client, "conv", "hello")
    before, etag_before = await context_of(client, "conv")
    meta_before = (await client.get("/conversations/conv")).json()

    ran = await run(client, "conv", "/fail", on_failure="discard")
    assert ran.status_code == 201
    body = ran.json()
    assert (body["status"], body["stored"], body["on_failure"]) == ("failed", False, "discard")
    assert ran.headers["etag"] == body["etag"] == etag_before == first.headers["etag"]
    assert body["base_etag"] == etag_before
    # the answer still shows what the run returned, the stored context is as before
    assert body["context"]["messages"][-1] == user("/fail")
    after, etag_after = await context_of(client, "conv")
    assert (after, etag_after) == (before, etag_before)
    meta = (await client.get("/conversations/conv")).json()
    assert meta["message_count"] == meta_before["message_count"]
    assert meta["run_count"] == 2

    record = (await client.get(ran.headers["location"])).json()
    assert record["stored"] is False and record["status"] == "failed"
    assert record["etag"] is None and record["base_etag"] == etag_before
    assert record["new_messages"] == [user("/fail"), body["final"]]
    assert record["final"]["stop_reason"] == "error"
    assert record["error"]["kind"] == "fatal"
    # the transcript keeps the discarded run too, its attempt flagged failed
    entries = (await client.get("/conversations/conv/transcript")).json()["items"]
    mine = [e for e in entries if e["run_id"] == body["run_id"]]
    assert [(e["kind"], e["failed"]) for e in mine] == [("prompt", False), ("attempt", True)]


async def test_a_tool_run_records_calls_and_results(client: AppClient) -> None:
    await create(client)
    ran = (await run(client, "conv", '/tool wait {"seconds": 0}')).json()
    kinds = [m["type"] for m in ran["new_messages"]]
    assert kinds == ["user", "assistant", "tool_result", "assistant"]
    call = ran["new_messages"][1]["content"][0]
    assert (call["type"], call["name"], call["arguments"]) == (
        "tool_call",
        "wait",
        '{"seconds": 0}',
    )
    assert ran["new_messages"][2]["tool_call_id"] == call["id"]
    assert ran["final"]["content"][0]["text"].startswith("Tool wait returned")


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"prompts": []}, "body.prompts"),
        ({}, "body.prompts"),
        ({"prompts": [5]}, "body.prompts[0]"),
        ({"prompts": [{"type": "assistant", "content": []}]}, "body.prompts[0]"),
        ({"prompts": ["x"], "on_failure": "ignore"}, "body.on_failure"),
        ({"prompts": ["x"], "if_busy": "queue"}, "body.if_busy"),
        ({"prompts": ["x"], "surprise": True}, "body.surprise"),
        ({"prompts": ["x"], "agent": "no-such-profile"}, "body.agent"),
    ],
)
async def test_requests_that_never_become_runs_are_4xx(
    client: AppClient, body: dict[str, Any], path: str
) -> None:
    etag = await create(client)
    sent = await client.post("/conversations/conv/runs", json=body)
    problem = assert_problem(sent, 422, "validation-error")
    assert problem["errors"][0]["path"].startswith(path), problem
    assert (await client.get("/conversations/conv/runs")).json()["items"] == []
    assert (await context_of(client, "conv"))[1] == etag


async def test_a_run_on_a_missing_conversation_is_404(client: AppClient) -> None:
    assert_problem(await run(client, "ghost", "hi"), 404, "not-found")


# --- run records --------------------------------------------------------------------------


async def test_run_records_list_and_get(client: AppClient) -> None:
    await create(client)
    answers = [
        (await run(client, "conv", "one")).json(),
        (await run(client, "conv", "/fail", on_failure="discard")).json(),
        (await run(client, "conv", "/tool time_now {}")).json(),
        (await run(client, "conv", "/overflow")).json(),
        (await run(client, "conv", "four")).json(),
    ]
    overflowed = answers[3]
    assert overflowed["status"] == "completed"
    assert [c["reason"] for c in overflowed["compactions"]] == ["overflow"]

    items: list[dict[str, Any]] = []
    cursor: str | None = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        page = (await client.get("/conversations/conv/runs", params=params)).json()
        items += page["items"]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert pages == 3
    # oldest first, full records without their context
    assert [r["run_id"] for r in items] == [a["run_id"] for a in answers]
    for listed, answer in zip(items, answers, strict=True):
        assert "context" not in listed
        # a record's etag is its result's: the answer's (the stored state) when it was stored
        expected = without_context(answer) | {"etag": answer["etag"] if answer["stored"] else None}
        assert listed == expected
        got = await client.get(f"/conversations/conv/runs/{answer['run_id']}")
        assert got.status_code == 200 and got.json() == listed
    assert items[3]["compactions"][0]["folded"]  # the compaction record, with what it folded
    assert items[1]["stored"] is False and items[1]["final"]["error"]["kind"] == "fatal"


async def test_run_listing_cursor_and_limit_errors(client: AppClient) -> None:
    await create(client)
    assert_problem(
        await client.get("/conversations/conv/runs", params={"cursor": "zzz"}), 400, "bad-cursor"
    )
    assert_problem(
        await client.get("/conversations/conv/runs", params={"cursor": encode_cursor(3)}),
        400,
        "bad-cursor",
    )
    assert_problem(
        await client.get("/conversations/conv/runs", params={"limit": 201}), 422, "limit-exceeded"
    )
    assert_problem(await client.get("/conversations/ghost/runs"), 404, "not-found")


async def test_get_a_missing_run_is_404(client: AppClient) -> None:
    await create(client)
    await create(client, "other")
    other_run = (await run(client, "other", "x")).json()["run_id"]
    assert_problem(await client.get("/conversations/conv/runs/nope"), 404, "not-found")
    # a run is found only under its own conversation
    assert_problem(await client.get(f"/conversations/conv/runs/{other_run}"), 404, "not-found")


# --- compact ------------------------------------------------------------------------------


async def test_compact_folds_the_history_into_the_summary(client: AppClient) -> None:
    await create(client)
    for prompt in ("one", "two", "three"):
        await run(client, "conv", prompt)
    before, etag = await context_of(client, "conv")

    compacted = await client.post(
        "/conversations/conv/compact", json={"agent": "default"}, headers={"If-Match": etag}
    )
    assert compacted.status_code == 201
    body = compacted.json()
    assert compacted.headers["location"] == f"/conversations/conv/runs/{body['run_id']}"
    assert compacted.headers["etag"] == body["etag"] != etag
    assert (body["status"], body["stored"], body["prompts"], body["new_messages"]) == (
        "completed",
        True,
        [],
        [],
    )
    assert body["final"] is None
    [compaction] = body["compactions"]
    assert compaction["reason"] == "manual" and compaction["previous_summary"] == ""
    assert compaction["summary"] and body["context"]["summary"] == compaction["summary"]
    kept = body["context"]["messages"]
    assert compaction["folded"] + kept == before["messages"]
    assert len(kept) < len(before["messages"])

    stored, current = await context_of(client, "conv")
    assert stored == body["context"] and current == body["etag"]
    record = (await client.get(compacted.headers["location"])).json()
    assert record["compactions"] == body["compactions"]

    # the next run sees the summary
    after = (await run(client, "conv", "four")).json()
    assert "and a summary" in after["final"]["content"][0]["text"]


async def test_compact_with_nothing_to_fold_makes_no_compaction(client: AppClient) -> None:
    etag = await create(client)
    one = {"system_prompt": "", "summary": "", "messages": [user("only message")]}
    put = await client.put("/conversations/conv/context", json=one, headers={"If-Match": etag})
    current = put.headers["etag"]

    compacted = await client.post("/conversations/conv/compact")
    assert compacted.status_code == 201
    body = compacted.json()
    assert body["compactions"] == [] and body["stored"] is False
    assert body["etag"] == compacted.headers["etag"] == current
    assert await context_of(client, "conv") == (one, current)

    empty_etag = await create(client, "empty")
    nothing = (await client.post("/conversations/empty/compact")).json()
    assert nothing["compactions"] == [] and nothing["etag"] == empty_etag


async def test_compact_honours_if_match_and_404(client: AppClient) -> None:
    etag = await create(client)
    await run(client, "conv", "one")
    assert_problem(
        await client.post("/conversations/conv/compact", headers={"If-Match": etag}),
        412,
        "precondition-failed",
    )
    assert_problem(await client.post("/conversations/ghost/compact"), 404, "not-found")
    assert_problem(
        await client.post("/conversations/conv/compact", json={"agent": "nope"}),
        422,
        "validation-error",
    )
    assert_problem(
        await client.post("/conversations/conv/compact", json={"extra": 1}), 422, "validation-error"
    )


# --- runs that overlap --------------------------------------------------------------------


@pytest.fixture
def gate() -> GatedProvider:
    """Holds the provider request of every run whose prompt starts with "held"."""
    return GatedProvider(hold=lambda prompt: prompt.startswith("held"))


@pytest.fixture
async def gated(
    app_factory: Callable[..., Any], make_settings: SettingsFactory, gate: GatedProvider
) -> AsyncIterator[AppClient]:
    """A client on an app whose default agent answers through ``gate``."""
    async with app_factory(agents=gated_pool(make_settings(), gate)) as http:
        try:
            yield http
        finally:
            gate.open()  # nothing stays held past the test


async def held_run(client: AppClient, gate: GatedProvider, conv: str, prompt: str) -> str:
    """The id of the run on ``conv`` whose provider request ``prompt`` is held at the gate."""
    await gate.arrival(prompt)
    meta = (await client.get(f"/conversations/{conv}")).json()
    assert meta["active_run_id"] is not None, meta
    active: str = meta["active_run_id"]
    return active


def busy_waits(monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """Set once a run with ``if_busy: wait`` has found the conversation busy and waits."""
    from app.service.queue import RunQueue

    waiting = asyncio.Event()
    wait_until_free = RunQueue._wait_until_free

    async def spied(self: RunQueue, *args: Any, **kwargs: Any) -> Any:
        waiting.set()
        return await wait_until_free(self, *args, **kwargs)

    monkeypatch.setattr(RunQueue, "_wait_until_free", spied)
    return waiting


async def test_a_put_during_a_run_makes_it_conflicted_with_its_records_kept(
    gated: AppClient, gate: GatedProvider
) -> None:
    client = gated
    await create(client)
    await run(client, "conv", "hello")
    running = asyncio.create_task(run(client, "conv", "held"))
    run_id = await held_run(client, gate, "conv", "held")
    _, etag = await context_of(client, "conv")

    replacement = {
        "system_prompt": "Replaced.",
        "summary": "",
        "messages": [user("a new beginning")],
    }
    put = await client.put(
        "/conversations/conv/context", json=replacement, headers={"If-Match": etag}
    )
    assert put.status_code == 200
    put_etag = put.headers["etag"]
    assert not running.done()  # the run is still at the gate: the PUT came during it

    gate.release_all()
    ran = await running
    assert ran.status_code == 201
    body = ran.json()
    assert body["run_id"] == run_id
    assert (body["status"], body["stored"]) == ("conflicted", False)
    assert body["base_etag"] == etag
    assert body["etag"] == ran.headers["etag"] == put_etag  # the stored state after the request
    assert body["error"]["type"] == PROBLEM + "run-conflicted"
    # what the PUT stored is what is stored
    assert await context_of(client, "conv") == (replacement, put_etag)
    # the run's work is kept in its record
    assert body["final"]["content"][0]["text"].endswith('You said: "held"')
    record = (await client.get(f"/conversations/conv/runs/{run_id}")).json()
    assert record["status"] == "conflicted" and record["stored"] is False
    assert record["etag"] is None and record["error"] == body["error"]
    assert record["new_messages"] == [user("held"), body["final"]]
    assert record["final"] == body["final"]
    meta = (await client.get("/conversations/conv")).json()
    assert meta["active_run_id"] is None and meta["etag"] == put_etag


async def test_a_second_run_on_a_busy_conversation_is_409_naming_the_active_run(
    gated: AppClient, gate: GatedProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = gated
    await create(client)
    running = asyncio.create_task(run(client, "conv", "held"))
    run_id = await held_run(client, gate, "conv", "held")
    refused = await run(client, "conv", "me too", if_busy="reject")
    problem = assert_problem(refused, 409, "run-in-progress")
    assert problem["active_run_id"] == run_id and run_id in problem["detail"]
    assert int(refused.headers["retry-after"]) >= 1
    assert_problem(await client.post("/conversations/conv/compact"), 409, "run-in-progress")

    waiting = busy_waits(monkeypatch)
    waiter = asyncio.create_task(run(client, "conv", "after you", if_busy="wait"))
    await asyncio.wait_for(waiting.wait(), HANG_GUARD_SECONDS)  # it found the run and waits
    assert not running.done()
    gate.release_all()
    first = await running
    waited = await waiter
    assert first.json()["status"] == "completed"
    assert waited.status_code == 201
    assert waited.json()["base_etag"] == first.json()["etag"]  # it ran on the newer state
    assert waited.json()["final"]["content"][0]["text"].startswith("Echo: I saw 3 messages")


async def test_cancel_a_run_in_flight(gated: AppClient, gate: GatedProvider) -> None:
    client = gated
    await create(client)
    running = asyncio.create_task(run(client, "conv", "held forever", on_failure="discard"))
    run_id = await held_run(client, gate, "conv", "held forever")
    cancelled = await client.post(f"/conversations/conv/runs/{run_id}/cancel")
    assert cancelled.status_code == 202
    assert cancelled.json()["run_id"] == run_id
    ran = (await running).json()  # never released: only the cancel can end it
    assert (ran["status"], ran["stored"]) == ("cancelled", False)
    assert ran["error"]["type"] == PROBLEM + "run-cancelled"
    assert gate.held[0].cancelled  # the provider request was cut off at the gate
    record = (await client.get(f"/conversations/conv/runs/{run_id}")).json()
    assert record["status"] == "cancelled"
    assert record["new_messages"][0] == user("held forever")

    again = await client.post(f"/conversations/conv/runs/{run_id}/cancel")
    assert_problem(again, 409, "run-not-active")
    assert_problem(await client.post("/conversations/conv/runs/nope/cancel"), 404, "not-found")


# --- streaming and idempotency ------------------------------------------------------------


def parse_sse(text: str) -> list[tuple[str, Any]]:
    events = []
    for chunk in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in chunk.splitlines())
        events.append((fields["event"], json.loads(fields["data"])))
    return events


@pytest.mark.parametrize("how", ["accept", "body"])
async def test_a_streamed_run_ends_with_the_same_body_as_the_json_answer(
    client: AppClient, how: str
) -> None:
    await create(client)
    options: dict[str, Any] = {"stream": True} if how == "body" else {}
    headers = {"Accept": "text/event-stream"} if how == "accept" else {}
    async with client.stream(
        "POST",
        "/conversations/conv/runs",
        headers=headers,
        json={"prompts": ["/tool time_now {}"], **options},
    ) as streamed:
        assert streamed.status_code == 201
        assert streamed.headers["content-type"].startswith("text/event-stream")
        location = streamed.headers["location"]
        text = (await streamed.aread()).decode()
    events = parse_sse(text)
    names = [name for name, _ in events]
    assert names[0] == "run.started" and names[-1] == "run.finished"
    for expected in ("delta", "message", "tool.started", "tool.finished"):
        assert expected in names
    started, finished = events[0][1], events[-1][1]
    assert finished["run_id"] == started["run_id"] and location.endswith(started["run_id"])
    messages = [data for name, data in events if name == "message"]
    assert messages == finished["new_messages"]  # each message as it is completed
    record = (await client.get(location)).json()
    assert without_context(finished) == record
    assert (await context_of(client, "conv"))[0] == finished["context"]


async def test_an_idempotency_key_replays_the_first_answer(client: AppClient) -> None:
    await create(client)
    headers = {"Idempotency-Key": "key-1"}
    first = await run(client, "conv", "once", headers=headers)
    again = await run(client, "conv", "once", headers=headers)
    assert again.status_code == 201
    assert again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"
    assert again.headers["etag"] == first.headers["etag"]
    assert again.headers["location"] == first.headers["location"]
    assert len((await client.get("/conversations/conv/runs")).json()["items"]) == 1

    different = await run(client, "conv", "twice", headers=headers)
    assert_problem(different, 422, "idempotency-key-mismatch")
    assert_problem(
        await run(client, "conv", "x", headers={"Idempotency-Key": ""}), 400, "bad-header"
    )
