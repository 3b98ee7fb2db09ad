"""The transcript through HTTP (contract §4): append-only, cursor-paged, never rewritten by
compaction; every prompt, attempt (failed ones flagged), tool result, compaction and context
replacement, each with its run id, sequence number and time."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from app.api.deps import encode_cursor

from ..helpers import assert_problem, user
from .conftest import AppClient

PROBLEM = "https://carryover.dev/problems/"


async def run(client: AppClient, *prompts: str, **options: Any) -> dict[str, Any]:
    ran = await client.post("/conversations/conv/runs", json={"prompts": list(prompts), **options})
    assert ran.status_code == 201, ran.text
    body: dict[str, Any] = ran.json()
    return body


async def transcript(client: AppClient, limit: int | None = None) -> list[dict[str, Any]]:
    """Every entry, read page by page."""
    entries: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {}
        if limit is not None:
            params["limit"] = limit
        if cursor is not None:
            params["cursor"] = cursor
        page = await client.get("/conversations/conv/transcript", params=params)
        assert page.status_code == 200, page.text
        body = page.json()
        assert limit is None or len(body["items"]) <= limit
        entries += body["items"]
        cursor = body["next_cursor"]
        if cursor is None:
            return entries


@pytest.fixture
async def conv(client: AppClient) -> str:
    assert (await client.post("/conversations", json={"id": "conv"})).status_code == 201
    return "conv"


async def test_every_message_of_a_run_in_order(client: AppClient, conv: str) -> None:
    assert await transcript(client) == []
    ran = await run(client, "first", "/tool time_now {}")  # directives read the last prompt
    entries = await transcript(client)
    assert [(e["kind"], e["failed"]) for e in entries] == [
        ("prompt", False),
        ("prompt", False),
        ("attempt", False),
        ("tool_result", False),
        ("attempt", False),
    ]
    assert [e["seq"] for e in entries] == [1, 2, 3, 4, 5]
    assert {e["run_id"] for e in entries} == {ran["run_id"]}
    assert [e["body"] for e in entries] == ran["new_messages"]
    for entry in entries:
        assert set(entry) == {"seq", "run_id", "kind", "failed", "body", "created_at"}
        datetime.fromisoformat(entry["created_at"])


async def test_failed_attempts_are_flagged_and_kept(client: AppClient, conv: str) -> None:
    for on_failure in ("keep", "discard"):
        ran = await run(client, "/fail", on_failure=on_failure)
        mine = [e for e in await transcript(client) if e["run_id"] == ran["run_id"]]
        assert [(e["kind"], e["failed"]) for e in mine] == [("prompt", False), ("attempt", True)]
        assert mine[1]["body"] == ran["final"]
        assert mine[1]["body"]["stop_reason"] == "error"


async def test_paging_returns_the_same_entries_as_one_page(client: AppClient, conv: str) -> None:
    for i in range(4):
        await run(client, f"turn {i}")
    whole = await transcript(client)
    assert len(whole) == 8
    for limit in (1, 3, 8, 50):
        assert await transcript(client, limit) == whole
    page = (await client.get("/conversations/conv/transcript", params={"limit": 8})).json()
    assert page["next_cursor"] is None  # an exact last page says so


async def test_compaction_appends_and_never_rewrites(client: AppClient, conv: str) -> None:
    for prompt in ("one", "two", "three"):
        await run(client, prompt)
    before = await transcript(client)

    compacted = (await client.post("/conversations/conv/compact")).json()
    assert compacted["compactions"]
    after_compaction = await transcript(client)
    assert after_compaction[: len(before)] == before  # the earlier entries are all still there
    [entry] = after_compaction[len(before) :]
    assert entry["kind"] == "compaction" and entry["run_id"] == compacted["run_id"]
    assert entry["seq"] == before[-1]["seq"] + 1
    record = compacted["compactions"][0]
    assert entry["body"]["summary"] == record["summary"]
    assert entry["body"]["reason"] == "manual"
    assert entry["body"]["folded"]["count"] == len(record["folded"])  # the range it folded

    # an overflow compaction happens inside a run, between its attempts
    overflowed = await run(client, "/overflow")
    assert [c["reason"] for c in overflowed["compactions"]] == ["overflow"]
    latest = await transcript(client)
    assert latest[: len(after_compaction)] == after_compaction
    mine = latest[len(after_compaction) :]
    assert [(e["kind"], e["failed"]) for e in mine] == [
        ("prompt", False),
        ("attempt", True),
        ("compaction", False),
        ("attempt", False),
    ]
    assert {e["run_id"] for e in mine} == {overflowed["run_id"]}

    # new entries keep following with increasing sequence numbers
    await run(client, "four")
    final = await transcript(client)
    seqs = [e["seq"] for e in final]
    assert seqs == list(range(1, len(final) + 1))
    meta = (await client.get("/conversations/conv")).json()
    assert meta["transcript_count"] == len(final)


async def test_context_replacements_are_entries(client: AppClient, conv: str) -> None:
    etag = (await client.get("/conversations/conv")).json()["etag"]
    first = {"system_prompt": "S", "summary": "", "messages": [user("imported")]}
    put = await client.put("/conversations/conv/context", json=first, headers={"If-Match": etag})
    ran = await run(client, "hello")
    second = {"system_prompt": "S", "summary": "short", "messages": []}
    put2 = await client.put(
        "/conversations/conv/context", json=second, headers={"If-Match": ran["etag"]}
    )
    assert put2.status_code == 200
    entries = await transcript(client)
    replaced = [e for e in entries if e["kind"] == "context_replaced"]
    assert [e["body"] for e in replaced] == [
        {"etag": put.headers["etag"], "context": first},
        {"etag": put2.headers["etag"], "context": second},
    ]
    assert all(e["run_id"] is None and e["failed"] is False for e in replaced)
    assert [e["kind"] for e in entries] == [
        "context_replaced",
        "prompt",
        "attempt",
        "context_replaced",
    ]

    created = await client.put(
        "/conversations/made/context", json=first, headers={"If-None-Match": "*"}
    )
    assert created.status_code == 201
    made = (await client.get("/conversations/made/transcript")).json()["items"]
    assert [(e["seq"], e["kind"]) for e in made] == [(1, "context_replaced")]


async def test_transcript_errors(client: AppClient, conv: str) -> None:
    await run(client, "hi")
    path = "/conversations/conv/transcript"
    assert_problem(await client.get(path, params={"cursor": "garbage!"}), 400, "bad-cursor")
    assert_problem(
        await client.get(path, params={"cursor": encode_cursor("c-1")}), 400, "bad-cursor"
    )
    assert_problem(
        await client.get(path, params={"cursor": encode_cursor(True)}), 400, "bad-cursor"
    )
    assert_problem(await client.get(path, params={"limit": 201}), 422, "limit-exceeded")
    assert_problem(await client.get(path, params={"limit": 0}), 422, "validation-error")
    assert_problem(await client.get("/conversations/ghost/transcript"), 404, "not-found")
    # a cursor past the end is an empty last page
    tail = await client.get(path, params={"cursor": encode_cursor(10_000)})
    assert tail.json() == {"items": [], "next_cursor": None}
