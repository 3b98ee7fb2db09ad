"""Migration 0014 moves the message texts of run records and the transcript into
``message_texts`` in batches (more rows than one batch here) and back on downgrade: the rows a
database at 0013 holds read the same after the upgrade, and come back byte-identical after the
downgrade. A text that does not parse is left in its row, so reads still report it."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from sqlalchemy import text

from app.store.db import make_engine
from app.store.migrate import downgrade, upgrade

from ..helpers import assert_problem

#: more transcript rows than one batch of the migration (1,000)
EXTRA = 1_100
TABLES = {
    "run_new_messages": ("run_id, seq", "body"),
    "run_finals": ("run_id", "body"),
    "transcript": ("seq", "body"),
    "run_events": ("run_id, seq", "data"),
}


async def raw_rows(url: str) -> dict[str, list[tuple[Any, ...]]]:
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            return {
                table: [
                    tuple(r)
                    for r in await conn.execute(
                        text(
                            f"SELECT conversation_id, {key}, {column} FROM {table} "
                            f"ORDER BY conversation_id, {key}"
                        )
                    )
                ]
                for table, (key, column) in TABLES.items()
            }
    finally:
        await engine.dispose()


async def execute(url: str, sql: str, params: list[dict[str, Any]] | None = None) -> None:
    engine = make_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.execute(text(sql), params or {})
    finally:
        await engine.dispose()


async def test_upgrade_moves_the_texts_and_downgrade_puts_them_back_byte_identical(
    app_factory: Callable[..., Any], database_url: str
) -> None:
    async with app_factory() as client:
        created = await client.post("/conversations", json={"id": "c", "system_prompt": "S"})
        assert created.status_code == 201
        for p in ("one é ✓ \U0001f600", "two \x01 \n", "x" * 5000):
            assert (await client.post("/conversations/c/runs", json={"prompts": [p]})).is_success
        runs_before = (await client.get("/conversations/c/runs")).json()
        run_id = runs_before["items"][0]["run_id"]
        events_before = await client.get(f"/conversations/c/runs/{run_id}/events")
        assert events_before.status_code == 200
    await downgrade(database_url, "0013")
    # a database at 0013: the texts in their rows; add more entries than one batch
    at_0013 = await raw_rows(database_url)
    body = at_0013["transcript"][1][2]
    await execute(
        database_url,
        "INSERT INTO transcript (tenant, conversation_id, seq, run_id, kind, failed, body, "
        "created_at) SELECT tenant, conversation_id, seq + :n, run_id, kind, failed, :body, "
        "created_at FROM transcript WHERE seq = 2",
        [{"n": 1000 + i, "body": body.replace("one", f"one {i}")} for i in range(EXTRA)],
    )
    await execute(
        database_url,
        f'UPDATE transcript SET body = \'{{"type":"user",\' WHERE seq = {1000 + EXTRA + 1}',
    )
    at_0013 = await raw_rows(database_url)

    await upgrade(database_url)
    engine = make_engine(database_url)
    try:
        async with engine.connect() as conn:
            left = (
                await conn.execute(
                    text(
                        "SELECT COUNT(*) FROM transcript "
                        "WHERE body IS NOT NULL AND kind = 'attempt'"
                    )
                )
            ).scalar()
            texts = (await conn.execute(text("SELECT COUNT(*) FROM message_texts"))).scalar()
    finally:
        await engine.dispose()
    assert left == 1  # the text that does not parse stays where it was
    # and the system prompt and summary of the version records (migration 0017)
    assert texts == 6 + EXTRA - 1 + 2
    async with app_factory() as client:
        assert (await client.get("/conversations/c/runs")).json() == runs_before
        events = await client.get(f"/conversations/c/runs/{run_id}/events")
        assert events.content == events_before.content
        entries: list[dict[str, Any]] = []
        cursor: dict[str, str] = {}
        while True:
            page = await client.get("/conversations/c/transcript", params=cursor)
            if page.status_code == 409:  # the page that holds the damaged entry, the last
                assert_problem(page, 409, "stored-data-damaged")
                break
            entries += page.json()["items"]
            cursor = {"cursor": page.json()["next_cursor"]}
        raw = {seq: b for _, seq, b in at_0013["transcript"]}
        assert len(entries) >= 1000
        assert all(json.loads(raw[e["seq"]]) == e["body"] for e in entries)

    await downgrade(database_url, "0013")
    assert await raw_rows(database_url) == at_0013
    await upgrade(database_url)
