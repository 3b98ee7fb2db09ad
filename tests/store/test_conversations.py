"""Conversations: create, read, list by keyset, delete with everything they own, ETags."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.agent.codec import dumps_message
from app.store.db import read_transaction, write_transaction
from app.store.errors import AlreadyExists, PreconditionFailed
from app.store.integrity import body_sha256
from app.store.tables import (
    context_messages,
    conversations,
    idempotency_keys,
    parse_etag,
    run_compactions,
    run_finals,
    run_new_messages,
    runs,
    transcript,
    utcnow,
)
from tests.repository import Repository

from .builders import compaction, completed_run, conversation, user

CHILD_TABLES = [
    context_messages,
    runs,
    run_new_messages,
    run_finals,
    run_compactions,
    transcript,
    idempotency_keys,
]


async def test_create_then_get(repo: Repository) -> None:
    created = await repo.create_conversation("acme", "c1", "Be brief.")
    got = await repo.get_conversation("acme", "c1")
    assert got is not None
    assert got.model_dump() == created.model_dump()
    assert got.system_prompt == "Be brief."
    assert (got.version, got.message_count, got.next_position, got.transcript_seq) == (1, 0, 0, 0)
    assert got.created_at.tzinfo is not None
    assert got.etag == f'"{got.incarnation}-1"'
    assert parse_etag(got.etag) == (got.incarnation, 1)


async def test_creating_an_existing_id_is_refused(repo: Repository) -> None:
    await repo.create_conversation("acme", "c1")
    with pytest.raises(AlreadyExists):
        await repo.create_conversation("acme", "c1")


async def test_a_conversation_is_invisible_to_other_tenants(repo: Repository) -> None:
    await repo.create_conversation("acme", "c1")
    await repo.create_conversation("umbrella", "c1")  # same id, other tenant: no clash
    assert await repo.get_conversation("initech", "c1") is None
    assert [c.tenant for c in await repo.list_conversations("umbrella")] == ["umbrella"]
    assert await repo.delete_conversation("initech", "c1") is False
    assert await repo.get_conversation("acme", "c1") is not None


async def test_list_pages_by_id(repo: Repository) -> None:
    for conv_id in ["d", "a", "c", "b", "e"]:
        await repo.create_conversation("acme", conv_id)
    first = await repo.list_conversations("acme", limit=2)
    second = await repo.list_conversations("acme", after_id=first[-1].id, limit=2)
    third = await repo.list_conversations("acme", after_id=second[-1].id, limit=2)
    assert [[c.id for c in page] for page in (first, second, third)] == [
        ["a", "b"],
        ["c", "d"],
        ["e"],
    ]
    assert await repo.list_conversations("acme", after_id="e") == []


async def _count_children(engine: AsyncEngine, tenant: str, conv_id: str) -> dict[str, int]:
    async with read_transaction(engine) as conn:
        return {
            t.name: (
                await conn.execute(
                    select(func.count())
                    .select_from(t)
                    .where(t.c.tenant == tenant, t.c.conversation_id == conv_id)
                )
            ).scalar_one()
            for t in CHILD_TABLES
        }


async def _populate(repo: Repository, engine: AsyncEngine, conv_id: str) -> None:
    """A conversation with messages, a finished run with every audit record, an idem key."""
    base_context = conversation(4)
    await repo.replace_context("acme", conv_id, base_context, create=True)
    base = await repo.load_context("acme", conv_id)
    run = await repo.insert_run("acme", conv_id, base_etag=base.etag, prompts=[user("next?")])
    plain = completed_run(base_context)
    folded = base_context.messages[:2]
    result = plain.model_copy(
        update={
            "context": plain.context.model_copy(
                update={"summary": "s", "messages": plain.context.messages[2:]}
            ),
            "compactions": (compaction(folded, "s"),),
        }
    )
    await repo.finish_run("acme", conv_id, run.run_id, base=base, result=result, store=True)
    async with write_transaction(engine) as conn:
        now = utcnow()
        await conn.execute(
            idempotency_keys.insert().values(
                tenant="acme",
                conversation_id=conv_id,
                key="k1",
                request_hash="h",
                run_id=run.run_id,
                status_code=201,
                response={"ok": True},
                created_at=now,
                expires_at=now,
            )
        )
        # a final of its own, as a run finished before migration 0021 kept it
        assert result.final is not None
        await conn.execute(
            run_finals.insert().values(
                tenant="acme",
                conversation_id=conv_id,
                run_id=run.run_id,
                body=None,
                body_sha256=body_sha256(dumps_message(result.final)),
            )
        )


async def test_delete_removes_the_conversation_and_all_its_records(
    repo: Repository, engine: AsyncEngine
) -> None:
    await _populate(repo, engine, "doomed")
    await _populate(repo, engine, "kept")
    assert all((await _count_children(engine, "acme", "doomed")).values())

    assert await repo.delete_conversation("acme", "doomed") is True

    assert await repo.get_conversation("acme", "doomed") is None
    assert set((await _count_children(engine, "acme", "doomed")).values()) == {0}
    assert all((await _count_children(engine, "acme", "kept")).values())
    assert await repo.delete_conversation("acme", "doomed") is False


async def test_delete_with_a_stale_etag_is_refused_and_deletes_nothing(repo: Repository) -> None:
    created = await repo.create_conversation("acme", "c1")
    await repo.replace_context("acme", "c1", conversation(2), if_match=created.etag)
    for stale in [created.etag, '"nonsense"', f"W/{created.etag}"]:
        with pytest.raises(PreconditionFailed) as refused:
            await repo.delete_conversation("acme", "c1", expected_etag=stale)
        current = await repo.get_conversation("acme", "c1")
        assert current is not None
        assert refused.value.current_etag == current.etag


async def test_delete_with_the_current_etag_or_star(repo: Repository) -> None:
    current = await repo.create_conversation("acme", "c1")
    assert await repo.delete_conversation("acme", "c1", expected_etag=current.etag) is True
    await repo.create_conversation("acme", "c2")
    assert await repo.delete_conversation("acme", "c2", expected_etag="*") is True


async def test_delete_of_a_missing_conversation_with_an_etag_is_not_a_412(
    repo: Repository,
) -> None:
    assert await repo.delete_conversation("acme", "ghost", expected_etag='"x-1"') is False


async def test_etags_never_repeat_across_delete_and_recreate(repo: Repository) -> None:
    seen: set[str] = set()
    for _ in range(3):
        created = await repo.create_conversation("acme", "c1")
        etag = await repo.replace_context("acme", "c1", conversation(2), if_match=created.etag)
        assert created.etag not in seen and etag not in seen
        seen |= {created.etag, etag}
        await repo.delete_conversation("acme", "c1")
    for _ in range(2):
        etag = await repo.replace_context("acme", "c1", conversation(2), create=True)
        assert etag not in seen
        seen.add(etag)
        await repo.delete_conversation("acme", "c1")


async def test_conversation_row_carries_counts(repo: Repository, engine: AsyncEngine) -> None:
    await repo.replace_context("acme", "c1", conversation(6), create=True)
    got = await repo.get_conversation("acme", "c1")
    assert got is not None
    assert (got.message_count, got.next_position, got.transcript_seq) == (6, 6, 1)
    async with read_transaction(engine) as conn:
        assert (
            await conn.execute(select(conversations.c.summary).where(conversations.c.id == "c1"))
        ).scalar_one() == ""


async def test_delete_accepts_a_list_of_etags(repo: Repository) -> None:
    created = await repo.create_conversation("acme", "c1")
    with pytest.raises(PreconditionFailed):
        await repo.delete_conversation("acme", "c1", expected_etag=['"x-1"'])
    assert await repo.delete_conversation("acme", "c1", expected_etag=['"x-1"', created.etag])
