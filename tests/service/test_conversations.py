"""The conversation service through its own interface, on both engines: what each use case
returns, and that every refusal names its problem type."""

from __future__ import annotations

import pytest

from app.agent.codec import load_context
from app.agent.messages import AssistantMessage, Context, TextBlock, UserMessage
from app.errors import CarryoverError
from app.etag import EntityTag, ETagCondition, parse_condition
from app.service.conversations import NotModified
from app.service.runs import ActiveRun
from tests.helpers import server_calls

from .conftest import TENANT, Services
from .test_context_cache import request, run_on, selects


def condition(etag: str) -> ETagCondition:
    parsed = parse_condition(etag)
    assert parsed is not None
    return parsed


ANY = ETagCondition(any=True)


def refused(info: pytest.ExceptionInfo[CarryoverError], slug: str, status: int) -> None:
    assert (info.value.slug, info.value.status) == (slug, status)


def turn(text: str) -> tuple[UserMessage, AssistantMessage]:
    answer = AssistantMessage(
        content=(TextBlock(text=f"re: {text}"),),
        provider="echo",
        model="echo",
        stop_reason="end_turn",
    )
    return UserMessage.text(text), answer


async def test_create_get_list_delete(services: Services) -> None:
    convs = services.conversations
    made = await convs.create(TENANT, "c1", "be brief")
    assert made.run_count == 0 and made.conversation.system_prompt == "be brief"
    generated = await convs.create(TENANT)
    assert generated.conversation.id.startswith("conv_")
    got = await convs.get(TENANT, "c1")
    assert got.conversation.etag == made.conversation.etag
    with pytest.raises(CarryoverError) as info:
        await convs.create(TENANT, "c1")
    refused(info, "conversation-exists", 409)

    # newest first; the clock stands still, so the id breaks the tie (descending)
    first = await convs.list(TENANT, limit=1)
    assert [i.conversation.id for i in first.items] == [generated.conversation.id] and first.more
    last = first.items[-1].conversation
    rest = await convs.list(TENANT, after=(last.updated_at, last.id), limit=5)
    assert [i.conversation.id for i in rest.items] == ["c1"]
    assert not rest.more
    assert (await convs.list("someone-else")).items == []

    with pytest.raises(CarryoverError) as info:
        await convs.delete(TENANT, "c1", condition('"stale-1"'))
    refused(info, "precondition-failed", 412)
    assert info.value.extras["current_etag"] == made.conversation.etag
    await convs.delete(TENANT, "c1", condition(made.conversation.etag))
    with pytest.raises(CarryoverError) as info:
        await convs.get(TENANT, "c1")
    refused(info, "not-found", 404)
    with pytest.raises(CarryoverError) as info:
        await convs.delete(TENANT, "c1")
    refused(info, "not-found", 404)


async def test_context_put_then_get_and_not_modified(services: Services) -> None:
    convs = services.conversations
    context = Context(system_prompt="s", messages=turn("hi"))
    created = await convs.put_context(TENANT, "c1", context, if_match=None, if_none_match=ANY)
    assert created.created
    loaded = await convs.get_context(TENANT, "c1")
    assert not isinstance(loaded, NotModified)
    assert loaded.context == context and loaded.etag == created.etag

    same = await convs.get_context(TENANT, "c1", condition(created.etag))
    assert same == NotModified(created.etag)
    weak = ETagCondition(any=False, tags=(EntityTag(created.etag.strip('"'), weak=True),))
    assert isinstance(await convs.get_context(TENANT, "c1", weak), NotModified)

    longer = Context(system_prompt="s", messages=(*turn("hi"), *turn("again")))
    replaced = await convs.put_context(
        TENANT, "c1", longer, if_match=condition(created.etag), if_none_match=None
    )
    assert not replaced.created and replaced.etag != created.etag
    changed = await convs.get_context(TENANT, "c1", condition(created.etag))
    assert not isinstance(changed, NotModified) and changed.context == longer

    with pytest.raises(CarryoverError) as info:  # stale If-Match
        await convs.put_context(
            TENANT, "c1", context, if_match=condition(created.etag), if_none_match=None
        )
    refused(info, "precondition-failed", 412)
    assert info.value.extras["current_etag"] == replaced.etag
    with pytest.raises(CarryoverError) as info:  # If-None-Match: * on one that exists
        await convs.put_context(TENANT, "c1", context, if_match=None, if_none_match=ANY)
    refused(info, "precondition-failed", 412)
    assert info.value.extras["current_etag"] == replaced.etag
    with pytest.raises(CarryoverError) as info:
        await convs.put_context(TENANT, "nope", context, if_match=ANY, if_none_match=None)
    refused(info, "not-found", 404)


