"""Reads of one statement (``read_one``, app/store/db.py): what is read again and again — a
reader's poll of a running run, a request waiting for a busy conversation, the lease keeper's
scan and its ping, a ``/v1`` response found by id, a 409's Retry-After, a conversation's row
(``GET /conversations/{id}``) — runs on PostgreSQL with
no transaction of its own, one round trip each; on SQLite it reads as before. Counted, never
timed."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.stores import Stores
from tests.helpers import server_calls

from .builders import user

TENANT = "default"


@pytest.fixture
async def stores(engine: AsyncEngine) -> Stores:
    stores = Stores(engine)
    conv = await stores.conversations.create_conversation(TENANT, "c")
    await stores.runs.insert_run(
        TENANT, "c", base_etag=conv.etag, prompts=[user("hi")], run_id="r1"
    )
    return stores


async def test_each_polled_read_is_one_statement(stores: Stores, monkeypatch: Any) -> None:
    with server_calls(monkeypatch) as calls:
        assert await stores.records.run_status(TENANT, "c", "r1") == "running"
        assert (await stores.events.read_events(TENANT, "c", "r1", after=0, limit=10)) == []
        assert await stores.events.event_bounds(TENANT, "c", "r1") is None
        found = await stores.records.find_run(TENANT, "r1")
        assert found is not None and found.run_id == "r1"
        assert await stores.records.recent_run_durations(TENANT, "c", limit=5) == []
        assert await stores.leases.lease_holder(TENANT, "c") is None  # no lease taken
        await stores.leases.ping()
        assert await stores.leases.interrupt_expired() == 0
        conversation = await stores.conversations.get_conversation(TENANT, "c")
        assert conversation is not None and conversation.active_run_id is None
        assert await stores.conversations.get_conversation(TENANT, "missing") is None
    if stores.engine.dialect.name == "postgresql":
        sent = [c.split()[0] for c in calls if not c.startswith("prepare ")]
        assert sent == ["SELECT"] * 10, calls  # no BEGIN, no COMMIT
