"""Limits on what a run stores (app/service/bounds.py), through the run service on both
engines: a provider answer or summary past ``max_answer_chars`` fails its attempt, and a run
past ``run_deadline_seconds`` ends failed — each with its own problem type, nothing lost, and
whatever was stored fits a PUT of the context. No wall clock is read: the deadline run is held
at a gate that never opens, so only the deadline can end it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from app.agent.messages import AssistantMessage, Context, TextBlock, UserMessage, text_of
from app.agent.providers.echo import EchoProvider
from app.api.limits import check_context
from app.api.views import run_problem
from app.config import AgentProfile, Settings
from app.service.agents import AgentPool, build_agent
from app.service.bounds import ANSWER_TOO_LARGE, RUN_DEADLINE
from app.service.runs import ActiveRun, FinishedRun, RunManager, RunRequest
from app.store.stores import Loaded
from tests.fakes.gated import GatedProvider, gated_pool

from .conftest import TENANT, Services

PROBLEMS = "https://carryover.dev/problems/"


def request(*prompts: str, **options: Any) -> RunRequest:
    return RunRequest(prompts=tuple(UserMessage.text(p) for p in prompts), **options)


async def run_on(runs: RunManager, conv: str, req: RunRequest) -> FinishedRun:
    active = await runs.start(TENANT, conv, req, if_match=None)
    assert isinstance(active, ActiveRun)
    return await asyncio.wait_for(
        runs.wait(active, on_disconnect="continue", disconnected=None), 30
    )


async def stored(services: Services, conv: str) -> Context:
    loaded = await services.conversations.get_context(TENANT, conv)
    assert isinstance(loaded, Loaded)
    return loaded.context


def manager(services: Services, pool: AgentPool, **settings: Any) -> RunManager:
    merged = Settings(**{**services.runs.settings.model_dump(), **settings})
    return RunManager(services.repo, pool, merged, services.clock)


@pytest.fixture
async def bounded(services: Services) -> AsyncIterator[RunManager]:
    settings = Settings(
        database_url=services.runs.settings.database_url,
        max_text_chars=120,
        max_answer_chars=100,
        context_window=2_000,
    )
    pool = AgentPool(settings)
    pool.put("default", build_agent(AgentProfile(), EchoProvider(), max_answer_chars=100))
    runs = RunManager(services.repo, pool, settings, services.clock)
    try:
        yield runs
    finally:
        await runs.aclose()


def test_max_answer_chars_may_not_exceed_what_a_put_accepts() -> None:
    with pytest.raises(ValueError, match="max_answer_chars"):
        Settings(max_text_chars=100, max_answer_chars=101)
    assert Settings(max_text_chars=100).answer_limit == 100


async def test_an_oversized_answer_fails_the_attempt_and_what_is_kept_can_be_put_back(
    services: Services, bounded: RunManager
) -> None:
    await services.conversations.create(TENANT, "c1")
    fine = await run_on(bounded, "c1", request("short"))
    assert fine.outcome.status == "completed"
    big = "x" * 90  # the echo answers 'Echo: I saw … You said: "x…x"': past 100 characters
    finished = await run_on(bounded, "c1", request(big))
    assert (finished.outcome.status, finished.outcome.stored) == ("failed", True)
    assert finished.result.error is not None and finished.result.error.code == ANSWER_TOO_LARGE
    problem = run_problem(finished.result.error, "failed")
    assert problem is not None and problem.type == PROBLEMS + "run-answer-too-large"
    context = await stored(services, "c1")
    assert [text_of(m) for m in context.messages if isinstance(m, UserMessage)] == ["short", big]
    failed = finished.result.new_messages[-1]  # the failed attempt, in the run's records
    assert isinstance(failed, AssistantMessage) and not failed.replayable
    assert len(text_of(failed)) <= 100  # the delta that would pass the bound was not taken
    check_context(bounded.settings, context)  # a PUT of it would be accepted


async def test_an_oversized_summary_fails_the_compaction_and_changes_nothing(
    services: Services, bounded: RunManager
) -> None:
    """The echo summary is a line per folded message: 30 messages make one past 100 chars."""
    messages = tuple(
        UserMessage.text(f"u{i}")
        if i % 2 == 0
        else AssistantMessage(content=(TextBlock(text=f"a{i}"),))
        for i in range(30)
    )
    await services.conversations.put_context(
        TENANT,
        "c1",
        Context(messages=(*messages, UserMessage.text("now"))),
        if_match=None,
        if_none_match=_star(),
    )
    before = await stored(services, "c1")
    bounded_svc = services.conversations.__class__(services.repo, bounded)
    compacted = await bounded_svc.compact(TENANT, "c1")
    assert compacted.result.status == "failed" and not compacted.outcome.stored
    assert compacted.result.error is not None and compacted.result.error.code == ANSWER_TOO_LARGE
    assert await stored(services, "c1") == before


def _star() -> Any:
    from app.etag import parse_condition

    return parse_condition("*", "If-None-Match")


@pytest.mark.parametrize("on_failure", ["keep", "discard"])
async def test_a_run_past_its_deadline_ends_failed_and_the_failure_table_applies(
    services: Services, on_failure: str
) -> None:
    gate = GatedProvider(hold=lambda prompt: prompt == "stall")  # never released
    settings = Settings(database_url=services.runs.settings.database_url, run_deadline_seconds=0.2)
    runs = RunManager(services.repo, gated_pool(settings, gate), settings, services.clock)
    try:
        await services.conversations.create(TENANT, "c1")
        await run_on(runs, "c1", request("first"))
        finished = await run_on(runs, "c1", request("stall", on_failure=on_failure))
        assert gate.held and gate.held[0].cancelled  # it was stopped waiting on the provider
        assert finished.outcome.status == "failed"
        assert finished.result.error is not None and finished.result.error.code == RUN_DEADLINE
        problem = run_problem(finished.result.error, "failed")
        assert problem is not None and problem.type == PROBLEMS + "run-deadline-exceeded"
        texts = [
            text_of(m)
            for m in (await stored(services, "c1")).messages
            if isinstance(m, UserMessage)
        ]
        if on_failure == "keep":
            assert finished.outcome.stored and texts == ["first", "stall"]
        else:
            assert not finished.outcome.stored and texts == ["first"]
        record = await runs.record(TENANT, "c1", finished.run.run_id)
        assert record.run.status == "failed" and record.run.error is not None
        assert record.run.error["code"] == RUN_DEADLINE
        # the conversation is free again
        assert (await run_on(runs, "c1", request("after"))).outcome.status == "completed"
    finally:
        await runs.aclose()


async def test_a_cancel_before_the_deadline_stays_a_cancel(services: Services) -> None:
    gate = GatedProvider(hold=lambda prompt: prompt == "stall")
    settings = Settings(database_url=services.runs.settings.database_url, run_deadline_seconds=600)
    runs = RunManager(services.repo, gated_pool(settings, gate), settings, services.clock)
    try:
        await services.conversations.create(TENANT, "c1")
        active = await runs.start(TENANT, "c1", request("stall"), if_match=None)
        assert isinstance(active, ActiveRun)
        await gate.arrival("stall")
        await runs.cancel(TENANT, "c1", active.run_id)
        finished = await runs.wait(active, on_disconnect="continue", disconnected=None)
        assert finished.outcome.status == "cancelled"
    finally:
        await runs.aclose()
