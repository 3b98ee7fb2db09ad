"""``previous_response_id`` continues from the context as it stood right after that response,
at any version (docs/openai.md): after a compaction and after a replace of its conversation, a
branch forks at the version the response stored; ``store: false`` continues from it without
storing; past the version retention it is a 400 naming ``previous_response_id``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from app.clock import ManualClock

from ..helpers import user
from .conftest import AppClient, SettingsFactory, apps
from .test_v1_http import assert_error, respond

RETENTION = 3600


@pytest.fixture
async def client(make_settings: SettingsFactory, clock: ManualClock) -> AsyncIterator[AppClient]:
    async with apps(make_settings, clock)(version_retention_seconds=RETENTION) as http:
        yield http


async def context(client: AppClient, conv: str) -> dict[str, Any]:
    got = await client.get(f"/conversations/{conv}/context")
    assert got.status_code == 200, got.text
    body: dict[str, Any] = got.json()
    return body


async def test_a_branch_forks_at_the_responses_version_after_compaction_and_replace(
    client: AppClient,
) -> None:
    first = await respond(client, input="one")
    conv = first["conversation"]["id"]
    after_first = await context(client, conv)
    await respond(client, input="two", previous_response_id=first["id"])
    compact = await client.post(f"/conversations/{conv}/compact")
    assert compact.status_code in (200, 201), compact.text
    # a branch from the first response: the context right after it, not the compacted one
    branch = await respond(client, input="2b", previous_response_id=first["id"])
    forked = branch["conversation"]["id"]
    assert forked != conv
    assert (await context(client, forked))["messages"][: len(after_first["messages"])] == (
        after_first["messages"]
    )
    assert 'You said: "2b"' in branch["output"][0]["content"][0]["text"]

    # replaced since: still the version it stored
    etag = (await client.get(f"/conversations/{conv}")).json()["etag"]
    replaced = {"system_prompt": "", "summary": "", "messages": [user("other")]}
    put = await client.put(
        f"/conversations/{conv}/context", json=replaced, headers={"If-Match": etag}
    )
    assert put.status_code == 200, put.text
    again = await respond(client, input="2c", previous_response_id=first["id"])
    assert (await context(client, again["conversation"]["id"]))["messages"][:2] == (
        after_first["messages"]
    )
    # store: false continues from it and stores nothing
    unstored = await respond(client, input="2d", previous_response_id=first["id"], store=False)
    assert "I saw 3 messages" in unstored["output"][0]["content"][0]["text"]
    assert (await context(client, conv))["messages"] == [user("other")]


async def test_a_response_whose_version_is_past_retention_is_a_400(
    client: AppClient, clock: ManualClock
) -> None:
    first = await respond(client, input="one")
    await respond(client, input="two", previous_response_id=first["id"])
    clock.advance(RETENTION + 1)
    await respond(client, input="three", conversation=first["conversation"]["id"])
    await client.app.state.services.conversations.sweep()
    expired = await client.post(
        "/v1/responses",
        json={"model": "default", "input": "x", "previous_response_id": first["id"]},
    )
    error = assert_error(expired, 400, "previous_response_id")
    assert "retention" in error["message"]


async def test_a_branch_from_a_response_with_unanswered_calls_answers_them_in_the_fork(
    client: AppClient,
) -> None:
    weather = {
        "type": "function",
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    first = await respond(client, input="one")
    conv = first["conversation"]["id"]
    asked = await respond(
        client,
        input='/tool get_weather {"city": "Oslo"}',
        previous_response_id=first["id"],
        tools=[weather],
    )
    [call] = [o for o in asked["output"] if o["type"] == "function_call"]
    answered = {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}
    await respond(client, input=[answered], conversation=conv, tools=[weather])
    after = await context(client, conv)

    # the source has moved on: a branch from the asking response is a fork whose calls are
    # still open, so new input is refused naming the call, and nothing is stored for it
    listed = (await client.get("/conversations")).json()["items"]
    refused = await client.post(
        "/v1/responses",
        json={
            "model": "default",
            "input": "something else",
            "previous_response_id": asked["id"],
            "tools": [weather],
        },
    )
    error = assert_error(refused, 400, "input")
    assert call["call_id"] in error["message"]
    assert (await client.get("/conversations")).json()["items"] == listed
    # answering them continues the branch, and the source is untouched
    branch = await respond(
        client,
        input=[{**answered, "output": "raining"}],
        previous_response_id=asked["id"],
        tools=[weather],
    )
    forked = branch["conversation"]["id"]
    assert forked != conv
    assert 'Tool get_weather returned: "raining"' in branch["output"][0]["content"][0]["text"]
    assert (await context(client, conv)) == after
