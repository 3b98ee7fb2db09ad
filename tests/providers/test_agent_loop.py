"""The real providers inside the agent's run loop, against the fakes (retries, tool batches,
failed attempts, and a context stored as JSON and replayed in the next run)."""

from __future__ import annotations

from app.agent import Agent, AgentConfig, Context, Input, UserMessage
from app.agent.codec import dumps_context, loads_context
from app.agent.messages import AssistantMessage, TextBlock, ThinkingBlock, ToolResultMessage
from app.agent.providers.anthropic import AnthropicProvider
from app.agent.providers.openai import OpenAIProvider
from app.agent.records import Result
from app.agent.replay import validate_context
from app.agent.retry import RetryPolicy
from app.agent.tools import ToolRegistry
from tests.fakes import anthropic_fake as A
from tests.fakes import openai_fake as O

NO_WAIT = RetryPolicy(max_retries=3, base_delay=0.0, max_delay=0.0, jitter=0.0)
TOOLS = ToolRegistry.from_paths(["app.agent.builtin_tools:wait"])


async def run(agent: Agent, context: Context, prompt: str) -> tuple[Context, Result]:
    result = await agent.run(Input(context=context, prompts=(UserMessage.text(prompt),)))
    assert result.status == "completed", result.error
    validate_context(result.context)
    # what the store does: JSON out, JSON in; the next run must replay it as is
    return loads_context(dumps_context(result.context)), result


async def test_anthropic_thinking_tool_loop_with_overload_retry(
    anthropic_fake: A.AnthropicFake,
) -> None:
    anthropic_fake.add(
        A.Error.overloaded(),
        A.Reply(
            [
                A.Thinking("I will wait."),
                A.Redacted(),
                A.ToolUse("wait", {"seconds": 0}, id="toolu_w1"),
            ]
        ),
        A.Reply([A.Thinking(""), A.Text("Waited.")]),
        A.Reply([A.Text("Still here.")], error_event=("overloaded_error", "Overloaded")),
        A.Reply([A.Text("Still here.")]),
    )
    provider = AnthropicProvider(
        api_key=anthropic_fake.api_key,
        base_url=anthropic_fake.base_url,
        model="claude-fake",
        max_tokens=4096,
        thinking_budget=1024,
        timeout=10,
    )
    agent = Agent(AgentConfig(provider=provider, model="claude-fake", tools=TOOLS, retry=NO_WAIT))
    try:
        context, _ = await run(agent, Context(system_prompt="Be brief."), "wait a moment")
        kinds = [m.type for m in context.messages]
        assert kinds == ["user", "assistant", "tool_result", "assistant"]
        first = context.messages[1]
        assert isinstance(first, AssistantMessage)
        assert [b.type for b in first.content] == ["thinking", "redacted_thinking", "tool_call"]
        last = context.messages[3]
        assert isinstance(last, AssistantMessage)
        assert last.content == (
            ThinkingBlock(thinking="", signature=A.sign("")),
            TextBlock(text="Waited."),
        )

        context, _ = await run(agent, context, "still there?")
        assert [m.type for m in context.messages][-2:] == ["user", "assistant"]
    finally:
        await provider.aclose()
    # 1 overloaded + 2 for the tool loop + 1 error event + 1 retry; the fake validated every
    # replay of the thinking blocks, signatures and tool input
    assert len(anthropic_fake.message_requests) == 5
    assert anthropic_fake.rejections == []  # no request was refused by the validator


async def test_openai_tool_loop_with_cut_stream(openai_fake: O.OpenAIFake) -> None:
    args = '{"seconds":  0 }'
    openai_fake.add(
        O.Reply(text="I will wa", cut_after=3, chunk_size=3),
        O.Reply(tool_calls=[O.ToolCall("wait", args, id="call_w1")]),
        O.Error.rate_limit(retry_after="0"),
        O.Reply(text="Waited."),
    )
    provider = OpenAIProvider(
        api_key=openai_fake.api_key, base_url=openai_fake.base_url, model="gpt-fake", timeout=10
    )
    agent = Agent(AgentConfig(provider=provider, model="gpt-fake", tools=TOOLS, retry=NO_WAIT))
    try:
        context, result = await run(agent, Context(), "wait a moment")
    finally:
        await provider.aclose()
    assert [m.type for m in context.messages] == ["user", "assistant", "tool_result", "assistant"]
    call = context.messages[1]
    assert isinstance(call, AssistantMessage) and call.tool_calls[0].arguments == args
    tool_result = context.messages[2]
    assert isinstance(tool_result, ToolResultMessage) and not tool_result.is_error
    # the cut attempt is a run record, never part of the context
    attempts = [m for m in result.new_messages if isinstance(m, AssistantMessage)]
    assert attempts[0].stop_reason == "error" and attempts[0].error is not None
    assert attempts[0].content == (TextBlock(text="I will"),)  # 3 events: role, "I w", "ill"
    sent = openai_fake.chat_requests[-1].json["messages"]
    assert sent[1]["tool_calls"][0]["function"]["arguments"] == args
