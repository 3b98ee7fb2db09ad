"""``Prefer: return=minimal`` is acknowledged (RFC 7240 §3): ``Preference-Applied`` is sent
exactly when the answer left ``context`` out — on a run (JSON and server-sent events) and on
compact now — and never otherwise."""

from __future__ import annotations

import json

import pytest

from .conftest import AppClient

MINIMAL = {"Prefer": "return=minimal"}


@pytest.fixture
async def conversation(client: AppClient) -> str:
    created = await client.post("/conversations", json={"id": "prefer"})
    assert created.status_code == 201
    return "prefer"


async def test_a_minimal_run_answer_says_the_preference_was_applied(
    client: AppClient, conversation: str
) -> None:
    url = f"/conversations/{conversation}/runs"
    minimal = await client.post(url, json={"prompts": ["one"]}, headers=MINIMAL)
    assert minimal.status_code == 201
    assert minimal.headers["preference-applied"] == "return=minimal"
    assert "context" not in minimal.json()
    for headers in ({}, {"Prefer": "return=representation"}, {"Prefer": "wait=5"}):
        full = await client.post(url, json={"prompts": ["two"]}, headers=headers)
        assert full.status_code == 201
        assert "preference-applied" not in full.headers, headers
        assert "context" in full.json()


async def test_a_minimal_streamed_run_says_so_and_its_last_event_has_no_context(
    client: AppClient, conversation: str
) -> None:
    url = f"/conversations/{conversation}/runs"
    headers = {**MINIMAL, "Accept": "text/event-stream"}
    async with client.stream("POST", url, json={"prompts": ["hi"]}, headers=headers) as answer:
        assert answer.status_code == 201
        assert answer.headers["preference-applied"] == "return=minimal"
        text = "".join([chunk async for chunk in answer.aiter_text()])
    last = text.strip().split("\n\n")[-1].splitlines()
    assert last[0] == "event: run.finished"
    assert "context" not in json.loads(last[1].removeprefix("data: "))


async def test_compact_now_says_so_too(client: AppClient, conversation: str) -> None:
    url = f"/conversations/{conversation}/compact"
    minimal = await client.post(url, headers=MINIMAL)
    assert minimal.status_code == 201
    assert minimal.headers["preference-applied"] == "return=minimal"
    assert "context" not in minimal.json()
    full = await client.post(url)
    assert full.status_code == 201 and "preference-applied" not in full.headers
