"""Revision 0016 on a database that holds paused conversations (both engines): the upgrade from
0014 gives each entry of ``conversations.pending_calls`` the kind its conversation's latest
paused run decided (``runs.required_action``), in batches; a call no paused run lists (its
context was PUT) keeps none and is read as the profile infers it; the downgrade takes the kinds
(and server labels) out again, and upgrading twice gives the same values.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import MetaData, Table, select
from sqlalchemy.engine import Connection

from app.api.app import create_app
from app.api.auth import DEFAULT_TENANT
from app.config import Settings
from app.store.db import make_engine
from app.store.migrate import current_revision, downgrade, head_revision, upgrade

T = DEFAULT_TENANT
NOW = datetime(2026, 12, 8, tzinfo=UTC)
#: more paused conversations than one batch of the upgrade (500)
FILLERS = 620


def _text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _call(call_id: str, name: str = "lookup") -> dict[str, str]:
    return {"id": call_id, "name": name, "arguments": "{}"}


#: conversation id → its pending calls, and its runs as (required_action calls, minutes ago)
CASES: dict[str, tuple[list[dict[str, str]], list[tuple[list[dict[str, str]] | None, int]]]] = {
    "client": ([_call("c1")], [([{**_call("c1"), "kind": "client"}], 5)]),
    # the latest paused run decides; a later run that did not pause changes nothing
    "approval": (
        [_call("a1", "time_now")],
        [
            ([{**_call("old"), "kind": "client"}], 30),
            ([{**_call("a1", "time_now"), "kind": "approval"}], 10),
            (None, 1),
        ],
    ),
    # two calls: one listed by the paused run, one not (added by a PUT since)
    "mixed": (
        [_call("m1"), _call("m2")],
        [([{**_call("m1"), "kind": "approval"}], 3)],
    ),
    "put": ([_call("p1", "time_now")], []),
    "settled": ([], [([{**_call("s1"), "kind": "client"}], 2)]),
}
for i in range(FILLERS):
    kind = "client" if i % 2 else "approval"
    CASES[f"fill-{i:04d}"] = ([_call(f"f{i}")], [([{**_call(f"f{i}"), "kind": kind}], 1)])


def _fill(conn: Connection) -> None:
    meta = MetaData()
    conversations = Table("conversations", meta, autoload_with=conn)
    runs = Table("runs", meta, autoload_with=conn)
    rows, run_rows = [], []
    for conv_id, (pending, paused) in CASES.items():
        rows.append(
            {
                "tenant": T,
                "id": conv_id,
                "incarnation": "0" * 32,
                "version": 1,
                "system_prompt": "",
                "summary": "",
                "next_position": 0,
                "message_count": 0,
                "transcript_seq": 0,
                "created_at": NOW,
                "updated_at": NOW,
                "active_run_id": None,
                "token_tally": None,
                "expires_at": None,
                "metadata": "{}",
                "pending_calls": _text(pending) if pending else None,
            }
        )
        for n, (calls, minutes) in enumerate(paused):
            run_rows.append(
                {
                    "tenant": T,
                    "conversation_id": conv_id,
                    "run_id": f"{conv_id}-run-{n}",
                    "status": "requires_action" if calls else "completed",
                    "stored": True,
                    "on_failure": "keep",
                    "agent": "default",
                    "base_etag": '"e"',
                    "prompts": "[]",
                    "usage": "{}",
                    "required_action": (
                        _text({"type": "tool_calls", "tool_calls": calls}) if calls else None
                    ),
                    "created_at": NOW - timedelta(minutes=minutes),
                    "cancel_requested": False,
                }
            )
    conn.execute(conversations.insert(), rows)
    conn.execute(runs.insert(), run_rows)


def _stored(conn: Connection) -> dict[str, Any]:
    conversations = Table("conversations", MetaData(), autoload_with=conn)
    c = conversations.c
    return {
        row.id: json.loads(row.pending_calls) if row.pending_calls else None
        for row in conn.execute(select(c.id, c.pending_calls))
    }


def _kinds(entries: list[dict[str, str]] | None) -> list[str | None]:
    return [e.get("kind") for e in entries or ()]


async def test_upgrade_from_0014_keeps_each_pending_calls_kind_and_downgrade_takes_it_out(
    empty_database_url: str,
) -> None:
    url = empty_database_url
    await upgrade(url, "0014")
    engine = make_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(_fill)
        await upgrade(url)
        assert await current_revision(url) == head_revision()
        async with engine.connect() as conn:
            upgraded = await conn.run_sync(_stored)
        assert _kinds(upgraded["client"]) == ["client"]
        assert _kinds(upgraded["approval"]) == ["approval"]
        assert _kinds(upgraded["mixed"]) == ["approval", None]
        assert _kinds(upgraded["put"]) == [None]
        assert upgraded["settled"] is None
        for i in range(FILLERS):
            assert _kinds(upgraded[f"fill-{i:04d}"]) == ["client" if i % 2 else "approval"]
        assert upgraded["client"] == [{**_call("c1"), "kind": "client"}]

        # the service reads the stored kinds, and infers the others from the profile
        app = create_app(Settings(database_url=url))
        http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://carryover.test"
        )
        async with app.router.lifespan_context(app), http:
            put = (await http.get("/conversations/put")).json()["pending_tool_calls"]
            assert [c["kind"] for c in put] == ["approval"]  # time_now: a server tool
            mixed = (await http.get("/conversations/mixed")).json()["pending_tool_calls"]
            # m1: stored approval (though not a server tool); m2: inferred, a client call
            assert [c["kind"] for c in mixed] == ["approval", "client"]

        await downgrade(url, "0014")
        async with engine.connect() as conn:
            bare = await conn.run_sync(_stored)
        assert bare["client"] == [_call("c1")]
        assert all(
            set(entry) == {"id", "name", "arguments"} for v in bare.values() for entry in v or ()
        )
        await upgrade(url)
        async with engine.connect() as conn:
            assert await conn.run_sync(_stored) == upgraded
    finally:
        await engine.dispose()
