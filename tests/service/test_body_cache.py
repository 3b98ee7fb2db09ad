"""GET context's body cache (app/service/cache.py ``BodyCache``) through the services, on both
engines: what it serves is byte for byte what the database holds, whatever wrote in between,
and a GET it serves reads no message row.

The truth is GET context through a second ConversationService whose RunManager keeps no body
(``context_body_cache_bytes=0``), on the same database: every one of its reads joins the stored
texts in the database.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from app.agent.messages import Context, UserMessage, text_of
from app.service.agents import AgentPool
from app.service.cache import BodyCache
from app.service.conversations import ConversationService
from app.service.runs import RunManager
from app.store.stores import Loaded, StoredRows
from tests.fakes.gated import GatedProvider, gated_pool
from tests.helpers import server_calls

from .conftest import TENANT, Services
from .test_context_cache import create_with, history, put, request, run_on, selects


async def body(conversations: ConversationService, conv: str) -> bytes:
    rows = await conversations.get_context_rows(TENANT, conv)
    assert isinstance(rows, StoredRows)
    return rows.context_json()


@pytest.fixture
async def truth(services: Services) -> AsyncIterator[ConversationService]:
    settings = services.runs.settings.model_copy(update={"context_body_cache_bytes": 0})
    runs = RunManager(services.repo, AgentPool(settings), settings, services.clock)
    try:
        yield ConversationService(services.repo, runs)
    finally:
        await runs.aclose()


async def same(services: Services, truth: ConversationService, conv: str) -> bytes:
    """GET context as the services serve it equals the database's, and parses to the stored
    Context."""
    served = await body(services.conversations, conv)
    assert served == await body(truth, conv)
    loaded = await services.conversations.get_context(TENANT, conv)
    assert isinstance(loaded, Loaded)
    assert Context.model_validate_json(served) == loaded.context
    return served


async def test_runs_extend_the_kept_body_and_later_reads_are_hits(
    services: Services, truth: ConversationService
) -> None:
    bodies = services.runs.bodies
    await services.conversations.create(TENANT, "c1", "be brief")
    await same(services, truth, "c1")  # a miss: read from the database and kept
    for text in ("one", "two", "three"):
        await run_on(services.runs, "c1", request(text))
        hits = bodies.hits
        served = await same(services, truth, "c1")
        assert bodies.hits == hits + 1  # the run's save extended the entry
    messages = json.loads(served)["messages"]
    assert [m["type"] for m in messages] == ["user", "assistant"] * 3
    assert messages[4]["content"][0]["text"] == "three"


async def test_a_put_a_delete_and_re_create_and_another_processs_run_are_misses(
    services: Services, truth: ConversationService
) -> None:
    await services.conversations.create(TENANT, "c1")
    await run_on(services.runs, "c1", request("one"))
    await same(services, truth, "c1")
    await put(services, "c1", history(5))
    assert len(json.loads(await same(services, truth, "c1"))["messages"]) == 5

    other = RunManager(services.repo, AgentPool(services.runs.settings), services.runs.settings)
    try:
        await run_on(other, "c1", request("elsewhere"))  # written by "them"
    finally:
        await other.aclose()
    # our run's base is their version, not the one our entry holds: not extended
    await run_on(services.runs, "c1", request("here"))
    served = json.loads(await same(services, truth, "c1"))
    assert [m["content"][0]["text"] for m in served["messages"][5::2]] == ["elsewhere", "here"]

    await services.conversations.delete(TENANT, "c1")
    await services.conversations.create(TENANT, "c1", "again")
    assert json.loads(await same(services, truth, "c1")) == {
        "system_prompt": "again",
        "summary": "",
        "messages": [],
    }
    await run_on(services.runs, "c1", request("fresh"))
    assert len(json.loads(await same(services, truth, "c1"))["messages"]) == 2


async def test_failed_runs_discarded_or_kept_and_compactions(
    services: Services, truth: ConversationService
) -> None:
    await create_with(services, "c1", history(40))
    await same(services, truth, "c1")
    discarded = await run_on(services.runs, "c1", request("/fail", on_failure="discard"))
    assert discarded.outcome.stored is False
    await same(services, truth, "c1")  # the entry is still the stored context's
    kept = await run_on(services.runs, "c1", request("/fail", on_failure="keep"))
    assert kept.outcome.stored is True
    served = json.loads(await same(services, truth, "c1"))
    assert text_of(UserMessage.model_validate(served["messages"][40])) == "/fail"

    compacted = await services.conversations.compact(TENANT, "c1")
    assert compacted.result.compactions and compacted.outcome.stored
    served = json.loads(await same(services, truth, "c1"))
    assert served["summary"] and len(served["messages"]) < 40
    await run_on(services.runs, "c1", request("after the compaction"))
    await same(services, truth, "c1")


async def test_a_conflicted_run_leaves_the_body_of_the_put(
    services: Services, truth: ConversationService
) -> None:
    gate = GatedProvider(hold=lambda prompt: prompt.startswith("hold"))
    settings = services.runs.settings
    runs = RunManager(services.repo, gated_pool(settings, gate), settings, services.clock)
    conversations = ConversationService(services.repo, runs)
    try:
        await services.conversations.create(TENANT, "c1")
        await run_on(runs, "c1", request("one"))
        await body(conversations, "c1")  # kept by the gated manager
        active = await runs.start(TENANT, "c1", request("hold me"), if_match=None)
        held = await gate.arrival("hold me")
        await put(services, "c1", history(3))
        held.release()
        conflicted = await runs.wait(active, on_disconnect="continue", disconnected=None)  # type: ignore[arg-type]
        assert (conflicted.outcome.status, conflicted.outcome.stored) == ("conflicted", False)
        assert await body(conversations, "c1") == await body(truth, "c1")
        assert len(json.loads(await body(truth, "c1"))["messages"]) == 3
    finally:
        gate.open()
        await runs.aclose()


async def test_a_get_served_from_the_body_cache_reads_no_message_row(
    services: Services,
) -> None:
    await create_with(services, "c1", history(2_000))
    await body(services.conversations, "c1")
    await run_on(services.runs, "c1", request("a run extends the kept body"))
    with selects(services) as statements:
        served = await body(services.conversations, "c1")
    assert len(json.loads(served)["messages"]) == 2_002
    reads = [s for s in statements if s.upper().startswith("SELECT")]
    assert len(reads) == 1 and "FROM conversations" in reads[0]
    assert not any("context_messages" in s for s in statements)


async def test_a_get_served_from_the_body_cache_is_one_statement(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a hit needs the conversation's row alone: one statement, which on PostgreSQL runs with
    # no transaction of its own (one round trip, not three)
    await create_with(services, "c1", history(20))
    await body(services.conversations, "c1")  # a miss: read and kept
    with selects(services) as statements:
        await body(services.conversations, "c1")
    read = [s for s in statements if s not in ("BEGIN", "COMMIT")]  # SQLite's transaction
    assert len(read) == 1 and "FROM conversations" in read[0]
    if services.repo.engine.dialect.name == "postgresql":
        with server_calls(monkeypatch) as calls:
            served = await body(services.conversations, "c1")
        assert [c.split()[0] for c in calls if not c.startswith("prepare ")] == ["SELECT"]
        assert len(json.loads(served)["messages"]) == 20


def test_the_body_cache_is_bounded_least_recently_used_first_out() -> None:
    cache = BodyCache(max_bytes=25)
    cache.keep(TENANT, "a", "i", 1, b"x" * 9)
    cache.keep(TENANT, "b", "i", 1, b"y" * 9)
    assert cache.lookup(TENANT, "a", "i", 1) == b"x" * 9  # a is now the most recent
    cache.keep(TENANT, "c", "i", 1, b"z" * 9)  # 27 > 25: b goes
    assert cache.lookup(TENANT, "b", "i", 1) is None
    assert cache.held_bytes == 18
    cache.keep(TENANT, "d", "i", 1, b"w" * 26)  # longer than the whole bound: not kept
    assert cache.lookup(TENANT, "d", "i", 1) is None and cache.held_bytes == 18
    assert cache.lookup(TENANT, "a", "i", 2) is None  # another version: a miss, and dropped
    assert cache.lookup(TENANT, "a", "i", 1) is None and cache.held_bytes == 9
    off = BodyCache(max_bytes=0)
    off.keep(TENANT, "a", "i", 1, b"")
    assert off.lookup(TENANT, "a", "i", 1) is None
