"""Results of the real agent (echo provider) stored run after run: every reload is exactly
``result.context``, written incrementally (never by the whole-rewrite fallback)."""

from __future__ import annotations

import logging

import pytest

from app.agent import Agent, AgentConfig, Context, Input, UserMessage
from app.agent.providers.echo import EchoProvider
from app.agent.records import Result
from app.agent.retry import RetryPolicy
from app.agent.tools import ToolRegistry
from tests.repository import Repository

T = "acme"

TOOLS = ToolRegistry.from_paths(
    ["app.agent.builtin_tools:time_now", "app.agent.builtin_tools:fail"]
)


def echo_agent(context_window: int = 128_000) -> Agent:
    return Agent(
        AgentConfig(
            provider=EchoProvider(),
            tools=TOOLS,
            context_window=context_window,
            compact_at=0.5,
            keep_after_compaction=0.2,
            retry=RetryPolicy(max_retries=0, base_delay=0.0, jitter=0.0),
        )
    )


async def run_and_store(repo: Repository, agent: Agent, text: str | None) -> Result:
    base = await repo.load_context(T, "c1")
    prompts = (UserMessage.text(text),) if text is not None else ()
    result = (
        await agent.run(Input(context=base.context, prompts=prompts))
        if text is not None
        else await agent.compact(base.context)
    )
    run = await repo.insert_run(T, "c1", base_etag=base.etag, prompts=prompts)
    outcome = await repo.finish_run(T, "c1", run.run_id, base=base, result=result, store=True)
    assert outcome.stored
    assert (await repo.load_context(T, "c1")).context == result.context
    return result


async def test_agent_results_reload_exactly(
    repo: Repository, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="app.store.changes")
    await repo.replace_context(T, "c1", Context(system_prompt="Be brief."), create=True)
    plain = echo_agent()
    small_window = echo_agent(context_window=400)

    for i in range(4):
        await run_and_store(repo, plain, f"question {i} " + "words " * 20)
    tooled = await run_and_store(repo, plain, "/tool time_now {}")
    assert [m.type for m in tooled.new_messages] == [
        "user",
        "assistant",
        "tool_result",
        "assistant",
    ]
    overflowed = await run_and_store(repo, plain, "/overflow please")
    assert [c.reason for c in overflowed.compactions] == ["overflow"]
    failed = await run_and_store(repo, plain, "/fail now")
    assert failed.status == "failed"
    squeezed = [
        await run_and_store(repo, small_window, f"more {i} " + "words " * 30) for i in range(4)
    ]
    assert {c.reason for r in squeezed for c in r.compactions} == {"threshold"}
    manual = await run_and_store(repo, plain, None)
    assert [c.reason for c in manual.compactions] == ["manual"]

    assert not [r for r in caplog.records if "does not extend" in r.getMessage()]

    # The overflow run is transcribed in the order it happened.
    runs = await repo.list_runs(T, "c1", limit=100)
    overflow_run = runs[5].run_id
    entries = [
        e for e in await repo.list_transcript(T, "c1", limit=1000) if e.run_id == overflow_run
    ]
    assert [(e.kind, e.failed) for e in entries] == [
        ("prompt", False),
        ("attempt", True),
        ("compaction", False),
        ("attempt", False),
    ]
    # Threshold compactions of the small-window runs come before their prompts.
    for run_id in [r.run_id for r in runs[7:11]]:
        kinds = [
            e.kind for e in await repo.list_transcript(T, "c1", limit=1000) if e.run_id == run_id
        ]
        assert kinds[0] in ("compaction", "prompt") and kinds.count("prompt") == 1
        if "compaction" in kinds:
            assert kinds.index("compaction") < kinds.index("prompt")
