"""A JSON number with a zero fraction (``754.0``) is an integer, as JSON Schema says: every
integer field of a request body takes it; a fraction, a string or a boolean stays a 422 that
writes nothing."""

from __future__ import annotations

from typing import Any

import pytest

from ..helpers import assert_problem, user
from .conftest import AppClient


async def test_ttl_seconds_with_a_zero_fraction_is_accepted(client: AppClient) -> None:
    created = await client.post("/conversations", json={"id": "c", "ttl_seconds": 754.0})
    assert created.status_code == 201, created.text
    assert created.json()["expires_at"] is not None
    patched = await client.patch(
        "/conversations/c",
        json={"ttl_seconds": 86400.0},
        headers={"content-type": "application/merge-patch+json"},
    )
    assert patched.status_code == 200, patched.text


async def test_fork_messages_with_a_zero_fraction_is_accepted(client: AppClient) -> None:
    await client.post("/conversations", json={"id": "src"})
    ran = await client.post("/conversations/src/runs", json={"prompts": ["hi"]})
    assert ran.status_code == 201, ran.text
    forked = await client.post("/conversations/src/fork", json={"id": "fk", "messages": 0.0})
    assert forked.status_code == 201, forked.text
    assert forked.json()["message_count"] == 0
    again = await client.post("/conversations/src/fork", json={"id": "fk2", "messages": 2.0})
    assert again.status_code == 201 and again.json()["message_count"] == 2


async def test_usage_tokens_with_a_zero_fraction_are_accepted_in_a_context(
    client: AppClient,
) -> None:
    assistant = {
        "type": "assistant",
        "content": [{"type": "text", "text": "hello"}],
        "usage": {"input_tokens": 12.0, "output_tokens": 3.0},
    }
    body = {"system_prompt": "", "summary": "", "messages": [user("hi"), assistant]}
    written = await client.put(
        "/conversations/c/context", json=body, headers={"If-None-Match": "*"}
    )
    assert written.status_code == 201, written.text
    stored = (await client.get("/conversations/c/context")).json()
    usage = stored["messages"][1]["usage"]
    assert usage["input_tokens"] == 12 and type(usage["input_tokens"]) is int


@pytest.mark.parametrize("value", [754.5, "754", True])
async def test_other_non_integers_are_still_refused(client: AppClient, value: Any) -> None:
    refused = await client.post("/conversations", json={"id": "c", "ttl_seconds": value})
    body = assert_problem(refused, 422, "validation-error")
    assert [e["path"] for e in body["errors"]] == ["body.ttl_seconds"]
    assert (await client.get("/conversations/c")).status_code == 404
    fork = await client.post("/conversations/c/fork", json={"messages": value})
    assert fork.status_code in (404, 422)  # the body is refused or the source is missing


async def test_the_document_still_says_integer(client: AppClient) -> None:
    document = (await client.get("/openapi.json")).json()
    ttl = document["components"]["schemas"]["ConversationCreate"]["properties"]["ttl_seconds"]
    assert {"type": "integer", "minimum": 1}.items() <= ttl["anyOf"][0].items()
