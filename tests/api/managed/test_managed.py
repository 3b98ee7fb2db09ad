"""Conversations as managed objects through HTTP, on both engines (docs/conversations.md):
metadata and its merge patch, search and keyset paging, retention sweeping, fork, and
export/import."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from app.clock import ManualClock
from app.store import tables

from ...fakes.gated import GatedProvider, gated_pool
from ...helpers import assert_problem, until, user
from ..conftest import AppClient, SettingsFactory
from ..test_context import FULL, assistant, context, tool_call, tool_result

MERGE = {"content-type": "application/merge-patch+json"}


async def create(client: AppClient, conv_id: str, **body: Any) -> dict[str, Any]:
    created = await client.post("/conversations", json={"id": conv_id, **body})
    assert created.status_code == 201, created.text
    found: dict[str, Any] = created.json()
    return found


async def patch(client: AppClient, conv_id: str, body: Any) -> httpx.Response:
    return await client.patch(f"/conversations/{conv_id}", json=body, headers=MERGE)


async def ids(client: AppClient, **params: Any) -> list[str]:
    listed = await client.get("/conversations", params=params)
    assert listed.status_code == 200, listed.text
    return [c["id"] for c in listed.json()["items"]]


async def run(client: AppClient, conv_id: str, prompt: str) -> dict[str, Any]:
    answer = await client.post(f"/conversations/{conv_id}/runs", json={"prompts": [prompt]})
    assert answer.status_code == 201, answer.text
    found: dict[str, Any] = answer.json()
    return found


async def context_of(client: AppClient, conv_id: str) -> tuple[dict[str, Any], str]:
    got = await client.get(f"/conversations/{conv_id}/context")
    assert got.status_code == 200, got.text
    return got.json(), got.headers["etag"]


async def row_counts(client: AppClient, conv_id: str) -> dict[str, int]:
    """Rows of every child table of the conversation (and the conversation itself)."""
    engine = client.app.state.services.engine
    found = {}
    async with engine.connect() as conn:
        for table in tables.metadata.sorted_tables:
            if "conversation_id" in table.c:
                where = table.c.conversation_id == conv_id
            elif table.name == "conversations":
                where = table.c.id == conv_id
            else:
                continue
            count = (await conn.execute(select(func.count()).where(where))).scalar_one()
            found[table.name] = int(count)
    return found


# --- metadata -----------------------------------------------------------------------------


async def test_metadata_is_set_on_create_and_shown_in_get_and_listings(client: AppClient) -> None:
    body = await create(client, "m1", metadata={"user": "u-17", "topic": "billing"})
    assert body["metadata"] == {"user": "u-17", "topic": "billing"}
    assert body["expires_at"] is None
    assert (await client.get("/conversations/m1")).json()["metadata"] == body["metadata"]
    [listed] = (await client.get("/conversations")).json()["items"]
    assert listed == (await client.get("/conversations/m1")).json()


@pytest.mark.parametrize(
    ("metadata", "limit"),
    [
        ({f"k{i}": "v" for i in range(4)}, "max_metadata_keys"),
        ({"k": "v" * 11}, "max_metadata_value_chars"),
        ({"k" * 9: "v"}, "max_metadata_key_chars"),
    ],
)
async def test_metadata_over_the_configured_limits_is_422(
    managed: Callable[..., Any], metadata: dict[str, str], limit: str
) -> None:
    limits = {"max_metadata_keys": 3, "max_metadata_value_chars": 10, "max_metadata_key_chars": 8}
    async with managed(**limits) as client:
        refused = await client.post("/conversations", json={"id": "x", "metadata": metadata})
        assert assert_problem(refused, 422, "limit-exceeded")["limit"] == limit
        assert (await client.get("/conversations/x")).status_code == 404


@pytest.mark.parametrize(
    "metadata",
    [{"": "v"}, {"bad key": "v"}, {"k": 1}, {"k": None}, {"k": {"nested": "x"}}, {"k": "a\u0000b"}],
)
async def test_metadata_must_be_flat_strings_with_plain_keys(
    client: AppClient, metadata: dict[str, Any]
) -> None:
    refused = await client.post("/conversations", json={"id": "x", "metadata": metadata})
    problem = assert_problem(refused, 422, "validation-error")
    assert problem["errors"][0]["path"].startswith("body.metadata"), problem


async def test_merge_patch_sets_removes_and_keeps_keys_without_touching_the_context(
    client: AppClient, clock: ManualClock
) -> None:
    created = await create(client, "p", metadata={"a": "1", "b": "2", "c": "3"})
    _, etag = await context_of(client, "p")
    clock.advance(5)
    patched = await patch(client, "p", {"metadata": {"a": "one", "b": None, "d": "4"}})
    assert patched.status_code == 200, patched.text
    body = patched.json()
    assert body["metadata"] == {"a": "one", "c": "3", "d": "4"}
    assert patched.headers["etag"] == etag == body["etag"] == created["etag"]
    assert (await context_of(client, "p"))[1] == etag  # metadata is not part of the Context
    assert body["updated_at"] > created["updated_at"]
    # an empty patch changes nothing; removing a key that is not there is fine
    again = await patch(client, "p", {"metadata": {"zzz": None}})
    assert again.json()["metadata"] == {"a": "one", "c": "3", "d": "4"}
    assert (await patch(client, "p", {})).json()["metadata"] == {"a": "one", "c": "3", "d": "4"}
    # null for the whole member removes it, i.e. every key
    cleared = await patch(client, "p", {"metadata": None})
    assert cleared.json()["metadata"] == {}
    assert cleared.headers["etag"] == etag


async def test_a_patch_over_the_key_limit_writes_nothing(managed: Callable[..., Any]) -> None:
    async with managed(max_metadata_keys=2) as client:
        await create(client, "p", metadata={"a": "1"})
        refused = await patch(client, "p", {"metadata": {"a": None, "b": "2", "c": "3", "d": "4"}})
        assert assert_problem(refused, 422, "limit-exceeded")["limit"] == "max_metadata_keys"
        assert (await client.get("/conversations/p")).json()["metadata"] == {"a": "1"}
        # replacing within the limit is fine
        assert (await patch(client, "p", {"metadata": {"a": None, "b": "2", "c": "3"}})).json()[
            "metadata"
        ] == {"b": "2", "c": "3"}


async def test_patch_needs_the_merge_patch_media_type_and_a_conversation(
    client: AppClient,
) -> None:
    await create(client, "p")
    plain = await client.patch("/conversations/p", json={"metadata": {"a": "1"}})
    assert_problem(plain, 415, "unsupported-media-type")
    assert (await client.get("/conversations/p")).json()["metadata"] == {}
    assert_problem(await patch(client, "ghost", {"metadata": {"a": "1"}}), 404, "not-found")
    bad = await patch(client, "p", {"metadata": {"a": 5}})
    assert assert_problem(bad, 422, "validation-error")["errors"][0]["path"] == "body.metadata.a"
    # no text column holds NUL (PostgreSQL's cannot): refused on both engines, nothing written
    nul = await patch(client, "p", {"metadata": {"b": "ok", "a": "x\u0000"}})
    assert assert_problem(nul, 422, "validation-error")["errors"][0]["path"] == "body.metadata.a"
    assert (await client.get("/conversations/p")).json()["metadata"] == {}
    assert_problem(await patch(client, "p", {"surprise": 1}), 422, "validation-error")


# --- search -------------------------------------------------------------------------------


async def test_filters_by_metadata_all_must_match(client: AppClient) -> None:
    await create(client, "a", metadata={"user": "u1", "topic": "billing"})
    await create(client, "b", metadata={"user": "u1", "topic": "shipping"})
    await create(client, "c", metadata={"user": "u2", "topic": "billing"})
    await create(client, "d")
    assert set(await ids(client, **{"metadata.user": "u1"})) == {"a", "b"}
    assert await ids(client, **{"metadata.user": "u1", "metadata.topic": "billing"}) == ["a"]
    assert await ids(client, **{"metadata.user": "nobody"}) == []
    # the same key twice with two values: no conversation has both
    both = await client.get("/conversations?metadata.user=u1&metadata.user=u2")
    assert both.json()["items"] == []
    bad = await client.get("/conversations", params={"metadata.bad key": "x"})
    problem = assert_problem(bad, 422, "validation-error")
    assert problem["errors"][0]["path"] == "query.metadata.bad key"
    # no stored value holds NUL: a filter with one is refused, not sent to the database
    nul = await client.get("/conversations", params={"metadata.user": "u1\u0000"})
    problem = assert_problem(nul, 422, "validation-error")
    assert problem["errors"][0]["path"] == "query.metadata.user"


async def test_ordered_by_update_time_with_updated_after_and_before(
    client: AppClient, clock: ManualClock
) -> None:
    start = clock.now()
    for conv_id in ("old", "mid", "new"):
        await create(client, conv_id)
        clock.advance(10)
    assert await ids(client) == ["new", "mid", "old"]
    assert await ids(client, order="asc") == ["old", "mid", "new"]
    # an update moves it to the front
    await patch(client, "old", {"metadata": {"touched": "yes"}})
    assert await ids(client) == ["old", "new", "mid"]
    after = (start + timedelta(seconds=5)).isoformat()
    before = (start + timedelta(seconds=25)).isoformat()
    assert await ids(client, updated_after=after, updated_before=before) == ["new", "mid"]
    naive = await client.get("/conversations", params={"updated_after": "2026-01-01T00:00:00"})
    assert_problem(naive, 422, "validation-error")
    # a time whose offset carries it past year 9999 (or before year 1) in UTC is no time
    for name, edge in (
        ("updated_before", "9999-12-31T23:59:59-01:00"),
        ("updated_after", "0001-01-01T00:00:00+01:00"),
    ):
        got = await client.get("/conversations", params={name: edge})
        problem = assert_problem(got, 422, "validation-error")
        assert problem["errors"][0]["path"] == f"query.{name}", problem
    far = await client.patch("/conversations/old", json={"expires_at": "9999-12-31T23:59:59-01:00"})
    assert_problem(far, 422, "validation-error")
    assert await ids(client, updated_before="9999-12-31T23:59:59Z") == ["old", "new", "mid"]


@pytest.mark.parametrize("order", ["desc", "asc"])
async def test_cursor_paging_is_stable_on_equal_update_times(
    client: AppClient, clock: ManualClock, order: str
) -> None:
    # the clock stands still: every conversation has the same updated_at; the id breaks ties
    names = [f"c{i:02d}" for i in range(7)]
    for conv_id in names:
        await create(client, conv_id, metadata={"group": "g"})
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 3, "order": order, "metadata.group": "g"}
        if cursor:
            params["cursor"] = cursor
        page = (await client.get("/conversations", params=params)).json()
        seen += [c["id"] for c in page["items"]]
        # a conversation created between pages does not disturb the pages after the cursor
        if len(seen) == 3:
            clock.advance(1)
            await create(client, "late", metadata={"group": "g"})
        cursor = page["next_cursor"]
        if cursor is None:
            break
    expected = sorted(names, reverse=order == "desc")
    assert seen == ([*expected, "late"] if order == "asc" else expected)


async def test_a_cursor_is_a_position_in_either_order(
    client: AppClient, clock: ManualClock
) -> None:
    for conv_id in ("a", "b", "c"):
        await create(client, conv_id)
        clock.advance(1)
    cursor = (await client.get("/conversations", params={"limit": 2})).json()["next_cursor"]
    assert await ids(client, cursor=cursor) == ["a"]  # after c, b (newest first)
    assert await ids(client, cursor=cursor, order="asc") == ["c"]  # after b, oldest first
    for bad in ("id.a", "at.x.a", "at.1.", "at.1234567890123456789.a"):
        assert_problem(
            await client.get("/conversations", params={"cursor": bad}), 400, "bad-cursor"
        )
    # a position after which there is nothing is an empty page
    assert await ids(client, cursor="at.0.a") == []
    assert await ids(client, cursor="at.999999999999999999.a", order="asc") == []
    assert await ids(client, cursor="at.999999999999999999.a") == ["c", "b", "a"]


async def test_active_filters_conversations_with_a_run_in_flight(
    managed: Callable[..., Any], make_settings: SettingsFactory
) -> None:
    gate = GatedProvider(hold=lambda prompt: prompt.startswith("held"))
    async with managed(agents=gated_pool(make_settings(), gate)) as client:
        await create(client, "busy")
        await create(client, "idle")
        running = asyncio.create_task(
            client.post("/conversations/busy/runs", json={"prompts": ["held"]})
        )
        held = await gate.arrival()
        assert await ids(client, active="true") == ["busy"]
        assert await ids(client, active="false") == ["idle"]
        held.release()
        assert (await running).status_code == 201
        assert await ids(client, active="true") == []


# --- retention ----------------------------------------------------------------------------


async def sweep(client: AppClient) -> int:
    deleted: int = await client.app.state.services.conversations.sweep()
    return deleted


async def test_ttl_expiry_deletes_every_record_and_then_it_is_404_everywhere(
    client: AppClient, clock: ManualClock
) -> None:
    await create(client, "t", ttl_seconds=60, metadata={"k": "v"})
    await create(client, "keep")
    await run(client, "t", "hello")
    await client.post(
        "/conversations/t/runs", json={"prompts": ["again"]}, headers={"Idempotency-Key": "k1"}
    )
    expires = (await client.get("/conversations/t")).json()["expires_at"]
    assert expires == (clock.now() + timedelta(seconds=60)).isoformat().replace("+00:00", "Z")
    before = await row_counts(client, "t")
    assert all(before[name] for name in ("runs", "transcript", "conversation_metadata"))
    assert before["idempotency_keys"] == 1

    clock.advance(59)
    assert await sweep(client) == 0
    assert (await client.get("/conversations/t")).status_code == 200
    clock.advance(1)
    assert await sweep(client) == 1

    assert set((await row_counts(client, "t")).values()) == {0}
    for path in ("", "/context", "/runs", "/transcript", "/export"):
        assert_problem(await client.get(f"/conversations/t{path}"), 404, "not-found")
    assert_problem(await patch(client, "t", {"metadata": {"k": None}}), 404, "not-found")
    assert await ids(client) == ["keep"]


async def test_expires_at_is_set_and_cleared_by_patch(
    client: AppClient, clock: ManualClock
) -> None:
    await create(client, "e")
    when = clock.now() + timedelta(seconds=30)
    set_ = await patch(client, "e", {"expires_at": when.isoformat()})
    assert set_.json()["expires_at"] is not None
    cleared = await patch(client, "e", {"expires_at": None})
    assert cleared.json()["expires_at"] is None
    clock.advance(60)
    assert await sweep(client) == 0
    await patch(client, "e", {"ttl_seconds": 10})
    clock.advance(10)
    assert await sweep(client) == 1
    both = await client.post(
        "/conversations", json={"ttl_seconds": 5, "expires_at": when.isoformat()}
    )
    assert_problem(both, 422, "validation-error")


async def test_the_default_retention_counts_from_the_last_update(
    managed: Callable[..., Any], clock: ManualClock
) -> None:
    async with managed(retention_seconds=100) as client:
        await create(client, "idle")
        await create(client, "used")
        await create(client, "pinned", expires_at=(clock.now() + timedelta(days=1)).isoformat())
        clock.advance(60)
        await run(client, "used", "still here")  # a run updates it
        clock.advance(40)
        assert await sweep(client) == 1
        assert await ids(client) == ["used", "pinned"]
        clock.advance(60)
        assert await sweep(client) == 1  # "used", 100 s after its run
        assert await ids(client) == ["pinned"]  # its own expiry wins over the default


async def test_a_run_in_flight_holds_off_the_sweeper_until_it_ends(
    managed: Callable[..., Any], make_settings: SettingsFactory, clock: ManualClock
) -> None:
    gate = GatedProvider(hold=lambda prompt: prompt.startswith("held"))
    async with managed(agents=gated_pool(make_settings(), gate)) as client:
        await create(client, "r", ttl_seconds=10)
        running = asyncio.create_task(
            client.post("/conversations/r/runs", json={"prompts": ["held"]})
        )
        held = await gate.arrival()
        clock.advance(20)
        assert await sweep(client) == 0
        held.release()
        assert (await running).status_code == 201
        assert await sweep(client) == 1
        assert (await client.get("/conversations/r")).status_code == 404


async def test_the_sweeper_deletes_in_bounded_batches(
    managed: Callable[..., Any], clock: ManualClock
) -> None:
    async with managed(retention_sweep_batch=2) as client:
        for i in range(5):
            await create(client, f"x{i}", ttl_seconds=1)
        clock.advance(1)
        repo = client.app.state.services.runs.keeper.lease_stores.conversations
        assert await repo.sweep_expired(default_seconds=None, batch=2) == 2
        assert len(await ids(client)) == 3
        assert await sweep(client) == 3  # the rest, two at a time
        assert await ids(client) == []


async def test_the_periodic_tick_sweeps(managed: Callable[..., Any], clock: ManualClock) -> None:
    async with managed(lease_seconds=0.3, retention_sweep_seconds=30) as client:
        await create(client, "gone", ttl_seconds=5)
        clock.advance(31)  # past the expiry, and the sweep interval by the monotonic clock

        async def deleted() -> bool | None:
            return True if (await client.get("/conversations/gone")).status_code == 404 else None

        assert await until(deleted, what="the tick swept the expired conversation")


# --- fork ---------------------------------------------------------------------------------

TOOLS = context(
    user("look it up"),
    assistant(tool_call("call_1", "lookup", "{}")),
    tool_result("call_1", "lookup", "found"),
    assistant({"type": "text", "text": "it is found"}),
    summary="earlier talk",
)


async def put(client: AppClient, conv_id: str, body: dict[str, Any]) -> str:
    written = await client.put(
        f"/conversations/{conv_id}/context", json=body, headers={"If-None-Match": "*"}
    )
    assert written.status_code == 201, written.text
    return written.headers["etag"]


async def test_fork_copies_the_context_and_starts_its_own_history(client: AppClient) -> None:
    source_etag = await put(client, "src", TOOLS)
    await patch(client, "src", {"metadata": {"user": "u1"}})
    stored, _ = await context_of(client, "src")
    before = await client.get("/conversations/src/transcript")
    forked = await client.post("/conversations/src/fork", json={"id": "fk"})
    assert forked.status_code == 201, forked.text
    assert forked.headers["location"] == "/conversations/fk"
    body = forked.json()
    assert body["metadata"] == {"user": "u1"}  # copied when not given
    assert forked.headers["etag"] == body["etag"] != source_etag
    got, etag = await context_of(client, "fk")
    assert got == stored and etag == body["etag"]
    [entry] = (await client.get("/conversations/fk/transcript")).json()["items"]
    assert entry["kind"] == "forked" and entry["seq"] == 1
    assert entry["body"] == {"source_id": "src", "source_etag": source_etag, "messages": 4}
    # the source is unchanged
    assert await context_of(client, "src") == (stored, source_etag)
    assert (await client.get("/conversations/src/transcript")).json() == before.json()


@pytest.mark.parametrize("n", [0, 1, 3])
async def test_fork_at_a_safe_cut(client: AppClient, n: int) -> None:
    source_etag = await put(client, "src", TOOLS)
    stored, _ = await context_of(client, "src")
    forked = await client.post(
        "/conversations/src/fork",
        json={"id": "fk", "messages": n, "metadata": {"from": "src"}},
        headers={"If-Match": source_etag},
    )
    assert forked.status_code == 201, forked.text
    assert forked.json()["metadata"] == {"from": "src"}
    assert forked.json()["message_count"] == n
    got, _ = await context_of(client, "fk")
    assert got["messages"] == stored["messages"][:n]
    assert (got["system_prompt"], got["summary"]) == (TOOLS["system_prompt"], TOOLS["summary"])
    entry = (await client.get("/conversations/fk/transcript")).json()["items"][0]
    assert entry["body"]["messages"] == n


@pytest.mark.parametrize(("n", "slug"), [(2, "unsafe-cut")])
async def test_fork_at_an_unsafe_cut_is_422_and_writes_nothing(
    client: AppClient, n: int, slug: str
) -> None:
    await put(client, "src", TOOLS)
    refused = await client.post("/conversations/src/fork", json={"id": "fk", "messages": n})
    assert assert_problem(refused, 422, slug)["messages"] == n
    assert (await client.get("/conversations/fk")).status_code == 404
    assert set((await row_counts(client, "fk")).values()) == {0}


async def test_fork_refusals(client: AppClient) -> None:
    etag = await put(client, "src", TOOLS)
    await create(client, "taken")
    assert_problem(
        await client.post("/conversations/src/fork", json={"id": "taken"}),
        409,
        "conversation-exists",
    )
    assert_problem(await client.post("/conversations/ghost/fork"), 404, "not-found")
    stale = await client.post(
        "/conversations/src/fork", json={"id": "new"}, headers={"If-Match": '"x-1"'}
    )
    assert assert_problem(stale, 412, "precondition-failed")["current_etag"] == etag
    assert (await client.get("/conversations/new")).status_code == 404
    assert_problem(
        await client.post("/conversations/src/fork", json={"messages": -1}),
        422,
        "validation-error",
    )
    generated = await client.post("/conversations/src/fork")
    assert generated.status_code == 201 and generated.json()["id"].startswith("conv_")


async def test_fork_then_run_on_both_sides_independently(client: AppClient) -> None:
    await create(client, "src")
    await run(client, "src", "first")
    forked = await client.post("/conversations/src/fork", json={"id": "fk"})
    assert forked.status_code == 201
    await run(client, "src", "source turn")
    await run(client, "fk", "fork turn")
    src, src_etag = await context_of(client, "src")
    fk, fk_etag = await context_of(client, "fk")
    texts = lambda ctx: [  # noqa: E731
        b["text"] for m in ctx["messages"] if m["type"] == "user" for b in m["content"]
    ]
    assert texts(src) == ["first", "source turn"]
    assert texts(fk) == ["first", "fork turn"]
    assert src_etag != fk_etag
    assert (await client.get("/conversations/fk")).json()["run_count"] == 1
    assert (await client.get("/conversations/src")).json()["run_count"] == 2


# --- export / import ------------------------------------------------------------------------


def without(document: dict[str, Any], *fields: str) -> dict[str, Any]:
    conversation = {k: v for k, v in document["conversation"].items() if k not in fields}
    return {**document, "conversation": conversation}


async def export(client: AppClient, conv_id: str) -> dict[str, Any]:
    got = await client.get(f"/conversations/{conv_id}/export")
    assert got.status_code == 200, got.text
    found: dict[str, Any] = got.json()
    return found


async def rich_conversation(client: AppClient, clock: ManualClock) -> None:
    await put(client, "src", FULL)
    await patch(client, "src", {"metadata": {"user": "u1", "topic": "ünï"}, "ttl_seconds": 3600})
    clock.advance(1)
    await run(client, "src", "hello")
    await client.post("/conversations/src/compact", json={})
    await run(client, "src", "again")


async def test_export_then_import_then_export_is_equal(
    client: AppClient, clock: ManualClock
) -> None:
    await rich_conversation(client, clock)
    original = await export(client, "src")
    assert original["format"] == "carryover.conversation" and original["format_version"] == 1
    assert original["context"] == (await context_of(client, "src"))[0]
    assert len(original["runs"]) >= 2 and original["transcript"]
    assert original["conversation"]["metadata"] == {"user": "u1", "topic": "ünï"}

    clock.advance(5)
    imported = await client.post("/conversations/import", params={"id": "copy"}, json=original)
    assert imported.status_code == 201, imported.text
    assert imported.headers["location"] == "/conversations/copy"
    again = await export(client, "copy")
    differs = ("id", "etag", "updated_at")
    assert without(again, *differs) == without(original, *differs)
    assert again["conversation"]["etag"].endswith(f'-{original["conversation"]["version"]}"')
    assert imported.headers["etag"] == again["conversation"]["etag"]

    # the import is a live conversation: it runs on, and its run records are readable
    await run(client, "copy", "onwards")
    assert (
        len((await client.get("/conversations/copy/runs")).json()["items"])
        == len(original["runs"]) + 1
    )


async def test_import_under_its_own_id_and_409_over_an_existing_id(
    client: AppClient, clock: ManualClock
) -> None:
    await rich_conversation(client, clock)
    document = await export(client, "src")
    counts = await row_counts(client, "src")
    taken = await client.post("/conversations/import", json=document)
    assert_problem(taken, 409, "conversation-exists")
    assert await row_counts(client, "src") == counts  # nothing written over it

    await client.delete("/conversations/src")
    restored = await client.post("/conversations/import", json=document)
    assert restored.status_code == 201, restored.text
    differs = ("etag", "updated_at")
    assert without(await export(client, "src"), *differs) == without(document, *differs)


def _attempts(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in document["transcript"] if e["kind"] == "attempt"]


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda d: d.update(format_version=2), "body.format_version"),
        (lambda d: d["context"]["messages"].append({"type": "nope"}), "body.context.messages["),
        (lambda d: d["runs"][0].update(status="running"), "body.runs[0].status"),
        # text columns hold no NUL (PostgreSQL's cannot): refused on both engines
        (lambda d: d["runs"][0].update(agent="a\u0000"), "body.runs[0].agent"),
        (lambda d: d["runs"][0].update(base_etag='"\u0000"'), "body.runs[0].base_etag"),
        (lambda d: d["transcript"][0].update(run_id="r\u0000"), "body.transcript[0].run_id"),
        (
            lambda d: next(r for r in d["runs"] if r["compactions"])["compactions"][0].update(
                summary="s\u0000"
            ),
            "body.runs[",
        ),
        (lambda d: d["context"].update(summary="a\u0000b"), "body.context.summary"),
        (
            lambda d: d["conversation"]["metadata"].update(k="\u0000"),
            "body.conversation.metadata.k",
        ),
        (lambda d: d["conversation"].pop("created_at"), "body.conversation.created_at"),
        (lambda d: d["transcript"].append(dict(d["transcript"][0])), "body"),
        # a kind the transcript does not have: its reads could not serve the entry
        (lambda d: d["transcript"][0].update(kind="eo"), "body.transcript[0].kind"),
        # what the reads of the imported conversation parse must parse
        (lambda d: d["runs"][0].update(usage={"input_tokens": -5}), "body.runs[0].usage"),
        (lambda d: d["runs"][0].update(error={"foo": 1}), "body.runs[0].error"),
        (lambda d: _attempts(d)[0].update(body={"x": 1}), "body.transcript["),
        (
            lambda d: d["transcript"].append(
                {**d["transcript"][-1], "seq": 10**6, "kind": "item_deleted", "body": {"items": 3}}
            ),
            "body.transcript[",
        ),
        (
            lambda d: d["runs"][0]["new_messages"].append({"type": "user"}),
            "body.runs[0].new_messages",
        ),
    ],
)
async def test_an_invalid_document_is_422_with_its_path_and_writes_nothing(
    client: AppClient, clock: ManualClock, mutate: Callable[[dict[str, Any]], Any], path: str
) -> None:
    await rich_conversation(client, clock)
    document = await export(client, "src")
    mutate(document)
    refused = await client.post("/conversations/import", params={"id": "copy"}, json=document)
    problem = assert_problem(refused, 422, "validation-error")
    assert problem["errors"][0]["path"].startswith(path), problem
    assert set((await row_counts(client, "copy")).values()) == {0}


async def test_an_import_keeps_a_version_past_two_to_the_31(
    client: AppClient, clock: ManualClock
) -> None:
    """Any version the document may hold (up to 2**53 - 1) is kept, on both engines, and the
    imported conversation runs on from it."""
    await rich_conversation(client, clock)
    document = await export(client, "src")
    document["conversation"]["version"] = 2**40
    imported = await client.post("/conversations/import", params={"id": "big"}, json=document)
    assert imported.status_code == 201, imported.text
    assert imported.headers["etag"].endswith(f'-{2**40}"')
    await run(client, "big", "onwards")
    assert (await export(client, "big"))["conversation"]["version"] == 2**40 + 1


async def test_an_unreplayable_context_is_not_imported(client: AppClient) -> None:
    await create(client, "src")
    document = await export(client, "src")
    document["context"]["messages"] = [tool_result("call_9", "lookup", "orphan")]
    refused = await client.post("/conversations/import", params={"id": "copy"}, json=document)
    assert_problem(refused, 422, "unreplayable-context")
    assert (await client.get("/conversations/copy")).status_code == 404


async def test_export_of_an_empty_conversation_and_while_a_run_is_in_flight(
    managed: Callable[..., Any], make_settings: SettingsFactory
) -> None:
    gate = GatedProvider(hold=lambda prompt: prompt.startswith("held"))
    async with managed(agents=gated_pool(make_settings(), gate)) as client:
        await create(client, "e", system_prompt="Be brief.")
        empty = await export(client, "e")
        assert empty["context"] == {"system_prompt": "Be brief.", "summary": "", "messages": []}
        assert (empty["transcript"], empty["runs"]) == ([], [])
        running = asyncio.create_task(
            client.post("/conversations/e/runs", json={"prompts": ["held"]})
        )
        held = await gate.arrival()
        busy = await client.get("/conversations/e/export")
        assert_problem(busy, 409, "run-in-progress")
        held.release()
        await running
        assert len((await export(client, "e"))["runs"]) == 1


async def test_export_pages_through_long_histories(
    client: AppClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.store.portability as portability

    monkeypatch.setattr(portability, "EXPORT_PAGE", 2)
    await create(client, "long")
    for i in range(3):
        await run(client, "long", f"turn {i}")
    document = await export(client, "long")
    assert len(document["runs"]) == 3
    assert len(document["context"]["messages"]) == 6
    assert [e["seq"] for e in document["transcript"]] == list(
        range(1, len(document["transcript"]) + 1)
    )
