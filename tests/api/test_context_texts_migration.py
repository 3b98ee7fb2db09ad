"""Migration 0015 makes the stored context and the prompts of runs that ended reference their
texts in ``message_texts``, in batches (more rows than one batch here), and puts them back on
downgrade: a context and runs stored at 0014 read the same after the upgrade and their rows come
back byte-identical after the downgrade. A row whose text does not match its checksum keeps its
own text, so reads still report it damaged."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import text

from app.store.db import make_engine
from app.store.migrate import downgrade, upgrade

from ..helpers import assert_problem, run_sql, user

#: more context rows than one batch of the migration (1,000)
LONG = 1_100


async def raw_rows(url: str) -> list[tuple[Any, ...]]:
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(
                text(
                    "SELECT conversation_id, position, body, body_sha256 FROM context_messages "
                    "ORDER BY conversation_id, position"
                )
            )
            return [tuple(r) for r in rows]
    finally:
        await engine.dispose()


async def run_prompts(url: str) -> list[tuple[str, str]]:
    """Each run's id and its ``prompts`` as stored, by run id."""
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(text("SELECT run_id, prompts FROM runs ORDER BY run_id"))
            return [(r[0], r[1]) for r in rows]
    finally:
        await engine.dispose()


async def test_upgrade_references_the_context_texts_and_downgrade_puts_them_back(
    app_factory: Callable[..., Any], database_url: str
) -> None:
    context = {
        "system_prompt": "S",
        "summary": "",
        "messages": [user(f"message {i} é ✓ \U0001f600") for i in range(LONG)],
    }
    async with app_factory() as client:
        for conv in ("long", "hurt"):
            put = await client.put(
                f"/conversations/{conv}/context", json=context, headers={"If-None-Match": "*"}
            )
            assert put.status_code == 201, put.text
        run = await client.post("/conversations/long/runs", json={"prompts": ["one more"]})
        assert run.status_code == 201, run.text
        before = (await client.get("/conversations/long/context")).content
        runs_before = (await client.get("/conversations/long/runs")).json()
        hurt_etag = (await client.get("/conversations/hurt")).json()["etag"]
    await downgrade(database_url, "0014")
    at_0014 = await raw_rows(database_url)
    assert all(body is not None for _, _, body, _ in at_0014)  # each row its own text again
    # one row changed behind the service's back: not what its checksum says
    await run_sql(
        database_url,
        "UPDATE context_messages SET body = replace(body, 'message 7 ', 'messaxe 7 ') "
        "WHERE conversation_id = 'hurt' AND position = 7",
    )
    # as a database at 0014 holds them: only the run's texts are in message_texts
    await run_sql(
        database_url,
        "DELETE FROM message_texts WHERE sha256 NOT IN "
        "(SELECT body_sha256 FROM run_new_messages WHERE body_sha256 IS NOT NULL)",
    )
    assert await run_sql(database_url, "SELECT COUNT(*) FROM message_texts") == 2
    at_0014 = await raw_rows(database_url)
    prompts_0014 = await run_prompts(database_url)
    assert prompts_0014 and all(p.startswith('[{"type":"user"') for _, p in prompts_0014)

    await upgrade(database_url)
    # the run that ended references its prompt's text, which its records hold
    assert await run_prompts(database_url) == [(r, "[]") for r, _ in prompts_0014]
    kept = await run_sql(
        database_url, "SELECT COUNT(*) FROM context_messages WHERE body IS NOT NULL"
    )
    assert kept == 1  # the damaged row keeps its own text
    # one text per distinct message: the two contexts share theirs
    texts = await run_sql(database_url, "SELECT COUNT(*) FROM message_texts")
    # and the run's prompt and answer, and the system prompt and summary of the version
    # records (migration 0017)
    assert texts == LONG + 2 + 2
    async with app_factory() as client:
        assert (await client.get("/conversations/long/context")).content == before
        assert (await client.get("/conversations/long/runs")).json() == runs_before
        got = await client.get("/conversations/hurt/context")
        body = assert_problem(got, 409, "stored-data-damaged")
        assert body["message_index"] == 7 and body["current_etag"] == hurt_etag
        run = await client.post("/conversations/long/runs", json={"prompts": ["after"]})
        assert run.status_code == 201, run.text

    await downgrade(database_url, "0014")
    rows = await raw_rows(database_url)
    # the rows stored before the upgrade are byte-identical; the run after it added its own
    assert [r for r in rows if r[:2] in {a[:2] for a in at_0014}] == at_0014
    assert [p for p in await run_prompts(database_url) if p in prompts_0014] == prompts_0014
    await upgrade(database_url)
    async with app_factory() as client:
        after = await client.get("/conversations/long/context")
        assert after.status_code == 200
        assert len(after.json()["messages"]) == LONG + 4
