"""Client tools and approvals over HTTP (issue 12, docs/tools.md), on SQLite and PostgreSQL.

A run that calls a client tool (or an approval-gated server tool) ends ``requires_action``; the
next ``POST …/runs`` answers the pending calls with ``tool_result`` messages at the start of
``prompts`` and ``approvals``. Every refusal happens before a run starts: the stored state (the
context and its ETag) and the run records stay exactly as they were.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from app.config import Settings

from ..fakes.gated import GatedProvider, gated_pool
from ..helpers import assert_problem, user
from .conftest import AppClient, SettingsFactory

LOOKUP = {
    "name": "lookup",
    "description": "Look a word up in the application's dictionary",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
}
RAW_ARGS = '{ "word" : "carry" }'  # the model's own spacing, kept verbatim


def tool_result(call_id: str, name: str, text: str, is_error: bool = False) -> dict[str, Any]:
    return {
        "type": "tool_result",
        "tool_call_id": call_id,
        "tool_name": name,
        "content": [{"type": "text", "text": text}],
        "is_error": is_error,
    }


async def create(client: AppClient, conv: str = "conv") -> None:
    response = await client.post("/conversations", json={"id": conv})
    assert response.status_code == 201, response.text


async def post_run(client: AppClient, conv: str = "conv", **body: Any) -> Any:
    return await client.post(f"/conversations/{conv}/runs", json=body)


async def run_ok(client: AppClient, conv: str = "conv", **body: Any) -> dict[str, Any]:
    response = await post_run(client, conv, **body)
    assert response.status_code == 201, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def paused(client: AppClient, conv: str = "conv", **extra: Any) -> dict[str, Any]:
    """A run that calls the client tool ``lookup`` and pauses."""
    body = await run_ok(client, conv, prompts=[f"/tool lookup {RAW_ARGS}"], tools=[LOOKUP], **extra)
    assert body["status"] == "requires_action", body
    return body


async def state(client: AppClient, conv: str = "conv") -> tuple[Any, str, list[str], int]:
    """What a refusal must leave unchanged: the context, its ETag, the run ids, the
    transcript's length."""
    context = await client.get(f"/conversations/{conv}/context")
    assert context.status_code == 200
    runs = (await client.get(f"/conversations/{conv}/runs")).json()["items"]
    meta = (await client.get(f"/conversations/{conv}")).json()
    assert meta["active_run_id"] is None  # the lease was released (or never taken)
    return (
        context.json(),
        context.headers["etag"],
        [r["run_id"] for r in runs],
        meta["transcript_count"],
    )


async def transcript(client: AppClient, conv: str = "conv") -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = (await client.get(f"/conversations/{conv}/transcript")).json()[
        "items"
    ]
    return items


# --- the client-tool loop -------------------------------------------------------------------


async def test_a_client_tool_pauses_the_run_and_its_result_resumes_it(client: AppClient) -> None:
    await create(client)
    first = await paused(client)
    assert first["stored"] is True
    action = first["required_action"]
    assert action["type"] == "tool_calls"
    [call] = action["tool_calls"]
    assert call["name"] == "lookup" and call["kind"] == "client"
    assert call["arguments"] == RAW_ARGS
    # the stored context ends with the assistant message that made the call
    assert first["context"]["messages"][-1]["type"] == "assistant"
    # the run record and the conversation say the same
    record = (await client.get(f"/conversations/conv/runs/{first['run_id']}")).json()
    assert record["status"] == "requires_action"
    assert record["required_action"] == action
    meta = (await client.get("/conversations/conv")).json()
    assert meta["pending_tool_calls"] == action["tool_calls"]
    listed = (await client.get("/conversations")).json()["items"]
    assert listed[0]["pending_tool_calls"] == action["tool_calls"]

    second = await run_ok(
        client, prompts=[tool_result(call["id"], "lookup", "to bear from one place to another")]
    )
    assert second["status"] == "completed", second
    assert second["required_action"] is None
    assert "to bear from one place to another" in second["final"]["content"][0]["text"]
    assert (await client.get("/conversations/conv")).json()["pending_tool_calls"] == []
    # the result joined the context right after the call, then the model's answer
    kinds = [m["type"] for m in second["context"]["messages"]]
    assert kinds == ["user", "assistant", "tool_result", "assistant"]

    entries = await transcript(client)
    by_kind = {e["kind"]: e for e in entries}
    assert by_kind["pause"]["run_id"] == first["run_id"]
    assert by_kind["pause"]["body"] == action
    assert by_kind["client_result"]["run_id"] == second["run_id"]
    assert by_kind["client_result"]["body"]["tool_call_id"] == call["id"]
    assert all(e["created_at"] for e in entries)
    # a pause is the last entry of its run
    first_run = [e["kind"] for e in entries if e["run_id"] == first["run_id"]]
    assert first_run == ["prompt", "attempt", "pause"]


