"""What a run stores can be PUT back unchanged (issue 10): the stored context never passes
``max_context_messages`` or ``max_body_bytes``, through HTTP, on both engines.

A run near either bound compacts first (``size_compact_at``, 0.9 by default); where that is
off or not enough, the run ends ``failed`` with ``run-context-too-large`` and nothing past the
bound is stored, ``on_failure: keep`` included; the conversation stays usable. The stored
size (``conversations.context_bytes``, kept incrementally like the token tally) equals the
byte length of GET context after every write. PUT, import and fork refuse what a GET could
not give back. ``POST …/compact`` is under the run deadline. No wall clock: the deadline
test holds the summary request at a gate that never opens."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.fakes.gated import GatedProvider, gated_pool
from tests.repository import Repository

from ..helpers import assert_problem, user
from .conftest import AppClient, SettingsFactory

PROBLEM = "https://carryover.dev/problems/"


def assistant(text: str) -> dict[str, Any]:
    return {"type": "assistant", "content": [{"type": "text", "text": text}]}


def history(n: int) -> list[dict[str, Any]]:
    """``n`` alternating user and assistant messages (ending with an assistant one when even)."""
    return [user(f"u{i}") if i % 2 == 0 else assistant(f"a{i}") for i in range(n)]


async def put(http: httpx.AsyncClient, conv: str, messages: list[dict[str, Any]]) -> str:
    response = await http.put(
        f"/conversations/{conv}/context",
        json={"system_prompt": "Be brief.", "summary": "", "messages": messages},
        headers={"If-None-Match": "*"},
    )
    assert response.status_code == 201, response.text
    return response.headers["ETag"]


async def run(http: httpx.AsyncClient, conv: str, prompt: str, **body: Any) -> dict[str, Any]:
    response = await http.post(
        f"/conversations/{conv}/runs",
        json={"prompts": [prompt], **body},
        headers={"Prefer": "return=minimal"},
    )
    assert response.status_code == 201, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def stored_bytes(http: AppClient, conv: str) -> int | None:
    repo = Repository.of(http.app.state.services.stores)
    row = await repo.get_conversation("default", conv)
    assert row is not None
    return row.context_bytes


async def assert_put_back(http: AppClient, conv: str) -> httpx.Response:
    """The stored context as GET answers it: its stored size is its byte length, and PUT back
    unchanged with If-Match it is accepted (200), its size counted the same. Returns the GET
    (the PUT's ETag is the current one: ``etag`` of the response's request)."""
    got = await http.get(f"/conversations/{conv}/context")
    assert got.status_code == 200, got.text
    assert await stored_bytes(http, conv) == len(got.content)
    again = await http.put(
        f"/conversations/{conv}/context",
        content=got.content,
        headers={"If-Match": got.headers["ETag"], "Content-Type": "application/json"},
    )
    assert again.status_code == 200, again.text
    assert await stored_bytes(http, conv) == len(got.content)
    got.headers["ETag"] = again.headers["ETag"]  # what is stored now
    return got


async def test_a_compacting_run_never_stores_more_than_max_context_messages(
    app_factory: Any,
) -> None:
    async with app_factory(max_context_messages=10) as http:
        create = await http.post("/conversations", json={"id": "c1"})
        assert create.status_code == 201, create.text
        reasons: list[str] = []
        for i in range(12):
            body = await run(http, "c1", f"p{i}")
            assert (body["status"], body["stored"]) == ("completed", True), body
            reasons += [c["reason"] for c in body["compactions"]]
            got = await assert_put_back(http, "c1")
            assert len(got.json()["messages"]) <= 10
        assert reasons and set(reasons) == {"threshold"}  # compacted for its size
        texts = [m["content"][0]["text"] for m in got.json()["messages"] if m["type"] == "user"]
        assert texts[-1] == "p11"  # the latest turns stay


async def test_a_compacting_run_never_stores_more_than_max_body_bytes(app_factory: Any) -> None:
    async with app_factory(max_body_bytes=4096, max_image_bytes=1000) as http:
        assert (await http.post("/conversations", json={"id": "c1"})).status_code == 201
        compacted = 0
        for i in range(16):
            body = await run(http, "c1", f"prompt {i} " + "b" * 80)
            assert (body["status"], body["stored"]) == ("completed", True), body
            compacted += len(body["compactions"])
            got = await assert_put_back(http, "c1")
            assert len(got.content) <= 4096
        assert compacted


async def test_a_tool_turn_past_the_bound_compacts_within_the_run(app_factory: Any) -> None:
    async with app_factory(max_context_messages=12) as http:
        await put(http, "c1", history(8))  # 9 admitted: under 0.9 of the bound
        body = await run(http, "c1", "/tool time_now {}")  # the call and its result: 11
        assert (body["status"], body["stored"]) == ("completed", True), body
        [compaction] = body["compactions"]
        assert compaction["reason"] == "threshold" and compaction["at"] == 3  # after the result
        got = await assert_put_back(http, "c1")
        assert len(got.json()["messages"]) <= 12


@pytest.mark.parametrize("on_failure", ["keep", "discard"])
async def test_without_size_compaction_a_run_that_would_pass_the_bound_fails_storing_nothing(
    app_factory: Any, on_failure: str
) -> None:
    async with app_factory(max_context_messages=11, size_compact_at=0) as http:
        # admitting the prompt would pass the bound: refused before the provider is asked
        before = await put(http, "full", history(11))
        body = await run(http, "full", "one more", on_failure=on_failure)
        _assert_too_large(body, "max_context_messages")
        assert body["new_messages"] == [] and body["final"] is None  # nothing was asked
        assert (await http.get("/conversations/full/context")).headers["ETag"] == before

        # the answer would pass it: the run's records are kept, its context is not stored
        before = await put(http, "almost", history(10))
        body = await run(http, "almost", "one more", on_failure=on_failure)
        _assert_too_large(body, "max_context_messages")
        assert [m["type"] for m in body["new_messages"]] == ["user", "assistant"]
        assert (await http.get("/conversations/almost/context")).headers["ETag"] == before
        await assert_put_back(http, "almost")

        # a tool turn would pass it: the run stops before the next provider request
        before = await put(http, "tools", history(10))
        body = await run(http, "tools", "/tool time_now {}", on_failure=on_failure)
        _assert_too_large(body, "max_context_messages")
        assert [m["type"] for m in body["new_messages"]] == ["user", "assistant", "tool_result"]
        assert (await http.get("/conversations/tools/context")).headers["ETag"] == before

        # the conversation stays usable: compact it (or PUT a shorter context), then run
        compacted = await http.post("/conversations/full/compact")
        assert compacted.status_code == 201, compacted.text
        assert (compacted.json()["status"], compacted.json()["stored"]) == ("completed", True)
        body = await run(http, "full", "now it fits", on_failure=on_failure)
        assert (body["status"], body["stored"]) == ("completed", True), body
        await assert_put_back(http, "full")

        runs = (await http.get("/conversations/almost/runs")).json()["items"]
        assert runs[-1]["error"]["code"] == "context_too_large"  # the record says so too


def _assert_too_large(body: dict[str, Any], limit: str) -> None:
    assert (body["status"], body["stored"]) == ("failed", False), body
    error = body["error"]
    assert error["type"] == PROBLEM + "run-context-too-large", error
    assert error["code"] == "context_too_large" and limit in error["detail"], error
    assert "POST …/compact" in error["detail"] and "PUT a shorter context" in error["detail"]


async def test_a_failed_run_kept_on_failure_keeps_nothing_past_the_bound(
    app_factory: Any,
) -> None:
    """The prompt of a run that failed fits and is kept; once the kept context would pass the
    bound, nothing is kept, and the run's own error says why."""
    async with app_factory(max_context_messages=11, size_compact_at=0) as http:
        await put(http, "c1", history(9))
        body = await run(http, "c1", "/fail", on_failure="keep")
        assert (body["status"], body["stored"]) == ("failed", True), body  # 10 messages fit
        assert body["error"]["type"] == PROBLEM + "run-provider-error"
        await assert_put_back(http, "c1")
        body = await run(http, "c1", "/fail", on_failure="keep")
        assert (body["status"], body["stored"]) == ("failed", True), body  # 11: the bound
        got = await assert_put_back(http, "c1")
        body = await run(http, "c1", "/fail", on_failure="keep")
        _assert_too_large(body, "max_context_messages")  # refused before the provider
        assert (await http.get("/conversations/c1/context")).headers["ETag"] == got.headers["ETag"]


