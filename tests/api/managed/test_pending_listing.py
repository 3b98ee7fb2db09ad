"""``GET /conversations?has_pending_action=…`` through HTTP, on both engines (issue 14,
docs/conversations.md): the conversations whose stored context awaits client tool results or
approvals, as every write of the context leaves them (a run that pauses, the run that answers,
PUT, compaction, keep-on-failure, fork, import), combined with the other filters and paged; and
a listing reads the pending calls from the conversation rows — a constant number of statements
for any number of items, never a message row.
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from sqlalchemy import event

from app.clock import ManualClock

from ...helpers import assert_problem, user
from ..conftest import AppClient
from ..test_client_tools_http import LOOKUP, RAW_ARGS, tool_result
from ..test_context import assistant, context, tool_call


async def create(client: AppClient, conv_id: str, **body: Any) -> None:
    created = await client.post("/conversations", json={"id": conv_id, **body})
    assert created.status_code == 201, created.text


async def listed(client: AppClient, **params: Any) -> list[dict[str, Any]]:
    got = await client.get("/conversations", params=params)
    assert got.status_code == 200, got.text
    items: list[dict[str, Any]] = got.json()["items"]
    return items


async def ids(client: AppClient, **params: Any) -> list[str]:
    return [c["id"] for c in await listed(client, **params)]


async def pending(client: AppClient, **params: Any) -> set[str]:
    return set(await ids(client, has_pending_action="true", **params))


async def settled(client: AppClient, **params: Any) -> set[str]:
    return set(await ids(client, has_pending_action="false", **params))


async def run_ok(client: AppClient, conv_id: str, **body: Any) -> dict[str, Any]:
    answer = await client.post(f"/conversations/{conv_id}/runs", json=body)
    assert answer.status_code == 201, answer.text
    found: dict[str, Any] = answer.json()
    return found


async def pause_on_lookup(client: AppClient, conv_id: str, **extra: Any) -> dict[str, Any]:
    """A run that calls the client tool ``lookup`` and pauses; its pending call."""
    body = await run_ok(
        client, conv_id, prompts=[f"/tool lookup {RAW_ARGS}"], tools=[LOOKUP], **extra
    )
    assert body["status"] == "requires_action", body
    [call] = body["required_action"]["tool_calls"]
    return dict(call)


async def put_context(client: AppClient, conv_id: str, body: dict[str, Any]) -> httpx.Response:
    """Replace the context (If-Match of the current ETag), or create with it (If-None-Match)."""
    current = await client.get(f"/conversations/{conv_id}")
    headers = (
        {"If-Match": current.headers["etag"]}
        if current.status_code == 200
        else {"If-None-Match": "*"}
    )
    put = await client.put(f"/conversations/{conv_id}/context", json=body, headers=headers)
    assert put.status_code in (200, 201), put.text
    return put


#: a context that awaits the client call c1 (``lookup`` is no server tool)
AWAITING = context(
    user("look it up"), assistant(tool_call("c1", "lookup", '{"word":"ünï"}')), system_prompt=""
)


# --- the filter follows every write of the context ------------------------------------------


async def test_a_client_tool_pause_is_pending_until_the_resuming_run_answers_it(
    client: AppClient,
) -> None:
    await create(client, "paused")
    await create(client, "plain")
    await run_ok(client, "plain", prompts=["hello"])
    assert await pending(client) == set()
    assert await settled(client) == {"paused", "plain"}

    call = await pause_on_lookup(client, "paused")
    assert call["kind"] == "client"
    assert await pending(client) == {"paused"}
    assert await settled(client) == {"plain"}
    [item] = await listed(client, has_pending_action="true")
    assert item["pending_tool_calls"] == [call]
    # no filter: both, each with what it awaits
    by_id = {c["id"]: c["pending_tool_calls"] for c in await listed(client)}
    assert by_id == {"paused": [call], "plain": []}

    done = await run_ok(client, "paused", prompts=[tool_result(call["id"], "lookup", "found")])
    assert done["status"] == "completed", done
    assert await pending(client) == set()
    assert await settled(client) == {"paused", "plain"}
    assert (await client.get("/conversations/paused")).json()["pending_tool_calls"] == []


async def test_an_approval_pause_is_pending_with_its_kind_until_decided(
    client: AppClient,
) -> None:
    await create(client, "careful")
    body = await run_ok(
        client, "careful", prompts=["/tool time_now {}"], require_approval=["time_now"]
    )
    assert body["status"] == "requires_action", body
    [call] = body["required_action"]["tool_calls"]
    assert await pending(client) == {"careful"}
    [item] = await listed(client, has_pending_action="true")
    assert item["pending_tool_calls"] == [call]
    assert call["kind"] == "approval"  # time_now is a server tool of the profile

    decided = await run_ok(
        client, "careful", approvals=[{"tool_call_id": call["id"], "approve": True}]
    )
    assert decided["status"] == "completed", decided
    assert await pending(client) == set()
    assert await settled(client) == {"careful"}


async def test_a_put_of_a_context_ending_in_an_unanswered_call_is_pending(
    client: AppClient,
) -> None:
    # created with it (If-None-Match: *), and replaced over a conversation that awaited nothing
    await put_context(client, "created", AWAITING)
    await create(client, "replaced")
    await put_context(client, "replaced", AWAITING)
    assert await pending(client) == {"created", "replaced"}
    [item, _] = await listed(client, has_pending_action="true")
    assert item["pending_tool_calls"] == [
        {"id": "c1", "name": "lookup", "arguments": '{"word":"ünï"}', "kind": "client"}
    ]

    # a PUT that answers the call: it awaits nothing any more
    answered = context(
        *AWAITING["messages"], tool_result("c1", "lookup", "found"), system_prompt=""
    )
    await put_context(client, "replaced", answered)
    assert await pending(client) == {"created"}
    assert await settled(client) == {"replaced"}

    # the kind is the profile's when read: a call to a server tool of the (default) profile
    # awaits an approval
    gated = context(user("what time?"), assistant(tool_call("t1", "time_now", "{}")))
    await put_context(client, "gated", gated)
    got = (await client.get("/conversations/gated")).json()
    assert [c["kind"] for c in got["pending_tool_calls"]] == ["approval"]
    assert await pending(client) == {"created", "gated"}
    await client.delete("/conversations/gated")

    # a PUT refused (unreplayable: the unanswered call is not the last batch) changes nothing
    broken = context(*AWAITING["messages"], user("and?"), system_prompt="")
    etag = (await client.get("/conversations/created")).headers["etag"]
    refused = await client.put(
        "/conversations/created/context", json=broken, headers={"If-Match": etag}
    )
    assert_problem(refused, 422, "unreplayable-context")
    assert await pending(client) == {"created"}


async def test_compaction_and_keep_on_failure_saves_keep_the_row_current(
    client: AppClient,
) -> None:
    await create(client, "c")
    await run_ok(client, "c", prompts=["an earlier turn"])
    call = await pause_on_lookup(client, "c")
    compacted = await client.post("/conversations/c/compact")
    assert compacted.status_code == 201, compacted.text
    assert compacted.json()["compactions"], "the earlier turn was folded"
    assert await pending(client) == {"c"}

    # a resume whose provider fails after the answer was admitted, kept: nothing pending
    answer = tool_result(call["id"], "lookup", "found")
    failed = await run_ok(client, "c", prompts=[answer, "/fail"], on_failure="keep")
    assert failed["status"] == "failed"
    assert await pending(client) == set()

    # discarded, the answer is not stored: still pending
    await create(client, "d")
    call = await pause_on_lookup(client, "d")
    answer = tool_result(call["id"], "lookup", "found")
    failed = await run_ok(client, "d", prompts=[answer, "/fail"], on_failure="discard")
    assert failed["status"] == "failed"
    assert await pending(client) == {"d"}


async def test_fork_and_import_carry_what_their_context_awaits(client: AppClient) -> None:
    await create(client, "src")
    await run_ok(client, "src", prompts=["first"])
    call = await pause_on_lookup(client, "src")

    whole = await client.post("/conversations/src/fork", json={"id": "whole"})
    assert whole.status_code == 201, whole.text
    assert whole.json()["pending_tool_calls"] == [call]
    # a cut before the pausing turn copies a context that awaits nothing
    cut = await client.post("/conversations/src/fork", json={"id": "cut", "messages": 2})
    assert cut.status_code == 201, cut.text
    assert cut.json()["pending_tool_calls"] == []

    document = (await client.get("/conversations/src/export")).json()
    imported = await client.post("/conversations/import", params={"id": "copy"}, json=document)
    assert imported.status_code == 201, imported.text
    assert await pending(client) == {"src", "whole", "copy"}
    assert await settled(client) == {"cut"}
    by_id = {c["id"]: c["pending_tool_calls"] for c in await listed(client)}
    assert by_id["copy"] == by_id["whole"] == [call]


# --- with the other filters, paged ----------------------------------------------------------


@pytest.mark.parametrize("order", ["desc", "asc"])
async def test_combined_with_metadata_and_paged_by_a_stable_cursor(
    client: AppClient, clock: ManualClock, order: str
) -> None:
    # the clock stands still: every conversation has the same updated_at; the id breaks ties
    awaiting: list[str] = []
    for i in range(9):
        conv_id = f"c{i}"
        await create(client, conv_id, metadata={"group": "g" if i % 3 else "h"})
        if i % 2 == 0:
            await put_context(client, conv_id, AWAITING)
            if i % 3:
                awaiting.append(conv_id)  # in group g and pending: c2, c4, c8

    async def pages(value: str) -> list[str]:
        seen: list[str] = []
        cursor = None
        while True:
            params: dict[str, Any] = {
                "limit": 2,
                "order": order,
                "metadata.group": "g",
                "has_pending_action": value,
            }
            if cursor:
                params["cursor"] = cursor
            got = await client.get("/conversations", params=params)
            assert got.status_code == 200, got.text
            page = got.json()
            assert len(page["items"]) <= 2
            seen += [c["id"] for c in page["items"]]
            cursor = page["next_cursor"]
            if cursor is None:
                return seen

    expected = sorted(awaiting, reverse=order == "desc")
    assert expected and await pages("true") == expected
    rest = [f"c{i}" for i in range(9) if i % 3 and f"c{i}" not in awaiting]
    assert await pages("false") == sorted(rest, reverse=order == "desc")
    # with active: none of them has a run in flight
    assert await pending(client, active="true") == set()
    assert await pending(client, active="false") == {f"c{i}" for i in range(0, 9, 2)}


async def test_a_bad_value_is_422_naming_the_parameter(client: AppClient) -> None:
    got = await client.get("/conversations", params={"has_pending_action": "maybe"})
    problem = assert_problem(got, 422, "validation-error")
    assert "has_pending_action" in problem["errors"][0]["path"]


# --- a listing reads rows, not messages ------------------------------------------------------

_COUNTED: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("counted", default=None)
_IN_LIST = re.compile(r"IN \([^()]*\)")
_NUMBERED = re.compile(r"\$[0-9]+")


def _shape(statement: str) -> str:
    """A statement with its IN lists and numbered parameters put to one form."""
    return _NUMBERED.sub("$?", _IN_LIST.sub("IN (…)", " ".join(statement.split())))


@contextmanager
def statements(client: AppClient) -> Iterator[list[str]]:
    """The statements run on behalf of this task — the requests it sends through the ASGI
    transport (background loops of the app run in contexts of their own), transaction
    control and the access check's key count left out."""
    seen: list[str] = []

    def after(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        found = _COUNTED.get()
        if found is None or statement.split()[0].upper() in ("BEGIN", "COMMIT"):
            return
        # the access check counts the API keys now and then (every api_key_cache_seconds of
        # the wall clock, in whichever request comes): not the listing's, and not per item
        if "FROM api_keys" not in statement:
            found.append(_shape(statement))

    engine = client.app.state.services.engine.sync_engine
    event.listen(engine, "after_cursor_execute", after)
    token = _COUNTED.set(seen)
    try:
        yield seen
    finally:
        _COUNTED.reset(token)
        event.remove(engine, "after_cursor_execute", after)


async def test_a_listing_runs_the_same_statements_for_2_and_for_20_items(
    client: AppClient,
) -> None:
    seen: dict[int, dict[str, list[str]]] = {}
    made = 0
    for size in (2, 20):
        while made < size:  # each with a run; every other one awaits a client call
            conv_id = f"c{made:02d}"
            await create(client, conv_id, metadata={"n": str(made)})
            if made % 2:
                await pause_on_lookup(client, conv_id)
            else:
                await run_ok(client, conv_id, prompts=["hi"])
            made += 1
        seen[size] = {}
        for name, params in {
            "all": {},
            "pending": {"has_pending_action": "true"},
            "settled": {"has_pending_action": "false"},
        }.items():
            with statements(client) as ran:
                items = await listed(client, limit=50, **params)
            assert len(items) == {"all": size, "pending": size // 2, "settled": size // 2}[name]
            seen[size][name] = ran
        for item in await listed(client, limit=50, has_pending_action="true"):
            assert [c["kind"] for c in item["pending_tool_calls"]] == ["client"]
    assert seen[2] == seen[20]
    for ran in seen[20].values():
        # the page, the runs (count and latest profile), the metadata: no message row
        assert len(ran) == 3, ran
        assert not any("context_messages" in s for s in ran)

    # GET one conversation: its row with its runs' count and latest profile, then its
    # metadata (it has some)
    with statements(client) as ran:
        got = await client.get("/conversations/c01")
    assert got.status_code == 200
    assert len(got.json()["pending_tool_calls"]) == 1
    assert len(ran) == 2 and not any("context_messages" in s for s in ran), ran
