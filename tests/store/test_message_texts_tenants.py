"""Message texts are scoped by tenant (app/store/texts.py): two tenants that send the same
message store it once each, a tenant's delete never takes another tenant's text, and a text
made missing behind the service's back is refused, not served."""

from __future__ import annotations

import pytest
from sqlalchemy import delete, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.agent.messages import Context
from app.store.errors import StoredRecordDamaged
from app.store.tables import message_texts
from tests.repository import Repository

from .builders import completed_run


async def texts_of(engine: AsyncEngine, tenant: str) -> int:
    async with engine.connect() as conn:
        stmt = select(func.count()).where(message_texts.c.tenant == tenant)
        return int((await conn.execute(stmt)).scalar_one())


async def one_run(repo: Repository, tenant: str) -> str:
    await repo.replace_context(tenant, "c", Context(system_prompt="S"), create=True)
    base = await repo.load_context(tenant, "c")
    run = await repo.insert_run(tenant, "c", base_etag=base.etag, prompts=[])
    result = completed_run(base.context, "the same words", "the same answer")
    await repo.finish_run(tenant, "c", run.run_id, base=base, result=result, store=True)
    return run.run_id


async def test_each_tenant_stores_its_own_copy_and_deletes_only_its_own(
    repo: Repository, engine: AsyncEngine
) -> None:
    await one_run(repo, "acme")
    run_id = await one_run(repo, "globex")
    # the prompt, the answer, and the system prompt and summary its versions reference
    assert await texts_of(engine, "acme") == await texts_of(engine, "globex") == 4

    assert await repo.delete_conversation("acme", "c")
    assert await texts_of(engine, "acme") == 0
    assert await texts_of(engine, "globex") == 4
    record = await repo.get_run("globex", "c", run_id)
    assert record is not None and record.final is not None


async def test_a_missing_text_is_refused_not_served(repo: Repository, engine: AsyncEngine) -> None:
    run_id = await one_run(repo, "acme")
    async with engine.begin() as conn:
        await conn.execute(delete(message_texts))
    with pytest.raises(StoredRecordDamaged, match="missing"):
        await repo.get_run("acme", "c", run_id)
    with pytest.raises(StoredRecordDamaged, match="missing"):
        await repo.list_transcript("acme", "c")
