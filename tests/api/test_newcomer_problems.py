"""What a newcomer's first mistakes get back: precise problems that say what to do, and the
answers that used to mislead — a fork past the end, an OpenAI-shaped prompt, the 413's
``instance``, the echo model's ``/fail``, a DELETE while a run is in progress."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from ..fakes.gated import GatedProvider, gated_pool
from ..helpers import assert_problem, user
from .conftest import AppClient, SettingsFactory


async def test_a_fork_past_the_end_names_the_length_not_a_tool_call(client: AppClient) -> None:
    await client.post("/conversations", json={"id": "src"})
    await client.post("/conversations/src/runs", json={"prompts": ["hi"]})  # 2 messages
    refused = await client.post("/conversations/src/fork", json={"id": "fk", "messages": 5})
    body = assert_problem(refused, 422, "validation-error", instance=True)
    assert body["errors"] == [
        {"path": "body.messages", "message": "messages is 5 but the context has only 2 messages"}
    ]
    assert "tool" not in body["detail"]
    assert (await client.get("/conversations/fk")).status_code == 404


@pytest.mark.parametrize(
    "prompt",
    [
        {"role": "user", "content": "hi"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
    ],
)
async def test_an_openai_shaped_prompt_is_refused_showing_the_typed_form(
    client: AppClient, prompt: dict[str, Any]
) -> None:
    await client.post("/conversations", json={"id": "c"})
    refused = await client.post("/conversations/c/runs", json={"prompts": [prompt]})
    body = assert_problem(refused, 422, "validation-error", instance=True)
    [error] = body["errors"]
    assert error["path"] == "body.prompts[0].type"
    assert '{"type": "user", "content": [{"type": "text", "text": "hi"}]}' in error["message"]
    assert '"type", not "role"' in body["detail"]
    assert (await client.get("/conversations/c")).json()["run_count"] == 0


async def test_a_role_shaped_message_in_a_context_gets_the_same_hint(client: AppClient) -> None:
    body = {"messages": [user("hi"), {"role": "assistant", "content": "hello"}]}
    refused = await client.put(
        "/conversations/c/context", json=body, headers={"If-None-Match": "*"}
    )
    problem = assert_problem(refused, 422, "validation-error")
    assert '"type", not "role"' in problem["errors"][0]["message"]
    assert (await client.get("/conversations/c")).status_code == 404


async def test_a_body_too_large_names_its_instance(make_settings: SettingsFactory) -> None:
    from .conftest import start_client

    app, client = await start_client(make_settings(max_body_bytes=1024, max_image_bytes=512))
    async with app.router.lifespan_context(app), client:
        big = {"id": "c", "system_prompt": "x" * 4096}
        refused = await client.post("/conversations", json=big)
        assert_problem(refused, 413, "payload-too-large", instance=True)
        assert (await client.get("/conversations/c")).status_code == 404


async def test_fail_is_a_fatal_error_that_does_not_claim_retries(client: AppClient) -> None:
    await client.post("/conversations", json={"id": "c"})
    failed = (await client.post("/conversations/c/runs", json={"prompts": ["/fail"]})).json()
    assert failed["status"] == "failed"
    error = failed["error"]
    assert error["kind"] == "fatal"
    assert "retries" not in error["detail"] and "not retried" in error["detail"]


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


async def test_delete_during_a_run_is_409_naming_it_and_deletes_after_it_ends(
    gated: AppClient, gate: GatedProvider
) -> None:
    client = gated
    await client.post("/conversations", json={"id": "c"})
    running = asyncio.create_task(
        client.post("/conversations/c/runs", json={"prompts": ["held run"]})
    )
    await gate.arrival("held run")
    active = (await client.get("/conversations/c")).json()["active_run_id"]
    refused = await client.delete("/conversations/c")
    body = assert_problem(refused, 409, "run-in-progress", instance=True)
    assert body["active_run_id"] == active and active in body["detail"]
    etag = (await client.get("/conversations/c")).headers["etag"]
    stale = await client.delete("/conversations/c", headers={"If-Match": '"nope-1"'})
    assert_problem(stale, 412, "precondition-failed")
    assert (await client.delete("/conversations/c", headers={"If-Match": etag})).status_code == 409
    gate.release_all()
    finished = (await running).json()
    assert finished["status"] == "completed" and finished["stored"] is True
    record = await client.get(f"/conversations/c/runs/{active}")
    assert record.json()["status"] == "completed"  # its end was recorded
    assert (await client.delete("/conversations/c")).status_code == 204
    assert (await client.get("/conversations/c")).status_code == 404
