"""The context cache is bounded in bytes, not only in messages (docs/operations.md, "Memory").

Large prompts must not let a process hold more parsed contexts than its byte bound, whichever
tenant sends them; an entry's bytes count the provider encodings carried with its context.
"""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from app.agent.messages import AssistantMessage, Context, TextBlock, UserMessage
from app.agent.opaque import prepare
from app.agent.providers.openai.request import CHAT
from app.agent.sizes import size_of
from app.config import Settings
from app.service.agents import AgentPool
from app.service.cache import ContextCache
from app.service.conversations import ConversationService
from app.service.runs import ActiveRun, RunManager, RunRequest
from app.store.db import make_engine
from app.store.stores import Loaded, Stores

from .conftest import TENANT

KB = 1024


def _big(n: int, text_bytes: int) -> Context:
    messages: list[Any] = []
    for i in range(n):
        text = f"{i:04d}" + "x" * (text_bytes - 4)
        messages.append(
            UserMessage.text(text)
            if i % 2 == 0
            else AssistantMessage(content=(TextBlock(text=text),))
        )
    return Context(messages=tuple(messages))


def _loaded(context: Context, version: int = 1) -> Loaded:
    size = size_of(context.system_prompt, context.summary, context.messages)
    n = len(context.messages)
    return Loaded(context, f'"i-{version}"', version, "i", 0, n, size=size)


def test_large_contexts_are_evicted_by_their_bytes() -> None:
    cache = ContextCache(max_messages=10**6, max_bytes=500 * KB)
    for name in ("a", "b", "c"):
        cache.keep(TENANT, name, _loaded(_big(10, 20 * KB)))  # about 210 KiB each
        assert cache.held_bytes <= 500 * KB
    assert cache.lookup(TENANT, "a", "i", 1) is None  # the least recently used went first
    assert cache.lookup(TENANT, "c", "i", 1) is not None
    assert cache.held_bytes > 400 * KB and len(cache) == 2
    cache.keep(TENANT, "huge", _loaded(_big(30, 20 * KB)))  # larger than the bound: not kept
    assert cache.lookup(TENANT, "huge", "i", 1) is None and cache.held_bytes <= 500 * KB


def test_the_provider_encodings_of_a_context_count_toward_its_bytes() -> None:
    plain, encoded = _big(10, 20 * KB), _big(10, 20 * KB)
    prepare(encoded, "openai", CHAT)
    cache = ContextCache(max_messages=10**6, max_bytes=10**9)
    cache.keep(TENANT, "plain", _loaded(plain))
    alone = cache.held_bytes
    cache.keep(TENANT, "encoded", _loaded(encoded))
    assert cache.held_bytes - alone >= alone + 190 * KB  # its encoding: the texts once more


@asynccontextmanager
async def _runs(
    database_url: str, **settings: Any
) -> AsyncIterator[tuple[RunManager, ConversationService]]:
    """The run and conversation services on ``database_url`` configured by ``settings``."""
    config = Settings(database_url=database_url, **settings)
    engine = make_engine(database_url)
    pool = AgentPool(config)
    repo = Stores(engine)
    runs = RunManager(repo, pool, config)
    try:
        yield runs, ConversationService(repo, runs)
    finally:
        await runs.aclose()
        await pool.aclose()
        await engine.dispose()


async def _run(runs: RunManager, conv: str, prompt: str) -> None:
    active = await runs.start(
        TENANT, conv, RunRequest(prompts=(UserMessage.text(prompt),)), if_match=None
    )
    assert isinstance(active, ActiveRun)
    finished = await asyncio.wait_for(
        runs.wait(active, on_disconnect="continue", disconnected=None), 60
    )
    assert finished.outcome.stored


async def test_runs_with_large_prompts_hold_the_cache_to_its_byte_bound(
    database_url: str,
) -> None:
    prompt = "p" * (20 * KB)
    async with _runs(database_url, context_cache_bytes=300 * KB) as (runs, conversations):
        for i in range(12):
            await conversations.create(TENANT, f"c{i}")
            for _ in range(2):
                await _run(runs, f"c{i}", prompt)
                assert 0 < runs.contexts.held_bytes <= 300 * KB
        assert len(runs.contexts) < 12  # 12 conversations of about 40 KiB each do not all fit


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_soak_of_large_prompts_stays_within_the_memory_ceiling(
    database_url: str,
) -> None:
    """The Python memory a process holds after many runs with 190 KiB prompts on many
    conversations grows by at most its context cache's bound and a fixed margin, not with what
    was stored (7.4 MiB of prompts here; with no bound the growth is about that)."""
    bound = 1024 * KB
    prompt = "s" * (190 * KB)
    async with _runs(database_url, context_cache_bytes=bound) as (runs, conversations):

        async def rounds(first: int, count: int) -> None:
            for i in range(first, first + count):
                await conversations.create(TENANT, f"s{i}")
                for _ in range(2):
                    await _run(runs, f"s{i}", prompt)

        tracemalloc.start()
        try:
            await rounds(0, 3)  # warm: imports, statement caches, pools
            gc.collect()
            warm, _ = tracemalloc.get_traced_memory()
            await rounds(3, 20)
            gc.collect()
            after, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert runs.contexts.held_bytes <= bound
    assert after - warm <= bound + 4 * 1024 * KB, (after - warm) // KB