async def test_the_pause_streams_run_requires_action_before_run_finished(
    client: AppClient,
) -> None:
    await create(client)
    response = await post_run(
        client, prompts=[f"/tool lookup {RAW_ARGS}"], tools=[LOOKUP], stream=True
    )
    assert response.status_code == 201
    events = [
        line.removeprefix("event: ")
        for line in response.text.splitlines()
        if line.startswith("event: ")
    ]
    assert events[-2:] == ["run.requires_action", "run.finished"]
    lines = response.text.splitlines()
    datas = [line.removeprefix("data: ") for line in lines if line.startswith("data:")]
    required, finished = json.loads(datas[-2]), json.loads(datas[-1])
    assert finished["status"] == "requires_action"
    assert required == finished["required_action"]


async def test_a_pause_is_stored_even_with_on_failure_discard(client: AppClient) -> None:
    await create(client)
    body = await paused(client, on_failure="discard")
    assert body["stored"] is True
    meta = (await client.get("/conversations/conv")).json()
    assert [c["name"] for c in meta["pending_tool_calls"]] == ["lookup"]


# --- approvals ------------------------------------------------------------------------------


async def approval_pause(client: AppClient, **extra: Any) -> dict[str, Any]:
    body = await run_ok(client, prompts=["/tool time_now {}"], **extra)
    assert body["status"] == "requires_action", body
    [call] = body["required_action"]["tool_calls"]
    assert call["kind"] == "approval" and call["name"] == "time_now"
    assert not [m for m in body["context"]["messages"] if m["type"] == "tool_result"]
    return dict(call)


async def test_an_approved_call_runs_in_the_resuming_run(client: AppClient) -> None:
    await create(client)
    call = await approval_pause(client, require_approval=["time_now"])
    body = await run_ok(client, approvals=[{"tool_call_id": call["id"], "approve": True}])
    assert body["status"] == "completed", body
    results = [m for m in body["new_messages"] if m["type"] == "tool_result"]
    assert len(results) == 1 and results[0]["is_error"] is False  # time_now ran
    entries = await transcript(client)
    decision = next(e for e in entries if e["kind"] == "approval")
    assert decision["run_id"] == body["run_id"]
    assert decision["body"] == {
        "tool_call_id": call["id"],
        "tool_name": "time_now",
        "approve": True,
        "reason": "",
    }


async def test_a_denied_call_becomes_an_error_result_with_the_reason(client: AppClient) -> None:
    await create(client)
    call = await approval_pause(client, require_approval=["time_now"])
    body = await run_ok(
        client,
        approvals=[{"tool_call_id": call["id"], "approve": False, "reason": "not now"}],
        prompts=["and then?"],
    )
    assert body["status"] == "completed", body
    [result] = [m for m in body["new_messages"] if m["type"] == "tool_result"]
    assert result["is_error"] is True
    assert result["content"][0]["text"] == "denied: not now"
    decision = next(e for e in await transcript(client) if e["kind"] == "approval")
    assert decision["body"]["approve"] is False and decision["body"]["reason"] == "not now"


async def test_the_profile_gates_tools_from_its_approval_required(
    app_factory: Callable[..., Any],
) -> None:
    async with app_factory(approval_required=["time_now"]) as client:
        await create(client)
        await approval_pause(client)  # no require_approval in the request


