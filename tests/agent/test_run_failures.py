"""contract §3 — failed and cancelled runs. One test per line of the contract, named after it,
plus cancellation during a provider stream and during a tool batch."""

from __future__ import annotations

import asyncio
from typing import Any

from app.agent import (
    Agent,
    AgentConfig,
    AssistantMessage,
    Context,
    Input,
    Result,
    TextBlock,
    ToolResultMessage,
    UserMessage,
)
from app.agent.codec import dumps_context
from app.agent.events import CompactionCompleted, RunEvent, ToolFinished, ToolStarted
from app.agent.providers.base import ProviderError
from app.agent.replay import validate_context
from app.agent.retry import RetryPolicy
from app.agent.tools import Tool, ToolRegistry

from .scripted import HANG, Calls, Partial, ScriptedProvider

NO_WAIT = RetryPolicy(max_retries=2, base_delay=0.0, jitter=0.0)


def agent_for(provider: ScriptedProvider, **kwargs: Any) -> Agent:
    kwargs.setdefault("retry", NO_WAIT)
    return Agent(AgentConfig(provider=provider, **kwargs))


def history(turns: int) -> Context:
    """A replayable context of ``turns`` user/assistant pairs."""
    messages: list[Any] = []
    for i in range(turns):
        messages.append(UserMessage.text(f"question {i} " + "x" * 200))
        messages.append(
            AssistantMessage(
                content=(TextBlock(text=f"answer {i} " + "y" * 200),), provider="scripted"
            )
        )
    return Context(system_prompt="You are concise.", messages=tuple(messages))


def assert_replayable(result: Result) -> None:
    """The invariant every Result in the suite keeps (contract §1): replayable, or storable when
    it ends with pending calls (docs/tools.md)."""
    validate_context(result.context, allow_open_batch=result.required_action is not None)


async def run(agent: Agent, context: Context, *prompts: str, **kw: Any) -> Result:
    result = await agent.run(
        Input(context=context, prompts=tuple(UserMessage.text(p) for p in prompts)), **kw
    )
    assert_replayable(result)
    return result


# --- §3.1 --------------------------------------------------------------------------------


async def test_before_prompt_admission_final_is_null_and_new_messages_empty() -> None:
    provider = ScriptedProvider(script=[], summaries=[ProviderError("fatal", "summary refused")])
    agent = agent_for(provider, context_window=400, compact_at=0.5)
    base = history(4)

    result = await run(agent, base, "next question")

    assert result.status == "failed"
    assert result.final is None
    assert result.new_messages == ()
    assert result.compactions == ()
    assert result.context == base
    assert result.admitted is False
    assert result.error is not None and "summary refused" in result.error.message


async def test_before_admission_a_completed_compaction_stays_in_context_and_compactions() -> None:
    provider = ScriptedProvider(script=[])
    agent = agent_for(provider, context_window=400, compact_at=0.5)
    base = history(4)
    task: asyncio.Task[Result] | None = None

    async def cancel_after_compaction(event: RunEvent) -> None:
        if isinstance(event, CompactionCompleted):
            assert task is not None
            task.cancel()
            await asyncio.sleep(0)

    task = asyncio.create_task(
        agent.run(
            Input(context=base, prompts=(UserMessage.text("next"),)),
            on_event=cancel_after_compaction,
        )
    )
    result = await task

    assert result.status == "cancelled"
    assert result.final is None and result.new_messages == ()
    assert len(result.compactions) == 1
    compaction = result.compactions[0]
    assert compaction.reason == "threshold"
    assert result.context.summary == compaction.summary != ""
    assert result.context.messages == base.messages[len(compaction.folded) :]
    assert compaction.folded == base.messages[: len(compaction.folded)]
    assert compaction.tokens_after < compaction.tokens_before
    assert_replayable(result)


# --- §3.2 --------------------------------------------------------------------------------


async def test_after_prompt_admission_the_prompts_are_in_context() -> None:
    provider = ScriptedProvider(script=[ProviderError("fatal", "invalid request", status=400)])
    base = history(1)

    result = await run(agent_for(provider), base, "first", "second")

    assert result.status == "failed"
    assert result.admitted
    assert result.context.messages[:-2] == base.messages
    assert [m.content[0].text for m in result.context.messages[-2:]] == ["first", "second"]


