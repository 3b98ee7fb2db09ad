"""Revision 0009 on a database that holds conversations (both engines): the upgrade from 0008
backfills ``conversations.pending_calls`` from the stored messages — exactly what the service
writes for the same context — in batches; the service then lists by ``has_pending_action``;
the downgrade drops the column and its index.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import httpx
from sqlalchemy import MetaData, Table, inspect, select
from sqlalchemy.engine import Connection

from app.agent.codec import dump_message
from app.agent.messages import (
    AnyMessage,
    AssistantMessage,
    TextBlock,
    ToolCallBlock,
    ToolResultMessage,
    UserMessage,
)
from app.api.app import create_app
from app.api.auth import DEFAULT_TENANT
from app.config import Settings
from app.store.changes import stored_pending
from app.store.db import make_engine
from app.store.migrate import current_revision, downgrade, head_revision, upgrade

T = DEFAULT_TENANT
NOW = datetime(2026, 12, 1, tzinfo=UTC)
#: more conversations than two batches of the backfill (500 each)
FILLERS = 1_100


def asks(*ids: str, name: str = "lookup", arguments: str = "{}") -> AssistantMessage:
    return AssistantMessage(
        content=tuple(ToolCallBlock(id=i, name=name, arguments=arguments) for i in ids),
        stop_reason="tool_use",
    )


def answer(call_id: str, name: str = "lookup") -> ToolResultMessage:
    return ToolResultMessage(
        tool_call_id=call_id, tool_name=name, content=(TextBlock(text="found"),)
    )


def says(text: str) -> AssistantMessage:
    return AssistantMessage(content=(TextBlock(text=text),), stop_reason="end_turn")


LONG = [f"k{i:02d}" for i in range(40)]  # a batch longer than the backfill's first read (16)

#: (tenant, id) -> (first position, messages)
CASES: dict[tuple[str, str], tuple[int, list[AnyMessage]]] = {
    (T, "client"): (
        0,
        [UserMessage.text("look"), asks("c1", arguments='{"word":"ünï ✓"}')],
    ),
    (T, "answered"): (0, [UserMessage.text("look"), asks("c1"), answer("c1"), says("done")]),
    (T, "partial"): (0, [UserMessage.text("look"), asks("c1", "c2"), answer("c1")]),
    (T, "long"): (0, [UserMessage.text("many"), asks(*LONG), *(answer(i) for i in LONG[1:])]),
    (T, "long-answered"): (0, [asks(*LONG), *(answer(i) for i in LONG)]),
    (T, "empty"): (0, []),
    # folded: the context starts at position 100 (compaction left a gap at the front)
    (T, "folded"): (100, [UserMessage.text("what time?"), asks("t1", name="time_now")]),
    (T, "then-a-user"): (0, [asks("c1"), answer("c1"), UserMessage.text("and?")]),
    # the same id under another tenant awaits nothing
    ("other", "client"): (0, [UserMessage.text("hi"), says("hello")]),
}
for i in range(FILLERS):
    CASES[(T, f"fill-{i:04d}")] = (0, [asks(f"x{i}")] if i % 7 == 0 else [UserMessage.text("x")])


def _text(value: Any) -> str:
    """JSON as the store writes it (``JSONText``)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _fill(conn: Connection) -> None:
    meta = MetaData()
    conversations = Table("conversations", meta, autoload_with=conn)
    messages = Table("context_messages", meta, autoload_with=conn)
    assert "pending_calls" not in conversations.c  # this is the 0008 schema
    rows, bodies = [], []
    for (tenant, conv_id), (first, context) in CASES.items():
        rows.append(
            {
                "tenant": tenant,
                "id": conv_id,
                "incarnation": "0" * 32,
                "version": 1,
                "system_prompt": "",
                "summary": "",
                "next_position": first + len(context),
                "message_count": len(context),
                "transcript_seq": 0,
                "created_at": NOW,
                "updated_at": NOW,
                "active_run_id": None,
                "token_tally": None,
                "expires_at": None,
            }
        )
        bodies += [
            {
                "tenant": tenant,
                "conversation_id": conv_id,
                "position": first + k,
                "body": _text(dump_message(m)),
            }
            for k, m in enumerate(context)
        ]
    conn.execute(conversations.insert(), rows)
    conn.execute(messages.insert(), bodies)


def _stored(conn: Connection) -> dict[tuple[str, str], str | None]:
    conversations = Table("conversations", MetaData(), autoload_with=conn)
    c = conversations.c
    return {
        (row.tenant, row.id): row.pending_calls
        for row in conn.execute(select(c.tenant, c.id, c.pending_calls))
    }


def _schema(conn: Connection) -> tuple[set[str], set[str]]:
    found = inspect(conn)
    columns = {col["name"] for col in found.get_columns("conversations")}
    indexes = {str(ix["name"]) for ix in found.get_indexes("conversations")}
    return columns, indexes


async def test_upgrade_from_0008_backfills_what_the_service_writes_and_downgrade_drops_it(
    empty_database_url: str,
) -> None:
    url = empty_database_url
    await upgrade(url, "0008")
    engine = make_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(_fill)

        await upgrade(url)
        assert await current_revision(url) == head_revision()
        async with engine.connect() as conn:
            stored = await conn.run_sync(_stored)
        expected = {
            key: None if (value := stored_pending(context)) is None else _text(value)
            for key, (_, context) in CASES.items()
        }
        assert stored == expected  # the very text the service would have written
        assert json.loads(stored[(T, "client")] or "null") == [
            {"id": "c1", "name": "lookup", "arguments": '{"word":"ünï ✓"}'}
        ]
        assert [c["id"] for c in json.loads(stored[(T, "partial")] or "null")] == ["c2"]
        assert [c["id"] for c in json.loads(stored[(T, "long")] or "null")] == ["k00"]
        for settled in ("answered", "long-answered", "empty", "then-a-user"):
            assert stored[(T, settled)] is None, settled
        assert stored[("other", "client")] is None
        fillers = {k for k, v in stored.items() if k[1].startswith("fill-") and v is not None}
        assert len(fillers) == len(range(0, FILLERS, 7))

        # the service lists by it at once
        app = create_app(Settings(database_url=url))
        http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://carryover.test"
        )
        async with app.router.lifespan_context(app), http:
            awaiting: set[str] = set()
            cursor = None
            while True:
                params: dict[str, Any] = {"has_pending_action": "true", "limit": 100}
                if cursor:
                    params["cursor"] = cursor
                page = (await http.get("/conversations", params=params)).json()
                awaiting |= {c["id"] for c in page["items"]}
                cursor = page["next_cursor"]
                if cursor is None:
                    break
            assert awaiting == {k[1] for k, v in expected.items() if k[0] == T and v}
            folded = (await http.get("/conversations/folded")).json()
            assert folded["pending_tool_calls"] == [
                {"id": "t1", "name": "time_now", "arguments": "{}", "kind": "approval"}
            ]

        await downgrade(url, "0008")
        async with engine.connect() as conn:
            columns, indexes = await conn.run_sync(_schema)
        assert "pending_calls" not in columns
        assert "ix_conversations_tenant_pending" not in indexes
        # and up again: the backfill runs on the data as it is
        await upgrade(url)
        async with engine.connect() as conn:
            assert await conn.run_sync(_stored) == expected
    finally:
        await engine.dispose()
