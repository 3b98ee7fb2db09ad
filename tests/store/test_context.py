"""Stored contexts: lossless round trips and conditional replacement (contract §1, §4)."""

from __future__ import annotations

import pytest

from app.agent.codec import dump_context
from app.agent.messages import Context
from app.store.errors import NotFound, PreconditionFailed
from tests.repository import Repository

from .builders import conversation, rich_context


async def test_a_context_comes_back_exactly_as_it_was_stored(repo: Repository) -> None:
    context = rich_context()
    etag = await repo.replace_context("acme", "c1", context, create=True)
    loaded = await repo.load_context("acme", "c1")
    assert loaded.context == context
    assert dump_context(loaded.context) == dump_context(context)
    assert loaded.etag == etag
    assert (loaded.first_position, loaded.next_position) == (0, len(context.messages))


async def test_an_empty_context_round_trips(repo: Repository) -> None:
    await repo.create_conversation("acme", "c1", "sys")
    loaded = await repo.load_context("acme", "c1")
    assert loaded.context == Context(system_prompt="sys")
    assert (loaded.first_position, loaded.next_position) == (0, 0)


async def test_loading_a_missing_conversation_is_not_found(repo: Repository) -> None:
    with pytest.raises(NotFound):
        await repo.load_context("acme", "ghost")


async def test_create_with_if_none_match_star_refuses_an_existing_one(repo: Repository) -> None:
    await repo.replace_context("acme", "c1", conversation(2), create=True)
    with pytest.raises(PreconditionFailed):
        await repo.replace_context("acme", "c1", conversation(4), create=True)
    assert (await repo.load_context("acme", "c1")).context == conversation(2)


async def test_replace_with_the_current_etag_replaces_and_changes_the_etag(
    repo: Repository,
) -> None:
    first = await repo.replace_context("acme", "c1", conversation(4), create=True)
    second = await repo.replace_context("acme", "c1", conversation(2, summary="s"), if_match=first)
    assert second != first
    loaded = await repo.load_context("acme", "c1")
    assert loaded.context == conversation(2, summary="s")
    assert loaded.etag == second
    # Positions keep growing; the replaced messages are gone.
    assert (loaded.first_position, loaded.next_position) == (4, 6)


async def test_replace_with_a_stale_etag_is_refused_and_writes_nothing(repo: Repository) -> None:
    first = await repo.replace_context("acme", "c1", conversation(4), create=True)
    second = await repo.replace_context("acme", "c1", conversation(6), if_match=first)
    for stale in [first, '"garbage"', "W/" + second, '"' + second.strip('"') + '0"']:
        with pytest.raises(PreconditionFailed) as refused:
            await repo.replace_context("acme", "c1", conversation(2), if_match=stale)
        assert refused.value.current_etag == second
    loaded = await repo.load_context("acme", "c1")
    assert loaded.context == conversation(6)
    assert loaded.etag == second
    assert [e.kind for e in await repo.list_transcript("acme", "c1")] == [
        "context_replaced",
        "context_replaced",
    ]


async def test_replace_with_star_replaces_whatever_is_stored(repo: Repository) -> None:
    await repo.replace_context("acme", "c1", conversation(4), create=True)
    await repo.replace_context("acme", "c1", conversation(2), if_match="*")
    assert (await repo.load_context("acme", "c1")).context == conversation(2)


async def test_replacing_a_missing_conversation_is_not_found_even_with_a_bad_etag(
    repo: Repository,
) -> None:
    for if_match in ['"x-1"', "*", "garbage"]:
        with pytest.raises(NotFound):
            await repo.replace_context("acme", "ghost", conversation(2), if_match=if_match)


async def test_replace_needs_exactly_one_condition(repo: Repository) -> None:
    with pytest.raises(ValueError):
        await repo.replace_context("acme", "c1", conversation(2))
    with pytest.raises(ValueError):
        await repo.replace_context("acme", "c1", conversation(2), if_match="*", create=True)


async def test_every_replacement_is_in_the_transcript(repo: Repository) -> None:
    first = await repo.replace_context("acme", "c1", conversation(2), create=True)
    second = await repo.replace_context("acme", "c1", rich_context(), if_match=first)
    entries = await repo.list_transcript("acme", "c1")
    assert [(e.seq, e.kind, e.run_id) for e in entries] == [
        (1, "context_replaced", None),
        (2, "context_replaced", None),
    ]
    assert entries[1].body == {"etag": second, "context": dump_context(rich_context())}


async def test_if_match_may_be_a_list_of_etags(repo: Repository) -> None:
    first = await repo.replace_context("acme", "c1", conversation(2), create=True)
    second = await repo.replace_context("acme", "c1", conversation(4), if_match=[first, '"x-9"'])
    with pytest.raises(PreconditionFailed):
        await repo.replace_context("acme", "c1", conversation(6), if_match=[first, "W/" + second])
    with pytest.raises(PreconditionFailed):
        await repo.replace_context("acme", "c1", conversation(6), if_match=[])
    await repo.replace_context("acme", "c1", conversation(6), if_match=['"x-9"', second])
    assert (await repo.load_context("acme", "c1")).context == conversation(6)
