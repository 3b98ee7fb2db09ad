"""The cache of parsed contexts (app/service/cache.py) through the run service, on both
engines: never served stale, and a cached run reads a constant number of rows.

Staleness is judged by what the run saw: the echo provider answers with the number of messages
it was sent, and the run's context must extend exactly what was stored.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event

from app.agent.messages import AssistantMessage, Context, TextBlock, UserMessage, text_of
from app.agent.tokens import tally_of
from app.etag import parse_condition
from app.service.agents import AgentPool
from app.service.cache import ContextCache
from app.service.runs import ActiveRun, FinishedRun, RunManager, RunRequest
from app.store.stores import Loaded
from tests.fakes.gated import GatedProvider, gated_pool

from .conftest import TENANT, Services


def request(*prompts: str, **options: Any) -> RunRequest:
    return RunRequest(prompts=tuple(UserMessage.text(p) for p in prompts), **options)


async def run_on(runs: RunManager, conv: str, req: RunRequest) -> FinishedRun:
    active = await runs.start(TENANT, conv, req, if_match=None)
    assert isinstance(active, ActiveRun)
    return await asyncio.wait_for(
        runs.wait(active, on_disconnect="continue", disconnected=None), 20
    )


def saw(finished: FinishedRun) -> str:
    assert finished.result.final is not None
    return text_of(finished.result.final)


def history(n: int) -> Context:
    messages: list[Any] = []
    for i in range(n):
        text = f"m{i:05d} " + "a" * 50
        messages.append(
            UserMessage.text(text)
            if i % 2 == 0
            else AssistantMessage(content=(TextBlock(text=text),), stop_reason="end_turn")
        )
    return Context(system_prompt="be brief", messages=tuple(messages))


async def stored(services: Services, conv: str) -> Loaded:
    loaded = await services.conversations.get_context(TENANT, conv)
    assert isinstance(loaded, Loaded)
    return loaded


async def create_with(services: Services, conv: str, context: Context) -> None:
    """Create ``conv`` holding ``context`` (PUT with If-None-Match: *)."""
    await services.conversations.put_context(
        TENANT, conv, context, if_match=None, if_none_match=parse_condition("*", "If-None-Match")
    )


async def put(services: Services, conv: str, context: Context) -> None:
    current = await stored(services, conv)
    await services.conversations.put_context(
        TENANT, conv, context, if_match=parse_condition(current.etag), if_none_match=None
    )


async def test_a_second_run_is_served_from_the_cache_and_sees_what_is_stored(
    services: Services,
) -> None:
    await services.conversations.create(TENANT, "c1")
    first = await run_on(services.runs, "c1", request("one"))
    hits = services.runs.contexts.hits
    second = await run_on(services.runs, "c1", request("two"))
    assert services.runs.contexts.hits == hits + 1
    assert "I saw 3 messages" in saw(second)
    assert second.result.context.messages[:2] == first.result.context.messages
    assert (await stored(services, "c1")).context == second.result.context


async def test_a_put_between_runs_is_a_miss(services: Services) -> None:
    await services.conversations.create(TENANT, "c1")
    await run_on(services.runs, "c1", request("one"))
    await put(services, "c1", history(5))
    finished = await run_on(services.runs, "c1", request("after put"))
    assert "I saw 6 messages" in saw(finished)
    assert finished.result.context.messages[:5] == history(5).messages


async def test_delete_and_recreate_is_a_miss(services: Services) -> None:
    await services.conversations.create(TENANT, "c1")
    await run_on(services.runs, "c1", request("one"))
    await run_on(services.runs, "c1", request("two"))
    await services.conversations.delete(TENANT, "c1")
    await services.conversations.create(TENANT, "c1")
    finished = await run_on(services.runs, "c1", request("fresh"))
    assert "I saw 1 message." in saw(finished)


async def test_another_processs_run_is_a_miss(services: Services) -> None:
    """Two managers on one database, as two processes: each has its own cache."""
    other = RunManager(services.repo, AgentPool(services.runs.settings), services.runs.settings)
    try:
        await services.conversations.create(TENANT, "c1")
        await run_on(services.runs, "c1", request("here"))  # our cache holds version 2
        await run_on(other, "c1", request("elsewhere"))  # version 3, written by "them"
        finished = await run_on(services.runs, "c1", request("here again"))
        assert "I saw 5 messages" in saw(finished)
        texts = [text_of(m) for m in finished.result.context.messages if isinstance(m, UserMessage)]
        assert texts == ["here", "elsewhere", "here again"]
    finally:
        await other.aclose()


async def test_a_failed_discarded_run_leaves_the_cached_context_current(
    services: Services,
) -> None:
    await services.conversations.create(TENANT, "c1")
    await run_on(services.runs, "c1", request("one"))
    failed = await run_on(services.runs, "c1", request("/fail", on_failure="discard"))
    assert (failed.outcome.status, failed.outcome.stored) == ("failed", False)
    finished = await run_on(services.runs, "c1", request("two"))
    assert "I saw 3 messages" in saw(finished)
    assert (await stored(services, "c1")).context == finished.result.context


@pytest.fixture
async def gated(services: Services) -> AsyncIterator[tuple[RunManager, GatedProvider]]:
    gate = GatedProvider(hold=lambda prompt: prompt.startswith("hold"))
    settings = services.runs.settings
    runs = RunManager(services.repo, gated_pool(settings, gate), settings, services.clock)
    try:
        yield runs, gate
    finally:
        gate.open()
        await runs.aclose()


async def test_a_conflicted_run_is_not_cached_and_the_next_run_sees_the_put(
    services: Services, gated: tuple[RunManager, GatedProvider]
) -> None:
    runs, gate = gated
    await services.conversations.create(TENANT, "c1")
    await run_on(runs, "c1", request("one"))
    active = await runs.start(TENANT, "c1", request("hold me"), if_match=None)
    assert isinstance(active, ActiveRun)
    held = await gate.arrival("hold me")
    await put(services, "c1", history(3))  # while the run is in flight
    held.release()
    conflicted = await runs.wait(active, on_disconnect="continue", disconnected=None)
    assert (conflicted.outcome.status, conflicted.outcome.stored) == ("conflicted", False)
    finished = await run_on(runs, "c1", request("next"))
    assert "I saw 4 messages" in saw(finished)
    assert finished.result.context.messages[:3] == history(3).messages


async def test_the_stored_tally_equals_a_recount_after_runs_put_and_compaction(
    services: Services,
) -> None:
    await services.conversations.create(TENANT, "c1")
    for text in ("one", "two"):
        await run_on(services.runs, "c1", request(text))
    assert (await stored(services, "c1")).tokens == tally_of(
        (await stored(services, "c1")).context.messages
    )
    await put(services, "c1", history(40))
    assert (await stored(services, "c1")).tokens == tally_of(history(40).messages)
    await run_on(services.runs, "c1", request("three"))
    compacted = await services.conversations.compact(TENANT, "c1")
    assert compacted.result.compactions and compacted.outcome.stored
    await run_on(services.runs, "c1", request("four"))
    services.runs.contexts.forget(TENANT, "c1")  # read it back from the database
    loaded = await stored(services, "c1")
    assert loaded.tokens == tally_of(loaded.context.messages)
    assert loaded.tokens is not None and loaded.tokens.messages > 0


def test_the_cache_is_bounded_least_recently_used_first_out() -> None:
    def loaded(n: int, version: int = 1) -> Loaded:
        return Loaded(history(n), f'"i-{version}"', version, "i", 0, n)

    cache = ContextCache(max_messages=25)
    cache.keep(TENANT, "a", loaded(9))
    cache.keep(TENANT, "b", loaded(9))
    assert cache.lookup(TENANT, "a", "i", 1) is not None  # a is now the most recent
    cache.keep(TENANT, "c", loaded(9))  # 30 > 25: b goes
    assert cache.lookup(TENANT, "b", "i", 1) is None
    assert cache.lookup(TENANT, "a", "i", 1) is not None
    assert cache.held_messages == 20
    cache.keep(TENANT, "d", loaded(30))  # longer than the whole bound: not kept
    assert cache.lookup(TENANT, "d", "i", 1) is None and cache.held_messages == 20
    assert cache.lookup(TENANT, "a", "i", 2) is None  # another version: a miss, and dropped
    assert cache.lookup(TENANT, "a", "i", 1) is None and cache.held_messages == 10
    off = ContextCache(max_messages=0)
    off.keep(TENANT, "a", loaded(0))
    assert off.lookup(TENANT, "a", "i", 1) is None


# --- reads: a cached run reads a constant number of rows --------------------------------------


@contextmanager
def selects(services: Services) -> Iterator[list[str]]:
    seen: list[str] = []

    def after(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(" ".join(statement.split()))

    engine = services.repo.engine.sync_engine
    event.listen(engine, "after_cursor_execute", after)
    try:
        yield seen
    finally:
        event.remove(engine, "after_cursor_execute", after)


async def test_a_cached_run_reads_the_same_rows_at_10_and_5000_messages(
    services: Services,
) -> None:
    seen: dict[int, list[str]] = {}
    for size in (10, 5_000):
        conv = f"c{size}"
        await create_with(services, conv, history(size))
        await run_on(services.runs, conv, request("warm"))  # a miss: it fills the cache
        with selects(services) as statements:
            finished = await run_on(services.runs, conv, request("cached"))
        assert finished.outcome.stored
        seen[size] = [s.replace(conv, "?") for s in statements]
    assert seen[10] == seen[5_000]
    reads = [s for s in seen[10] if s.upper().startswith("SELECT")]
    # the conversation row under the lock, which says whether the tenant has a quota (none
    # here: no quota row is read, app/store/quotas.py); no message row at all
    assert not any("context_messages" in s for s in reads)
    assert len(reads) == 1 and "FROM conversations" in reads[0]


async def test_a_forks_tally_equals_a_recount_whole_or_a_prefix_and_after_a_run(
    services: Services,
) -> None:
    """A fork once stored the empty context's tally: every run on it underestimated its
    context by the whole copied history (and compacted too late)."""
    await create_with(services, "src", history(40))
    await services.conversations.fork(TENANT, "src", "whole")
    await services.conversations.fork(TENANT, "src", "prefix", messages=10)
    for conv, n in (("whole", 40), ("prefix", 10)):
        loaded = await stored(services, conv)  # read back from the database
        assert len(loaded.context.messages) == n
        assert loaded.tokens == tally_of(loaded.context.messages)
        assert loaded.tokens is not None and loaded.tokens.messages > 0
        await run_on(services.runs, conv, request("on the fork"))
        services.runs.contexts.forget(TENANT, conv)
        after = await stored(services, conv)
        assert after.tokens == tally_of(after.context.messages)
