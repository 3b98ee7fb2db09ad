"""Versions you can go back to, over HTTP (docs/conversations.md, "Versions"): every version a
conversation's context had — through runs, a compaction and a replace — is listed, reads back
byte for byte as it was served then (with that version's ETag), and can be forked from; a
version never written is 404, one past the version retention 410 `version-expired`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from app.clock import ManualClock

from ..helpers import assert_problem, user
from .conftest import AppClient, SettingsFactory, apps

RETENTION = 3600


@pytest.fixture
async def client(make_settings: SettingsFactory, clock: ManualClock) -> AsyncIterator[AppClient]:
    async with apps(make_settings, clock)(version_retention_seconds=RETENTION) as http:
        yield http


async def current(client: AppClient, conv: str) -> tuple[str, bytes]:
    got = await client.get(f"/conversations/{conv}/context")
    assert got.status_code == 200, got.text
    return got.headers["etag"], got.content


async def test_every_version_is_listed_read_back_and_forked_from(client: AppClient) -> None:
    seen: dict[str, bytes] = {}
    context = {"system_prompt": "S", "summary": "", "messages": [user("one"), user("two")]}
    put = await client.put("/conversations/c/context", json=context, headers={"If-None-Match": "*"})
    assert put.status_code == 201, put.text
    etag, body = await current(client, "c")
    seen[etag] = body
    for prompt in ("a", "b"):
        run = await client.post("/conversations/c/runs", json={"prompts": [prompt]})
        assert run.status_code == 201, run.text
        etag, body = await current(client, "c")
        seen[etag] = body
    compact = await client.post("/conversations/c/compact")
    assert compact.status_code in (200, 201), compact.text
    etag, body = await current(client, "c")
    seen[etag] = body
    replaced = {"system_prompt": "T", "summary": "", "messages": [user("fresh")]}
    put = await client.put("/conversations/c/context", json=replaced, headers={"If-Match": etag})
    assert put.status_code == 200, put.text
    etag, body = await current(client, "c")
    seen[etag] = body

    listed = await client.get("/conversations/c/versions")
    assert listed.status_code == 200, listed.text
    items: list[dict[str, Any]] = listed.json()["items"]
    assert [v["etag"] for v in items] == list(reversed(seen))  # newest first
    assert items[0]["cause"] == "replaced" and items[-1]["cause"] == "created"
    assert [v["version"] for v in items] == sorted((v["version"] for v in items), reverse=True)
    for item in items:
        got = await client.get("/conversations/c/context", params={"version": item["version"]})
        assert got.status_code == 200, got.text
        assert got.headers["etag"] == item["etag"]
        assert got.content == seen[item["etag"]]
    # paged: one at a time, by cursor
    page = (await client.get("/conversations/c/versions", params={"limit": 1})).json()
    assert len(page["items"]) == 1 and page["next_cursor"] is not None
    rest = await client.get("/conversations/c/versions", params={"cursor": page["next_cursor"]})
    assert [v["version"] for v in rest.json()["items"]] == [v["version"] for v in items[1:]]

    # a fork from the version after the first run: that context, its own history from there
    second = items[-2]
    fork = await client.post(
        "/conversations/c/fork", json={"id": "f", "version": second["version"]}
    )
    assert fork.status_code == 201, fork.text
    forked = (await client.get("/conversations/f/context")).json()
    assert forked == json.loads(seen[second["etag"]])
    entry = (await client.get("/conversations/f/transcript")).json()["items"][0]
    assert entry["kind"] == "forked" and entry["body"]["source_etag"] == second["etag"]
    run = await client.post("/conversations/f/runs", json={"prompts": ["on the fork"]})
    assert run.status_code == 201, run.text
    # the source is untouched
    assert (await current(client, "c"))[1] == seen[items[0]["etag"]]

    missing = await client.get("/conversations/c/context", params={"version": 99})
    assert_problem(missing, 404, "not-found")
    fork = await client.post("/conversations/c/fork", json={"id": "g", "version": 99})
    assert_problem(fork, 404, "not-found")
    assert (await client.get("/conversations/g")).status_code == 404
    bad = await client.get("/conversations/c/context", params={"version": 0})
    assert bad.status_code == 422
    # past what a JSON number names exactly (and what the database's integers hold): 422
    for huge in (2**53, 2**63):
        bad = await client.get("/conversations/c/context", params={"version": huge})
        assert_problem(bad, 422, "validation-error")
        for field in ("version", "messages"):
            bad = await client.post("/conversations/c/fork", json={"id": "h", field: huge})
            assert_problem(bad, 422, "validation-error")
    assert (await client.get("/conversations/h")).status_code == 404


async def test_a_version_past_retention_is_gone_the_current_one_stays(
    client: AppClient, clock: ManualClock
) -> None:
    assert (await client.post("/conversations", json={"id": "c"})).status_code == 201
    run = await client.post("/conversations/c/runs", json={"prompts": ["first"]})
    assert run.status_code == 201, run.text
    clock.advance(RETENTION + 1)
    run = await client.post("/conversations/c/runs", json={"prompts": ["second"]})
    assert run.status_code == 201, run.text
    await client.app.state.services.conversations.sweep()

    listed = (await client.get("/conversations/c/versions")).json()["items"]
    assert [v["version"] for v in listed] == [3]
    gone = await client.get("/conversations/c/context", params={"version": 2})
    body = assert_problem(gone, 410, "version-expired")
    assert "oldest version kept is 3" in body["detail"]
    fork = await client.post("/conversations/c/fork", json={"id": "f", "version": 1})
    assert_problem(fork, 410, "version-expired")
    kept = await client.get("/conversations/c/context", params={"version": 3})
    assert kept.status_code == 200 and kept.content == (await current(client, "c"))[1]

    clock.advance(RETENTION + 1)  # the current version is kept however old it is
    await client.app.state.services.conversations.sweep()
    listed = (await client.get("/conversations/c/versions")).json()["items"]
    assert [v["version"] for v in listed] == [3]