def test_approval_required_comes_from_the_environment_and_toml(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setenv("CARRYOVER_APPROVAL_REQUIRED", "time_now, wait")
    config = tmp_path / "agents.toml"
    config.write_text('[agents.careful]\nprovider = "echo"\napproval_required = ["fail"]\n')
    settings = Settings(database_url="sqlite://", config_file=str(config))
    assert settings.profile().approval_required == ("time_now", "wait")
    assert settings.profile("careful").approval_required == ("fail",)


async def test_a_profile_gating_a_tool_it_does_not_have_is_refused_by_name(
    app_factory: Callable[..., Any],
) -> None:
    async with app_factory(approval_required=["no_such_tool"]) as client:
        await create(client)
        response = await post_run(client, prompts=["hi"])
        body = assert_problem(response, 503, "not-ready")
        assert "no_such_tool" in body["detail"]


# --- refusals: nothing stored, no run ---------------------------------------------------------


async def refused(
    client: AppClient, status: int, slug: str, conv: str = "conv", **body: Any
) -> dict[str, Any]:
    before = await state(client, conv)
    response = await post_run(client, conv, **body)
    problem = assert_problem(response, status, slug)
    assert await state(client, conv) == before
    return problem


async def test_a_run_that_leaves_a_pending_call_unanswered_is_refused_409(
    client: AppClient,
) -> None:
    await create(client)
    call = (await paused(client))["required_action"]["tool_calls"][0]
    problem = await refused(client, 409, "tool-results-required", prompts=["hello?"])
    assert problem["pending_tool_calls"] == [call]
    assert problem["unanswered"] == [call["id"]]
    # with an Idempotency-Key too: the key is not used up by the refusal
    headers = {"Idempotency-Key": "resume-1"}
    response = await client.post(
        "/conversations/conv/runs", json={"prompts": ["hello?"]}, headers=headers
    )
    assert_problem(response, 409, "tool-results-required")
    answer = {"prompts": [tool_result(call["id"], "lookup", "found")]}
    first = await client.post("/conversations/conv/runs", json=answer, headers=headers)
    assert first.status_code == 201 and first.json()["status"] == "completed", first.text
    again = await client.post("/conversations/conv/runs", json=answer, headers=headers)
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json()["run_id"] == first.json()["run_id"]


async def test_answers_that_match_no_pending_call_are_refused_422(client: AppClient) -> None:
    await create(client)
    call = (await paused(client))["required_action"]["tool_calls"][0]
    good = tool_result(call["id"], "lookup", "found")
    cases: list[dict[str, Any]] = [
        {"prompts": [tool_result("nope", "lookup", "x")]},
        {"prompts": [good, good]},
        {"prompts": [tool_result(call["id"], "other", "x")]},
        {"prompts": [good], "approvals": [{"tool_call_id": call["id"], "approve": True}]},
        {"prompts": ["first", good]},  # results come before the prompts
    ]
    for body in cases:
        problem = await refused(client, 422, "unexpected-tool-answer", **body)
        assert problem["tool_call_id"], problem


async def test_answers_when_nothing_is_pending_are_refused_422(client: AppClient) -> None:
    await create(client)
    await run_ok(client, prompts=["hello"])
    await refused(
        client,
        422,
        "unexpected-tool-answer",
        prompts=[tool_result("c1", "lookup", "x")],
    )
    await refused(
        client, 422, "unexpected-tool-answer", approvals=[{"tool_call_id": "c1", "approve": True}]
    )
    problem = await refused(client, 422, "validation-error", prompts=[])
    assert problem["errors"][0]["path"] == "body.prompts"


@pytest.mark.parametrize(
    ("tools", "path"),
    [
        ([{**LOOKUP, "name": "bad name"}], "body.tools[0].name"),
        ([{**LOOKUP, "name": "time_now"}], "body.tools[0].name"),  # a server tool
        ([LOOKUP, LOOKUP], "body.tools[1].name"),
        ([{**LOOKUP, "parameters": {"type": "string"}}], "body.tools[0].parameters"),
        ([None], "body.tools[0]"),  # not an entry at all: a 422, not a failure to read it
        ([LOOKUP, 3], "body.tools[1]"),
        (["lookup"], "body.tools[0]"),
    ],
)
async def test_bad_client_tools_are_refused_422(
    client: AppClient, tools: list[dict[str, Any]], path: str
) -> None:
    await create(client)
    problem = await refused(client, 422, "validation-error", prompts=["hi"], tools=tools)
    assert problem["errors"][0]["path"] == path


async def test_a_tool_that_is_not_an_object_is_refused_422_saying_what_a_tool_is(
    client: AppClient,
) -> None:
    await create(client)
    problem = await refused(client, 422, "validation-error", prompts=False, tools=[None])
    refusals = {e["path"]: e["message"] for e in problem["errors"]}
    assert "a tool is an object" in refusals["body.tools[0]"]
    assert "body.prompts" in refusals


async def test_gating_a_tool_that_is_not_a_server_tool_is_refused_422(client: AppClient) -> None:
    await create(client)
    problem = await refused(
        client, 422, "validation-error", prompts=["hi"], require_approval=["lookup"]
    )
    assert problem["errors"][0]["path"] == "body.require_approval[0]"


# --- never wedged ---------------------------------------------------------------------------


async def test_pending_calls_survive_a_put_of_the_same_context_and_a_compaction(
    client: AppClient,
) -> None:
    await create(client)
    await run_ok(client, prompts=["an earlier turn"])
    call = (await paused(client))["required_action"]["tool_calls"][0]
    got = await client.get("/conversations/conv/context")
    put = await client.put(
        "/conversations/conv/context", json=got.json(), headers={"If-Match": got.headers["etag"]}
    )
    assert put.status_code == 200, put.text
    assert (await client.get("/conversations/conv")).json()["pending_tool_calls"] == [call]

    compacted = await client.post("/conversations/conv/compact")
    assert compacted.status_code == 201, compacted.text
    assert compacted.json()["status"] == "completed"
    assert compacted.json()["compactions"], "the earlier turn was folded"
    assert (await client.get("/conversations/conv")).json()["pending_tool_calls"] == [call]

    done = await run_ok(client, prompts=[tool_result(call["id"], "lookup", "found")])
    assert done["status"] == "completed", done


async def test_a_put_may_create_a_conversation_that_awaits_a_call(client: AppClient) -> None:
    context = {
        "system_prompt": "",
        "summary": "",
        "messages": [
            user("look it up"),
            {
                "type": "assistant",
                "content": [{"type": "tool_call", "id": "c1", "name": "lookup", "arguments": "{}"}],
                "stop_reason": "tool_use",
            },
        ],
    }
    put = await client.put(
        "/conversations/imported/context", json=context, headers={"If-None-Match": "*"}
    )
    assert put.status_code == 201, put.text
    meta = (await client.get("/conversations/imported")).json()
    assert [c["id"] for c in meta["pending_tool_calls"]] == ["c1"]
    # an unanswered call that is not the last batch is never storable
    broken = {**context, "messages": [*context["messages"], user("and?")]}
    response = await client.put(
        "/conversations/imported/context", json=broken, headers={"If-Match": put.headers["etag"]}
    )
    assert_problem(response, 422, "unreplayable-context")


@pytest.fixture
def gate() -> GatedProvider:
    return GatedProvider(hold=lambda prompt: prompt.startswith("held"))


@pytest.fixture
async def gated(
    app_factory: Callable[..., Any], make_settings: SettingsFactory, gate: GatedProvider
) -> AsyncIterator[AppClient]:
    async with app_factory(agents=gated_pool(make_settings(), gate)) as http:
        try:
            yield http
        finally:
            gate.open()


@pytest.mark.parametrize("on_failure", ["discard", "keep"])
async def test_a_cancelled_resume_never_wedges_the_conversation(
    gated: AppClient, gate: GatedProvider, on_failure: str
) -> None:
    client = gated
    await create(client)
    call = (await paused(client))["required_action"]["tool_calls"][0]
    answer = tool_result(call["id"], "lookup", "found")
    resuming = asyncio.create_task(
        post_run(client, prompts=[answer, "held: go on"], on_failure=on_failure)
    )
    await gate.arrival("held: go on")
    run_id = (await client.get("/conversations/conv")).json()["active_run_id"]
    cancel = await client.post(f"/conversations/conv/runs/{run_id}/cancel")
    assert cancel.status_code == 202
    body = (await resuming).json()
    assert body["status"] == "cancelled"
    meta = (await client.get("/conversations/conv")).json()
    if on_failure == "discard":
        # nothing of the resume was stored: the call is still pending, answered again
        assert meta["pending_tool_calls"] == [call]
        gate.open()
        done = await run_ok(client, prompts=[answer])
    else:
        # the answer was admitted before the cancellation: it stays, nothing is pending
        assert meta["pending_tool_calls"] == []
        gate.open()
        await refused(client, 422, "unexpected-tool-answer", prompts=[answer])
        done = await run_ok(client, prompts=["go on"])
    assert done["status"] == "completed", done


@pytest.mark.parametrize("on_failure", ["discard", "keep"])
async def test_a_failed_resume_never_wedges_the_conversation(
    client: AppClient, on_failure: str
) -> None:
    await create(client)
    call = (await paused(client))["required_action"]["tool_calls"][0]
    answer = tool_result(call["id"], "lookup", "found")
    before = await state(client)
    failed = await run_ok(client, prompts=[answer, "/fail"], on_failure=on_failure)
    assert failed["status"] == "failed"
    pending = (await client.get("/conversations/conv")).json()["pending_tool_calls"]
    if on_failure == "discard":
        assert (await state(client))[:2] == before[:2]  # context and ETag as before
        assert pending == [call]
        done = await run_ok(client, prompts=[answer, "again"])
    else:
        assert pending == []  # the answer was admitted before the provider failed
        done = await run_ok(client, prompts=["again"])
    assert done["status"] == "completed", done
