"""Agent behaviour beyond §3: the seed's loop, projection, provider switching, retries,
compaction triggers, concurrency, and the echo provider's directives."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from app.agent import (
    Agent,
    AgentConfig,
    AssistantMessage,
    Context,
    Input,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from app.agent.compaction import SUMMARY_PREFIX, choose_cut
from app.agent.providers.base import ProviderError, ProviderRequest, StreamEvent
from app.agent.providers.echo import EchoProvider
from app.agent.replay import validate_context
from app.agent.retry import RetryPolicy
from app.agent.tokens import calibration, estimate
from app.agent.tools import ToolRegistry

from ..fakes.gated import GatedProvider
from ..helpers import HANG_GUARD_SECONDS
from .scripted import Calls, ScriptedProvider
from .test_run_failures import NO_WAIT, agent_for, history, run

BUILTINS = ToolRegistry.from_paths(
    [
        "app.agent.builtin_tools:time_now",
        "app.agent.builtin_tools:wait",
        "app.agent.builtin_tools:fail",
    ]
)


def echo_agent(**kw: Any) -> Agent:
    kw.setdefault("tools", BUILTINS)
    return Agent(AgentConfig(provider=EchoProvider(), retry=NO_WAIT, **kw))


async def test_seed_loop_second_run_sees_the_first_through_the_stored_context() -> None:
    agent = echo_agent()
    state = Context(system_prompt="You are a concise assistant.")
    first = await run(agent, state, "What is nvim?")
    state = first.context
    second = await run(agent, state, "How does it differ from vim?")

    assert second.final is not None
    assert second.final.content[0] == TextBlock(
        text='Echo: I saw 3 messages. You said: "How does it differ from vim?"'
    )
    assert second.context.messages[:2] == first.context.messages
    assert [m.type for m in second.context.messages] == ["user", "assistant"] * 2


async def test_summary_is_projected_as_one_user_message_before_the_messages() -> None:
    provider = ScriptedProvider(script=["ok"])
    context = Context(
        system_prompt="sys", summary="we talked about nvim", messages=history(1).messages
    )
    await run(agent_for(provider), context, "q")
    request = provider.requests[0]
    assert request.system_prompt == "sys"
    assert request.messages[0] == UserMessage.text(SUMMARY_PREFIX + "we talked about nvim")
    assert request.messages[1:] == (*context.messages, UserMessage.text("q"))


async def test_opaque_fields_of_another_provider_are_not_sent() -> None:
    theirs = AssistantMessage(
        content=(
            ThinkingBlock(thinking="hmm", signature="sig"),
            RedactedThinkingBlock(data="xx"),
            TextBlock(text="answer"),
        ),
        provider="anthropic",
        provider_data={"reasoning": "rs_1"},
    )
    only_thinking = AssistantMessage(
        content=(ThinkingBlock(thinking="", signature="s2"),),
        provider="anthropic",
    )
    ours = AssistantMessage(
        content=(ThinkingBlock(thinking="mine", signature="keep"), TextBlock(text="x")),
        provider="scripted",
        provider_data={"keep": True},
    )
    context = Context(
        messages=(
            UserMessage.text("a"),
            theirs,
            UserMessage.text("b"),
            only_thinking,
            UserMessage.text("c"),
            ours,
        )
    )
    provider = ScriptedProvider(script=["ok"])
    result = await run(agent_for(provider), context, "d")
    sent = provider.requests[0].messages
    assert sent[1] == AssistantMessage(content=(TextBlock(text="answer"),), provider="anthropic")
    assert only_thinking not in sent and len(sent) == 6
    assert sent[4] == ours
    # the stored context keeps everything as issued
    assert result.context.messages[:6] == context.messages


async def test_retryable_errors_before_any_content_are_retried_and_not_recorded() -> None:
    provider = ScriptedProvider(
        script=[
            ProviderError("retryable", "429", status=429, retry_after=0.0),
            ProviderError("retryable", "529", status=529),
            "finally",
        ]
    )
    result = await run(agent_for(provider), Context(), "q")
    assert result.status == "completed"
    assert [m.type for m in result.new_messages] == ["user", "assistant"]
    assert len(provider.requests) == 3


async def test_retries_are_bounded_and_the_last_error_says_so() -> None:
    provider = ScriptedProvider(script=[ProviderError("retryable", "overloaded", status=529)] * 3)
    result = await run(agent_for(provider), Context(), "q")
    assert result.status == "failed"
    assert result.error is not None
    assert result.error.message == "overloaded (after 2 retries)"
    assert result.final is not None and result.final.stop_reason == "error"


def test_retry_policy_honours_retry_after_and_caps_it() -> None:
    policy = RetryPolicy(base_delay=1.0, max_delay=30.0, jitter=0.0)
    assert policy.delay(1, 7.0) == 7.0
    assert policy.delay(1, 9999.0) == 30.0
    assert [policy.delay(n, None) for n in (1, 2, 3)] == [1.0, 2.0, 4.0]


async def test_fatal_errors_are_not_retried() -> None:
    provider = ScriptedProvider(script=[ProviderError("fatal", "invalid x-api-key", status=401)])
    result = await run(agent_for(provider), Context(), "q")
    assert result.status == "failed" and len(provider.requests) == 1
    assert result.error is not None and result.error.status == 401


async def test_threshold_compaction_before_admission_keeps_the_tail_under_budget() -> None:
    provider = ScriptedProvider(script=["ok"], summaries=["the gist"])
    base = history(10)
    agent = agent_for(provider, context_window=2000, compact_at=0.5, keep_after_compaction=0.2)
    result = await run(agent, base, "new question")
    [compaction] = result.compactions
    assert compaction.reason == "threshold"
    kept = result.context.messages[: len(base.messages) - len(compaction.folded)]
    assert estimate("You are concise.", "", kept) <= 400
    assert result.context.summary == "the gist"
    assert "(none yet)" in provider.summary_requests[0].messages[0].content[0].text


async def test_manual_compaction_keeps_the_current_turn_and_is_a_noop_when_nothing_to_fold() -> (
    None
):
    agent = echo_agent()
    base = history(3)
    result = await agent.compact(base)
    assert result.status == "completed"
    [compaction] = result.compactions
    assert compaction.reason == "manual"
    assert result.context.messages == base.messages[-2:]
    again = await agent.compact(Context(messages=(UserMessage.text("only"),)))
    assert again.status == "completed" and again.compactions == ()


def test_compaction_never_cuts_between_a_call_and_its_result() -> None:
    call = AssistantMessage(
        content=(ToolCallBlock(id="c", name="t", arguments="{}"),), stop_reason="tool_use"
    )
    result = ToolResultMessage(tool_call_id="c", tool_name="t", content=(TextBlock(text="r"),))
    messages = (
        UserMessage.text("a" * 4000),
        call,
        result,
        AssistantMessage(content=(TextBlock(text="done"),)),
    )
    context = Context(messages=messages)
    for keep in range(0, 2000, 50):
        cut = choose_cut(context, "threshold", keep_tokens=keep)
        assert cut is not None and cut != 2
        validate_context(Context(messages=messages[cut:]))


async def test_max_turns_ends_a_run_that_only_calls_tools() -> None:
    provider = ScriptedProvider(script=[Calls(((f"c{i}", "time_now", "{}"),)) for i in range(3)])
    result = await run(agent_for(provider, tools=BUILTINS, max_turns=3), Context(), "loop")
    assert result.status == "failed"
    assert result.error is not None and result.error.code == "max_turns"
    validate_context(result.context)


async def test_calibration_follows_the_providers_reported_usage() -> None:
    messages = (
        UserMessage.text("x" * 400),
        AssistantMessage(
            content=(TextBlock(text="y"),), usage=Usage(input_tokens=208, output_tokens=1)
        ),
    )
    assert calibration("", "", messages) == pytest.approx(2.0)
    assert estimate("", "", messages) == int((104 + 4) * 2.0)
    assert calibration("", "", messages[:1]) == 1.0


async def test_one_agent_serves_many_contexts_concurrently() -> None:
    gate = GatedProvider()  # answers as echo, once released
    agent = Agent(AgentConfig(provider=gate, retry=NO_WAIT, tools=BUILTINS))
    contexts = [Context(messages=history(n).messages) for n in range(20)]
    runs = asyncio.gather(*(run(agent, c, f"prompt {i}") for i, c in enumerate(contexts)))
    await gate.arrival(count=len(contexts))  # every run is in flight at once
    gate.release_all()
    results = await runs
    for i, (context, result) in enumerate(zip(contexts, results, strict=True)):
        assert result.context.messages[: len(context.messages)] == context.messages
        assert result.final is not None
        assert f"prompt {i}" in result.final.content[0].text  # type: ignore[union-attr]
        seen = len(context.messages) + 1
        assert f"I saw {seen} message" in result.final.content[0].text  # type: ignore[union-attr]


# --- echo directives (contract §6) ------------------------------------------------------------


async def test_echo_tool_directive_sends_raw_arguments_verbatim_then_quotes_the_result() -> None:
    raw = '{"seconds":0,  "x": [1,2]'  # not valid JSON, kept verbatim
    result = await run(echo_agent(), Context(), f"/tool wait {raw}")
    call = result.new_messages[1]
    assert isinstance(call, AssistantMessage)
    assert call.tool_calls[0].arguments == raw
    tool_result = result.new_messages[2]
    assert isinstance(tool_result, ToolResultMessage) and tool_result.is_error
    assert result.final is not None
    assert result.final.content[0].text.startswith("Tool wait failed:")  # type: ignore[union-attr]


async def test_echo_builtin_tools_time_now_wait_and_fail() -> None:
    agent = echo_agent()
    ok = await run(agent, Context(), '/tool wait {"seconds": 0}')
    assert 'Tool wait returned: "waited 0 seconds"' in ok.final.content[0].text  # type: ignore[union-attr]
    failed = await run(agent, Context(), "/tool fail {}")
    assert "Tool fail failed" in failed.final.content[0].text  # type: ignore[union-attr]
    now = await run(agent, Context(), "/tool time_now {}")
    assert "Tool time_now returned" in now.final.content[0].text  # type: ignore[union-attr]


async def test_echo_fail_and_overflow_directives() -> None:
    agent = echo_agent()
    failed = await run(agent, history(1), "/fail")
    assert failed.status == "failed" and failed.error is not None
    assert failed.error.status == 500
    overflowed = await run(agent, history(2), "/overflow")
    assert overflowed.status == "completed"
    assert [c.reason for c in overflowed.compactions] == ["overflow"]
    assert "and a summary" in overflowed.final.content[0].text  # type: ignore[union-attr]


async def test_echo_sleep_directive_can_be_cancelled() -> None:
    sleeping = asyncio.Event()

    class Watched(EchoProvider):
        async def stream(self, request: ProviderRequest) -> AsyncIterator[StreamEvent]:
            async for event in super().stream(request):
                yield event
                sleeping.set()  # resumed after MessageStart: the next step is the sleep

    agent = Agent(AgentConfig(provider=Watched(), retry=NO_WAIT, tools=BUILTINS))
    task = asyncio.create_task(
        agent.run(Input(context=Context(), prompts=(UserMessage.text("/sleep 30"),)))
    )
    await asyncio.wait_for(sleeping.wait(), HANG_GUARD_SECONDS)
    task.cancel()
    result = await asyncio.wait_for(task, 5)
    assert result.status == "cancelled"
    assert result.final is not None and result.final.stop_reason == "aborted"


async def test_a_summary_never_carries_nul_characters() -> None:
    # PostgreSQL text columns cannot hold NUL; the summary is the one field a provider writes.
    provider = ScriptedProvider(script=["ok"], summaries=["the\x00 gist"])
    result = await agent_for(provider).compact(history(3))
    assert result.context.summary == "the gist"