async def test_the_stored_size_is_kept_through_runs_a_put_a_compaction_and_a_fork(
    app_factory: Any,
) -> None:
    async with app_factory() as http:
        await put(http, "c1", [*history(40), user('ünïcödé ✓ \U0001f600 \x01 "q" \\')])
        await assert_put_back(http, "c1")
        for prompt in ("one", "two ✓", "/tool time_now {}", "/fail"):
            await run(http, "c1", prompt, on_failure="keep")
            await assert_put_back(http, "c1")
        compacted = await http.post("/conversations/c1/compact")
        assert compacted.json()["compactions"], compacted.text
        await assert_put_back(http, "c1")
        await run(http, "c1", "after")
        await assert_put_back(http, "c1")
        for body in ({"id": "whole"}, {"id": "part", "messages": 2}):
            forked = await http.post("/conversations/c1/fork", json=body)
            assert forked.status_code == 201, forked.text
            await assert_put_back(http, body["id"])
        exported = await http.get("/conversations/c1/export")
        imported = await http.post(
            "/conversations/import?id=copy",
            content=exported.content,
            headers={"Content-Type": "application/json"},
        )
        assert imported.status_code == 201, imported.text
        await assert_put_back(http, "copy")


async def test_a_put_whose_stored_form_would_pass_max_body_bytes_is_refused(
    app_factory: Any,
) -> None:
    """Sent without their defaults, assistant messages are a quarter of their stored size:
    the body fits the limit, what GET would answer does not."""
    async with app_factory(max_body_bytes=4096, max_image_bytes=1000) as http:
        messages = history(30)
        sent = {"system_prompt": "", "summary": "", "messages": messages}
        response = await http.put(
            "/conversations/c1/context", json=sent, headers={"If-None-Match": "*"}
        )
        problem = assert_problem(response, 422, "limit-exceeded")
        assert problem["limit"] == "max_body_bytes" and problem["maximum"] == 4096
        assert problem["actual"] > 4096 and "PUT back" in problem["detail"]
        assert (await http.get("/conversations/c1/context")).status_code == 404

        document = {
            "format": "carryover.conversation",
            "format_version": 1,
            "conversation": {
                "id": "c1",
                "metadata": {},
                "created_at": "2026-01-01T00:00:00Z",
                "updated_at": "2026-01-01T00:00:00Z",
                "version": 1,
                "etag": '"x-1"',
            },
            "context": sent,
            "transcript": [],
            "runs": [],
        }
        imported = await http.post("/conversations/import", json=document)
        assert assert_problem(imported, 422, "limit-exceeded")["limit"] == "max_body_bytes"
        assert (await http.get("/conversations/c1/context")).status_code == 404


