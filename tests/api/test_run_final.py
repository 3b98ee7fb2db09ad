"""A run's final named among its new messages (``runs.final_seq``, migration 0021), on both
engines: a finishing run writes no ``run_finals`` row, and its record, its export and a
re-import read the same final as one kept in a row of its own — which a run finished before
keeps, and the downgrade writes back. A final named where there is no attempt is refused as
damaged, never served."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import text

from app.store.db import make_engine
from app.store.migrate import downgrade, upgrade

from ..helpers import assert_problem


async def sql(url: str, statement: str) -> list[tuple[Any, ...]]:
    engine = make_engine(url)
    try:
        async with engine.begin() as conn:
            found = await conn.execute(text(statement))
            return [tuple(r) for r in found] if found.returns_rows else []
    finally:
        await engine.dispose()


async def test_a_run_names_its_final_among_its_new_messages_and_reads_it_back(
    app_factory: Callable[..., Any], database_url: str
) -> None:
    async with app_factory() as client:
        assert (await client.post("/conversations", json={"id": "c"})).status_code == 201
        ran = await client.post("/conversations/c/runs", json={"prompts": ["/tool lookup {}"]})
        assert ran.status_code == 201
        answered = ran.json()
        run_id = answered["run_id"]
        # the prompt, the call, its result, the answer: the final is the last attempt
        assert [m["type"] for m in answered["new_messages"]] == [
            "user",
            "assistant",
            "tool_result",
            "assistant",
        ]
        record = (await client.get(f"/conversations/c/runs/{run_id}")).json()
        assert record["final"] == answered["final"] == answered["new_messages"][3]
        assert (await client.get("/conversations/c/runs")).json()["items"][0]["final"] == (
            answered["final"]
        )
        exported = (await client.get("/conversations/c/export")).json()
        assert exported["runs"][0]["final"] == answered["new_messages"][3]
        exported["conversation"]["id"] = "d"
        imported = await client.post("/conversations/import", json=exported)
        assert imported.status_code == 201, imported.text
        again = (await client.get("/conversations/d/runs")).json()["items"][0]
        assert again["final"] == answered["final"]
    assert await sql(database_url, "SELECT final_seq FROM runs WHERE conversation_id = 'c'") == [
        (3,)
    ]
    # the run's own row names it; the imported one keeps a row of its own, as before
    assert await sql(database_url, "SELECT conversation_id FROM run_finals") == [("d",)]

    await downgrade(database_url, "0020")
    assert sorted(await sql(database_url, "SELECT conversation_id FROM run_finals")) == [
        ("c",),
        ("d",),
    ]
    await upgrade(database_url)
    async with app_factory() as client:
        record = (await client.get(f"/conversations/c/runs/{run_id}")).json()
        assert record["final"] == answered["final"]


async def test_a_final_named_where_there_is_no_attempt_is_refused(
    app_factory: Callable[..., Any], database_url: str
) -> None:
    async with app_factory() as client:
        assert (await client.post("/conversations", json={"id": "c"})).status_code == 201
        ran = await client.post("/conversations/c/runs", json={"prompts": ["hi"]})
        run_id = ran.json()["run_id"]
    for seq in (0, 7, -1):  # the prompt; past the end; before the start
        await sql(database_url, f"UPDATE runs SET final_seq = {seq}")
        async with app_factory() as client:
            answer = await client.get(f"/conversations/c/runs/{run_id}")
            assert_problem(answer, 409, "stored-data-damaged")