async def test_after_prompt_admission_a_later_compaction_covers_the_prompts() -> None:
    provider = ScriptedProvider(
        script=[ProviderError("overflow", "too long"), ProviderError("fatal", "then broken")],
        summaries=["covers the first prompt"],
    )
    base = history(1)

    result = await run(agent_for(provider), base, "first", "second")

    assert result.status == "failed"
    [compaction] = result.compactions
    assert UserMessage.text("first") in compaction.folded
    assert result.context.summary == "covers the first prompt"
    assert result.context.messages == (UserMessage.text("second"),)


# --- §3.3 --------------------------------------------------------------------------------


async def test_assistant_attempts_every_attempt_in_new_messages_only_last_is_final() -> None:
    provider = ScriptedProvider(
        script=[
            Partial("half an ans", ProviderError("retryable", "connection reset")),
            "the whole answer",
        ]
    )

    result = await run(agent_for(provider), history(1), "question")

    attempts = [m for m in result.new_messages if isinstance(m, AssistantMessage)]
    assert [a.stop_reason for a in attempts] == ["error", "end_turn"]
    assert attempts[0].content == (TextBlock(text="half an ans"),)
    assert result.final == attempts[1]
    assert result.status == "completed"


async def test_assistant_attempts_an_errored_attempt_is_not_added_to_context() -> None:
    provider = ScriptedProvider(script=[Partial("cut", ProviderError("fatal", "bad gateway"))])
    base = history(1)

    result = await run(agent_for(provider), base, "question")

    assert result.status == "failed"
    assert result.final is not None and result.final.stop_reason == "error"
    assert result.final.content == (TextBlock(text="cut"),)
    assert result.final.error is not None and result.final.error.message == "bad gateway"
    assert result.final in result.new_messages
    assert result.final not in result.context.messages
    assert result.context.messages == (*base.messages, UserMessage.text("question"))


async def test_assistant_attempts_an_overflow_retry_replaces_the_failed_attempt_as_final() -> None:
    provider = ScriptedProvider(script=[ProviderError("overflow", "prompt is too long"), "fits"])

    result = await run(agent_for(provider), history(3), "question")

    assert result.status == "completed"
    attempts = [m for m in result.new_messages if isinstance(m, AssistantMessage)]
    assert [a.stop_reason for a in attempts] == ["error", "end_turn"]
    assert attempts[0].error is not None and attempts[0].error.kind == "overflow"
    assert result.final == attempts[1]
    assert [c.reason for c in result.compactions] == ["overflow"]
    assert result.context.messages == (UserMessage.text("question"), attempts[1])
    # the retry was sent the summary, not the folded messages
    retry = provider.requests[1]
    assert retry.messages[0].content[0].text.endswith(result.context.summary)
    assert len(retry.messages) == 2


# --- §3.4 --------------------------------------------------------------------------------


def blocking_tools() -> tuple[ToolRegistry, dict[str, int]]:
    calls = {"fast": 0, "slow": 0}

    async def fast() -> str:
        calls["fast"] += 1
        return "fast done"

    async def slow() -> str:
        calls["slow"] += 1
        await asyncio.Event().wait()
        return "never"

    registry = ToolRegistry(
        tools={
            "fast": Tool.from_function(fast),
            "slow": Tool.from_function(slow),
        }
    )
    return registry, calls


async def test_tool_batch_failure_replayable_attempt_and_recorded_results_stay_in_context() -> None:
    registry, _ = blocking_tools()
    provider = ScriptedProvider(script=[Calls((("c1", "slow", "{}"), ("c2", "fast", "{}")))])
    agent = agent_for(provider, tools=registry)
    task: asyncio.Task[Result] | None = None

    async def cancel_when_fast_finished(event: RunEvent) -> None:
        if isinstance(event, ToolFinished) and event.result.tool_name == "fast":
            assert task is not None
            task.cancel()

    task = asyncio.create_task(
        agent.run(
            Input(context=Context(), prompts=(UserMessage.text("go"),)),
            on_event=cancel_when_fast_finished,
        )
    )
    result = await asyncio.wait_for(task, 10)

    assert result.status == "cancelled"
    assert_replayable(result)
    kinds = [m.type for m in result.context.messages]
    assert kinds == ["user", "assistant", "tool_result", "tool_result"]
    # in call order: the unfinished c1 is closed as interrupted (docs/tools.md), c2 finished
    closed, finished = result.context.messages[2:]
    assert isinstance(closed, ToolResultMessage) and isinstance(finished, ToolResultMessage)
    assert closed.tool_call_id == "c1" and closed.is_error
    assert finished.tool_call_id == "c2" and not finished.is_error
    assert result.final is not None and result.final.tool_calls