async def test_an_unreplayable_context_is_refused_with_its_index(services: Services) -> None:
    orphan = {
        "type": "tool_result",
        "tool_call_id": "c9",
        "tool_name": "t",
        "content": [{"type": "text", "text": "x"}],
        "is_error": False,
    }
    user = {"type": "user", "content": [{"type": "text", "text": "a"}]}
    context = load_context({"messages": [user, orphan]})
    with pytest.raises(CarryoverError) as info:
        await services.conversations.put_context(
            TENANT, "c1", context, if_match=None, if_none_match=ANY
        )
    refused(info, "unreplayable-context", 422)
    assert info.value.extras == {"message_index": 1}
    with pytest.raises(CarryoverError):
        await services.conversations.get(TENANT, "c1")  # nothing was created


async def test_transcript_pages_and_compact(services: Services) -> None:
    convs = services.conversations
    context = Context(messages=(*turn("one"), *turn("two"), *turn("three")))
    written = await convs.put_context(TENANT, "c1", context, if_match=None, if_none_match=ANY)
    compacted = await convs.compact(TENANT, "c1", if_match=condition(written.etag))
    assert compacted.outcome.status == "completed" and compacted.outcome.stored
    assert compacted.result.compactions and compacted.run.prompts == []
    assert (await convs.get(TENANT, "c1")).run_count == 1

    first = await convs.transcript(TENANT, "c1", limit=1)
    assert [e.kind for e in first.items] == ["context_replaced"] and first.more
    rest = await convs.transcript(TENANT, "c1", after=first.items[-1].seq, limit=50)
    assert "compaction" in [e.kind for e in rest.items] and not rest.more

    with pytest.raises(CarryoverError) as info:
        await convs.compact(TENANT, "c1", if_match=condition(written.etag))
    refused(info, "precondition-failed", 412)
    with pytest.raises(CarryoverError) as info:
        await convs.transcript(TENANT, "nope")
    refused(info, "not-found", 404)


async def test_get_reads_a_conversation_in_one_statement_and_agrees_with_the_listing(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GET /conversations/{id}: the row, its run count and latest run's profile in one
    # statement; the metadata in a second one only when there is some. What it reports is
    # what a listing (one statement per part, for a page of ids) reports of the same rows.
    convs, runs = services.conversations, services.runs
    await convs.create(TENANT, "none")
    await convs.create(TENANT, "ran")
    await convs.create(TENANT, "tagged", metadata={"b": "2", "a": "1"})
    await convs.create("another-tenant", "ran")  # same id, its own runs: never counted here
    for conv, n in (("ran", 2), ("tagged", 1)):
        for i in range(n):
            await run_on(runs, conv, request(f"hi {i}"))
    other = await runs.start("another-tenant", "ran", request("x"), if_match=None)
    assert isinstance(other, ActiveRun)
    await runs.wait(other, on_disconnect="continue", disconnected=None)

    listed = {i.conversation.id: i for i in (await convs.list(TENANT)).items}
    counts = {}
    for conv in ("none", "ran", "tagged"):
        with selects(services) as statements:
            got = await convs.get(TENANT, conv)
        assert got == listed[conv]
        counts[conv] = len([s for s in statements if s not in ("BEGIN", "COMMIT")])
    assert (listed["ran"].run_count, listed["tagged"].run_count) == (2, 1)
    assert list(listed["tagged"].metadata.items()) == [("a", "1"), ("b", "2")]
    assert (await convs.get("another-tenant", "ran")).run_count == 1
    assert counts == {"none": 1, "ran": 1, "tagged": 2}
    if services.repo.engine.dialect.name == "postgresql":
        with server_calls(monkeypatch) as calls:
            await convs.get(TENANT, "ran")
        assert [c.split()[0] for c in calls if not c.startswith("prepare ")] == ["SELECT"]
    with pytest.raises(CarryoverError) as info:
        await convs.get(TENANT, "missing")
    refused(info, "not-found", 404)
