"""One Alembic history that upgrades from empty and downgrades to base on both engines."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.db import make_engine
from app.store.migrate import current_revision, downgrade, head_revision, upgrade
from app.store.tables import metadata

TABLES = {
    "conversations",
    "context_messages",
    "runs",
    "run_new_messages",
    "run_finals",
    "run_compactions",
    "transcript",
    "idempotency_keys",
    "api_keys",
}


async def _table_names(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            return set(await conn.run_sync(lambda c: inspect(c).get_table_names()))
    finally:
        await engine.dispose()


async def test_upgrade_from_empty_then_downgrade_to_base_then_upgrade_again(
    empty_database_url: str,
) -> None:
    url = empty_database_url
    assert await current_revision(url) is None
    assert not (await _table_names(url)) & TABLES

    await upgrade(url)
    assert await current_revision(url) == head_revision()
    assert TABLES <= await _table_names(url)

    await downgrade(url, "base")
    assert await current_revision(url) is None
    assert not (await _table_names(url)) & TABLES

    await upgrade(url)
    assert await current_revision(url) == head_revision()
    assert TABLES <= await _table_names(url)


async def test_upgrade_at_head_is_a_no_op(database_url: str) -> None:
    await upgrade(database_url)
    assert await current_revision(database_url) == head_revision()


async def test_hand_written_migration_matches_the_table_classes(engine: AsyncEngine) -> None:
    def diff(conn: Connection) -> list[object]:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        return list(compare_metadata(context, metadata))

    async with engine.connect() as conn:
        assert await conn.run_sync(diff) == []


async def test_current_revision_accepts_an_engine(engine: AsyncEngine) -> None:
    assert await current_revision(engine) == head_revision()