async def cancelled_during_tool_batch(agent: Agent) -> Result:
    """Run on "go" and cancel the run's task once its tool batch has started."""
    started = asyncio.Event()

    async def on_event(event: RunEvent) -> None:
        if isinstance(event, ToolStarted):
            started.set()

    task = asyncio.create_task(
        agent.run(Input(context=Context(), prompts=(UserMessage.text("go"),)), on_event=on_event)
    )
    await asyncio.wait_for(started.wait(), 5)
    await asyncio.sleep(0)
    task.cancel()
    return await asyncio.wait_for(task, 5)


async def test_tool_batch_failure_the_run_closes_its_unfinished_calls_so_the_next_run_goes_on() -> (
    None
):
    """The failing run closes the calls it could not finish (``interrupted``), so a context
    keeps no unanswered call but pending ones (docs/tools.md) and the next run just goes on."""
    registry, _ = blocking_tools()
    provider = ScriptedProvider(script=[Calls((("c1", "slow", "{}"),)), "after the batch"])
    agent = agent_for(provider, tools=registry)
    cancelled = await cancelled_during_tool_batch(agent)
    assert cancelled.status == "cancelled"
    closing = cancelled.context.messages[-1]
    assert isinstance(closing, ToolResultMessage) and closing.is_error
    assert closing.tool_call_id == "c1" and "interrupted" in closing.content[0].text
    assert closing in cancelled.new_messages
    validate_context(cancelled.context)

    result = await run(agent, cancelled.context, "continue")

    assert result.status == "completed"
    assert [m.type for m in result.new_messages] == ["user", "assistant"]
    validate_context(result.context)


# --- §3.5 --------------------------------------------------------------------------------


async def test_tool_side_effects_the_returned_context_keeps_results_so_no_tool_is_rerun() -> None:
    effects: list[str] = []

    async def transfer(amount: int) -> str:
        effects.append(f"sent {amount}")
        return "ok"

    registry = ToolRegistry(tools={"transfer": Tool.from_function(transfer)})
    provider = ScriptedProvider(
        script=[
            Calls((("t1", "transfer", '{"amount": 5}'),)),
            ProviderError("fatal", "provider went away"),
            "done",
        ]
    )
    agent = agent_for(provider, tools=registry)

    failed = await run(agent, Context(), "pay")
    assert failed.status == "failed"
    assert effects == ["sent 5"]
    assert any(isinstance(m, ToolResultMessage) for m in failed.context.messages)

    # continuing from the kept state does not re-run the transfer
    resumed = await run(agent, failed.context, "and now?")
    assert resumed.status == "completed"
    assert effects == ["sent 5"]


# --- cancellation at any await point ------------------------------------------------------


async def test_cancel_during_stream_records_an_aborted_attempt_with_partial_content() -> None:
    provider = ScriptedProvider(script=[HANG])
    agent = agent_for(provider)
    base = history(1)
    task = asyncio.create_task(agent.run(Input(context=base, prompts=(UserMessage.text("q"),))))
    await asyncio.wait_for(provider.streaming.wait(), 5)
    task.cancel()
    result = await task

    assert result.status == "cancelled"
    assert result.error is not None and result.error.kind == "aborted"
    assert result.final is not None and result.final.stop_reason == "aborted"
    assert result.final.content == (TextBlock(text="partial answer"),)
    assert result.context.messages == (*base.messages, UserMessage.text("q"))
    assert_replayable(result)


async def test_cancel_during_tool_batch_cancels_the_tools() -> None:
    registry, _ = blocking_tools()
    provider = ScriptedProvider(script=[Calls((("c1", "slow", "{}"),))])
    agent = agent_for(provider, tools=registry)
    result = await cancelled_during_tool_batch(agent)

    assert result.status == "cancelled"
    assert [m.type for m in result.context.messages] == ["user", "assistant", "tool_result"]
    assert_replayable(result)
    pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert not any("slow" in repr(t.get_coro()) for t in pending)


# --- the input is never mutated -----------------------------------------------------------


async def test_input_context_is_unchanged_after_success_failure_and_cancel() -> None:
    base = history(2)
    snapshot = dumps_context(base)
    scripts: list[list[Any]] = [["fine"], [ProviderError("fatal", "no")], [HANG]]
    for script in scripts:
        provider = ScriptedProvider(script=script)
        agent = agent_for(provider)
        task = asyncio.create_task(agent.run(Input(context=base, prompts=(UserMessage.text("q"),))))
        if script[0] is HANG:
            await asyncio.wait_for(provider.streaming.wait(), 5)
            task.cancel()
        result = await task
        assert result.context != base
        assert dumps_context(base) == snapshot
    assert base == history(2)
