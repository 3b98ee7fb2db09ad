"""Conversations through HTTP (contract §4): create (generated or client id), list (cursor paged),
get (ETag, counts, timestamps, active run) and delete (with every record)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

import pytest

from app.api.deps import encode_cursor
from app.api.schemas import CONVERSATION_ID_PATTERN

from ..helpers import assert_problem
from .conftest import AppClient

PROBLEM = "https://carryover.dev/problems/"


# --- create -------------------------------------------------------------------------------


async def test_create_with_a_generated_id(client: AppClient) -> None:
    created = await client.post("/conversations", json={"system_prompt": "You are concise."})
    assert created.status_code == 201
    body = created.json()
    assert re.match(CONVERSATION_ID_PATTERN, body["id"])
    assert created.headers["location"] == f"/conversations/{body['id']}"
    assert created.headers["etag"] == body["etag"]
    assert body["system_prompt"] == "You are concise."
    assert (body["message_count"], body["run_count"], body["transcript_count"]) == (0, 0, 0)
    assert body["has_summary"] is False and body["active_run_id"] is None
    assert datetime.fromisoformat(body["created_at"]) <= datetime.fromisoformat(body["updated_at"])

    other = await client.post("/conversations", json={})
    assert other.status_code == 201
    assert other.json()["id"] != body["id"] and other.json()["system_prompt"] == ""

    fetched = await client.get(created.headers["location"])
    assert fetched.status_code == 200 and fetched.json() == body


async def test_create_without_a_body(client: AppClient) -> None:
    created = await client.post("/conversations")
    assert created.status_code == 201
    context = await client.get(f"/conversations/{created.json()['id']}/context")
    assert context.json() == {"system_prompt": "", "summary": "", "messages": []}


@pytest.mark.parametrize("conv_id", ["support-4711", "a", "A.b_c:d-9", "x" * 128])
async def test_create_with_a_client_id(client: AppClient, conv_id: str) -> None:
    created = await client.post("/conversations", json={"id": conv_id})
    assert created.status_code == 201
    assert created.json()["id"] == conv_id
    assert created.headers["location"] == f"/conversations/{conv_id}"
    assert (await client.get(f"/conversations/{conv_id}")).status_code == 200


async def test_a_duplicate_id_is_409_and_leaves_the_first_alone(client: AppClient) -> None:
    first = await client.post("/conversations", json={"id": "dup", "system_prompt": "one"})
    await client.post("/conversations/dup/runs", json={"prompts": ["hi"]})
    before = (await client.get("/conversations/dup")).json()

    again = await client.post("/conversations", json={"id": "dup", "system_prompt": "two"})
    body = assert_problem(again, 409, "conversation-exists")
    assert "dup" in body["detail"]
    assert "location" not in again.headers
    after = (await client.get("/conversations/dup")).json()
    assert after == before and after["system_prompt"] == "one"
    assert first.json()["etag"] != after["etag"]  # the run changed it; the 409 did not


@pytest.mark.parametrize(
    "body",
    [
        {"id": "-starts-with-dash"},
        {"id": "has space"},
        {"id": "slash/inside"},
        {"id": "x" * 129},
        {"id": ""},
        {"id": 7},
        {"system_prompt": 3},
        {"unknown": "field"},
    ],
)
async def test_create_refuses_bad_bodies(client: AppClient, body: dict[str, Any]) -> None:
    problem = assert_problem(
        await client.post("/conversations", json=body), 422, "validation-error"
    )
    assert problem["errors"][0]["path"].startswith("body")
    assert (await client.get("/conversations")).json()["items"] == []


async def test_create_refuses_malformed_json(client: AppClient) -> None:
    sent = await client.post(
        "/conversations", content=b'{"id": ', headers={"content-type": "application/json"}
    )
    assert_problem(sent, 400, "malformed-json")


# --- list ---------------------------------------------------------------------------------


async def test_list_pages_through_every_conversation_with_cursors(client: AppClient) -> None:
    ids = sorted(f"c-{i:02d}" for i in range(11))
    for conv_id in reversed(ids):
        assert (await client.post("/conversations", json={"id": conv_id})).status_code == 201

    seen: list[str] = []
    pages = 0
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 4}
        if cursor is not None:
            params["cursor"] = cursor
        page = await client.get("/conversations", params=params)
        assert page.status_code == 200
        body = page.json()
        pages += 1
        assert len(body["items"]) <= 4
        seen.extend(item["id"] for item in body["items"])
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert pages == 3
    assert seen == ids  # newest first (created in reverse id order), each once

    whole = (await client.get("/conversations")).json()
    assert [c["id"] for c in whole["items"]] == ids and whole["next_cursor"] is None
    # items carry the same metadata as GET /conversations/{id}
    one = (await client.get("/conversations/c-03")).json()
    assert whole["items"][3] == one


async def test_list_exact_multiple_of_the_page_size_ends_without_an_empty_page(
    client: AppClient,
) -> None:
    for i in range(4):
        await client.post("/conversations", json={"id": f"m{i}"})
    first = (await client.get("/conversations", params={"limit": 2})).json()
    second = (
        await client.get("/conversations", params={"limit": 2, "cursor": first["next_cursor"]})
    ).json()
    assert [c["id"] for c in first["items"] + second["items"]] == ["m3", "m2", "m1", "m0"]
    assert second["next_cursor"] is None


async def test_list_of_nothing(client: AppClient) -> None:
    body = (await client.get("/conversations")).json()
    assert body == {"items": [], "next_cursor": None}


@pytest.mark.parametrize(
    "cursor",
    ["not-a-cursor", "!!!", encode_cursor(42), "eyJ4IjoxfQ", encode_cursor(None)],
)
async def test_a_cursor_we_did_not_issue_is_400(client: AppClient, cursor: str) -> None:
    await client.post("/conversations", json={"id": "a"})
    response = await client.get("/conversations", params={"cursor": cursor})
    assert_problem(response, 400, "bad-cursor")


async def test_limit_over_the_maximum_is_422(app_factory: Any) -> None:
    async with app_factory(max_page_size=5, default_page_size=5) as client:
        for i in range(6):
            await client.post("/conversations", json={"id": f"c{i}"})
        problem = assert_problem(
            await client.get("/conversations", params={"limit": 6}), 422, "limit-exceeded"
        )
        assert (problem["limit"], problem["maximum"]) == ("max_page_size", 5)
        at_max = (await client.get("/conversations", params={"limit": 5})).json()
        assert len(at_max["items"]) == 5 and at_max["next_cursor"] is not None
        # without a limit: the default page size
        assert len((await client.get("/conversations")).json()["items"]) == 5


@pytest.mark.parametrize("limit", ["0", "-1", "many"])
async def test_a_limit_that_is_no_page_size_is_422(client: AppClient, limit: str) -> None:
    assert_problem(
        await client.get("/conversations", params={"limit": limit}), 422, "validation-error"
    )


# --- get ----------------------------------------------------------------------------------


async def test_get_reports_counts_and_the_active_run(client: AppClient) -> None:
    created = (await client.post("/conversations", json={"id": "counted"})).json()
    first = (await client.post("/conversations/counted/runs", json={"prompts": ["one"]})).json()
    second = await client.post(
        "/conversations/counted/runs", json={"prompts": ["/tool time_now {}", "two"]}
    )
    assert second.status_code == 201

    got = await client.get("/conversations/counted")
    assert got.status_code == 200
    body = got.json()
    assert got.headers["etag"] == body["etag"] == second.headers["etag"]
    context = (await client.get("/conversations/counted/context")).json()
    transcript = (await client.get("/conversations/counted/transcript")).json()["items"]
    assert body["message_count"] == len(context["messages"])
    assert body["run_count"] == 2
    assert body["transcript_count"] == len(transcript) == transcript[-1]["seq"]
    assert body["active_run_id"] is None  # no run holds it after the runs ended
    assert body["has_summary"] is False
    assert body["created_at"] == created["created_at"]
    assert datetime.fromisoformat(body["updated_at"]) >= datetime.fromisoformat(
        first["finished_at"]
    )

    compacted = await client.post("/conversations/counted/compact")
    assert compacted.status_code == 201
    body = (await client.get("/conversations/counted")).json()
    assert body["has_summary"] is True and body["run_count"] == 3
    assert body["message_count"] == len(compacted.json()["context"]["messages"])


async def test_get_a_missing_conversation_is_404(client: AppClient) -> None:
    body = assert_problem(await client.get("/conversations/none-such"), 404, "not-found")
    assert body["instance"] == "/conversations/none-such"


async def test_a_path_id_outside_the_pattern_is_422(client: AppClient) -> None:
    assert_problem(await client.get("/conversations/-bad"), 422, "validation-error")
    assert_problem(await client.get("/conversations/" + "x" * 129), 422, "validation-error")


# --- delete -------------------------------------------------------------------------------


async def test_delete_removes_the_conversation_and_all_its_records(client: AppClient) -> None:
    await client.post("/conversations", json={"id": "doomed"})
    ran = await client.post("/conversations/doomed/runs", json={"prompts": ["/fail"]})
    run_id = ran.json()["run_id"]
    await client.post("/conversations/doomed/runs", json={"prompts": ["hello"]})
    await client.post("/conversations/doomed/compact")
    await client.post("/conversations", json={"id": "kept"})
    await client.post("/conversations/kept/runs", json={"prompts": ["stay"]})

    deleted = await client.delete("/conversations/doomed")
    assert deleted.status_code == 204 and deleted.content == b""

    for path in ("", "/context", "/runs", f"/runs/{run_id}", "/transcript"):
        assert_problem(await client.get(f"/conversations/doomed{path}"), 404, "not-found")
    assert_problem(
        await client.post("/conversations/doomed/runs", json={"prompts": ["x"]}), 404, "not-found"
    )
    assert_problem(await client.delete("/conversations/doomed"), 404, "not-found")
    listed = (await client.get("/conversations")).json()["items"]
    assert [c["id"] for c in listed] == ["kept"]

    # the same id starts from nothing: no run, transcript entry or message survived
    recreated = await client.post("/conversations", json={"id": "doomed"})
    assert recreated.status_code == 201
    meta = recreated.json()
    assert (meta["message_count"], meta["run_count"], meta["transcript_count"]) == (0, 0, 0)
    assert (await client.get("/conversations/doomed/runs")).json()["items"] == []
    assert (await client.get("/conversations/doomed/transcript")).json()["items"] == []
    assert_problem(await client.get(f"/conversations/doomed/runs/{run_id}"), 404, "not-found")
    assert (await client.get("/conversations/doomed/context")).json()["messages"] == []

    # the other conversation is untouched
    kept = (await client.get("/conversations/kept")).json()
    assert (kept["run_count"], kept["message_count"]) == (1, 2)