async def test_a_fork_past_lowered_bounds_is_refused_and_a_shorter_one_is_not(
    app_factory: Any,
) -> None:
    """A conversation stored before its deployment lowered ``max_context_messages``."""
    async with app_factory() as http:
        await put(http, "old", history(20))
    async with app_factory(max_context_messages=10) as http:
        refused = await http.post("/conversations/old/fork", json={"id": "copy"})
        problem = assert_problem(refused, 422, "limit-exceeded")
        assert problem["limit"] == "max_context_messages"
        assert (await http.get("/conversations/copy")).status_code == 404
        shorter = await http.post("/conversations/old/fork", json={"id": "copy", "messages": 10})
        assert shorter.status_code == 201, shorter.text
        await assert_put_back(http, "copy")
        # a run on the old conversation compacts it back within the bound
        body = await run(http, "old", "hello")
        assert (body["status"], body["stored"]) == ("completed", True), body
        assert body["compactions"]
        await assert_put_back(http, "old")


async def test_a_compaction_past_the_run_deadline_is_stopped_and_stores_nothing(
    make_settings: SettingsFactory, app_factory: Any
) -> None:
    gate = GatedProvider(hold=lambda prompt: False, hold_summaries=True)  # never released
    settings = make_settings(run_deadline_seconds=0.2)
    async with app_factory(agents=gated_pool(settings, gate), run_deadline_seconds=0.2) as http:
        before = await put(http, "c1", history(12))
        compacted = await http.post("/conversations/c1/compact")
        assert compacted.status_code == 201, compacted.text
        body = compacted.json()
        assert gate.held and gate.held[0].cancelled  # its summary request was stopped
        assert (body["status"], body["stored"], body["compactions"]) == ("failed", False, [])
        error = body["error"]
        assert error["type"] == PROBLEM + "run-deadline-exceeded", error
        assert error["code"] == "run_deadline"
        assert "compaction" in error["detail"]
        assert (await http.get("/conversations/c1/context")).headers["ETag"] == before
        record = (await http.get(compacted.headers["Location"])).json()
        assert (record["status"], record["error"]["code"]) == ("failed", "run_deadline")
        # the conversation is free again: a run that needs no summary completes
        after = await run(http, "c1", "next")
        assert (after["status"], after["stored"]) == ("completed", True), after
