"""Migration 0017 records each conversation's current version (more conversations than one
batch here), so it is listed and read back after the upgrade; the versions before it were not
kept (410). Its downgrade deletes the rows only earlier versions held, so a database at 0016
holds exactly each conversation's current context again."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from app.store.migrate import downgrade, upgrade

from ..helpers import assert_problem, run_sql

#: more conversations than one batch of the migration (1,000)
MANY = 1_005


async def test_upgrade_records_the_current_versions_and_downgrade_forgets_earlier_rows(
    app_factory: Callable[..., Any], database_url: str
) -> None:
    async with app_factory() as client:
        assert (
            await client.post("/conversations", json={"id": "c", "system_prompt": "S"})
        ).is_success
        for prompt in ("one", "two"):
            run = await client.post("/conversations/c/runs", json={"prompts": [prompt]})
            assert run.status_code == 201, run.text
        compact = await client.post("/conversations/c/compact")
        assert compact.status_code in (200, 201), compact.text
        before = await client.get("/conversations/c/context")
    # rows below the first position: the compacted messages, kept for earlier versions
    kept = await run_sql(
        database_url,
        "SELECT COUNT(*) FROM context_messages m JOIN conversations c ON c.tenant = m.tenant "
        "AND c.id = m.conversation_id WHERE m.position < c.next_position - c.message_count",
    )
    assert kept > 0
    await downgrade(database_url, "0016")
    assert (
        await run_sql(
            database_url,
            "SELECT COUNT(*) FROM context_messages m JOIN conversations c ON c.tenant = m.tenant "
            "AND c.id = m.conversation_id WHERE m.position < c.next_position - c.message_count",
        )
        == 0
    )
    # many conversations at 0016, more than one batch of the upgrade
    await run_sql(
        database_url,
        "INSERT INTO conversations (tenant, id, incarnation, version, system_prompt, summary, "
        "next_position, message_count, transcript_seq, created_at, updated_at) "
        "SELECT tenant, id || '-' || n, incarnation, version, system_prompt, summary, 0, 0, 0, "
        "created_at, updated_at FROM conversations, "
        f"(WITH RECURSIVE k(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM k WHERE n < {MANY}) "
        "SELECT n FROM k) AS seq WHERE id = 'c'",
    )
    await upgrade(database_url)
    assert await run_sql(database_url, "SELECT COUNT(*) FROM context_versions") == MANY + 1
    async with app_factory() as client:
        listed = (await client.get("/conversations/c/versions")).json()["items"]
        assert [(v["cause"], v["etag"]) for v in listed] == [("migrated", before.headers["etag"])]
        version = listed[0]["version"]
        got = await client.get("/conversations/c/context", params={"version": version})
        assert got.content == before.content
        older = await client.get("/conversations/c/context", params={"version": version - 1})
        assert_problem(older, 410, "version-expired")
        run = await client.post("/conversations/c/runs", json={"prompts": ["three"]})
        assert run.status_code == 201, run.text
        assert len((await client.get("/conversations/c/versions")).json()["items"]) == 2
