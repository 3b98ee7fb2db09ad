"""Client tools through the real providers (issue 12): their definitions go out in each wire
format with the server tools, and a pause → results → answer loop replays through the fakes,
which validate call/result pairing (and, for Anthropic, thinking kept before the tool use)."""

from __future__ import annotations

from app.agent import (
    Agent,
    AgentConfig,
    Approval,
    ClientTool,
    Context,
    Input,
    Result,
    TextBlock,
    ToolResultMessage,
    UserMessage,
)
from app.agent.codec import dumps_context, loads_context
from app.agent.providers.anthropic import AnthropicProvider
from app.agent.providers.openai import OpenAIProvider
from app.agent.replay import validate_context, validate_storable
from app.agent.retry import RetryPolicy
from app.agent.tools import ToolRegistry
from tests.fakes import anthropic_fake as A
from tests.fakes import openai_fake as O

NO_WAIT = RetryPolicy(max_retries=3, base_delay=0.0, max_delay=0.0, jitter=0.0)
TOOLS = ToolRegistry.from_paths(["app.agent.builtin_tools:wait"])
LOOKUP = ClientTool(
    name="lookup",
    description="Look a word up.",
    parameters={"type": "object", "properties": {"word": {"type": "string"}}},
)


def stored(result: Result) -> Context:
    validate_storable(result.context)
    return loads_context(dumps_context(result.context))


def looked_up(call_id: str) -> ToolResultMessage:
    return ToolResultMessage(
        tool_call_id=call_id, tool_name="lookup", content=(TextBlock(text="a carrying-over"),)
    )


async def pause_and_resume(agent: Agent) -> tuple[Result, Result]:
    paused = await agent.run(
        Input(
            context=Context(system_prompt="Be brief."),
            prompts=(UserMessage.text("define carryover"),),
            client_tools=(LOOKUP,),
            require_approval=("wait",),
        )
    )
    assert paused.status == "requires_action", paused.error
    assert paused.required_action is not None
    calls = {c.kind: c for c in paused.required_action.tool_calls}
    answered = await agent.run(
        Input(
            context=stored(paused),
            tool_results=(looked_up(calls["client"].id),),
            approvals=(Approval(tool_call_id=calls["approval"].id, approve=False, reason="no"),),
        )
    )
    assert answered.status == "completed", answered.error
    validate_context(answered.context)
    return paused, answered


async def test_openai_client_tools_go_out_as_functions_and_the_loop_resumes(
    openai_fake: O.OpenAIFake,
) -> None:
    raw = '{"word":  "carryover"}'
    openai_fake.add(
        O.Reply(
            tool_calls=[
                O.ToolCall("lookup", raw, id="call_l1"),
                O.ToolCall("wait", '{"seconds": 0}', id="call_w1"),
            ]
        ),
        O.Reply(text="It means a carrying-over."),
    )
    provider = OpenAIProvider(
        api_key=openai_fake.api_key, base_url=openai_fake.base_url, model="gpt-fake", timeout=10
    )
    agent = Agent(AgentConfig(provider=provider, model="gpt-fake", tools=TOOLS, retry=NO_WAIT))
    try:
        paused, answered = await pause_and_resume(agent)
    finally:
        await provider.aclose()

    assert paused.required_action is not None
    assert paused.required_action.tool_calls[0].arguments == raw
    first, second = openai_fake.chat_requests
    tools = first.json["tools"]
    assert [t["function"]["name"] for t in tools] == ["wait", "lookup"]
    assert tools[1] == {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up.",
            "parameters": LOOKUP.parameters,
        },
    }
    sent = second.json["messages"]
    assert [m["role"] for m in sent][-3:] == ["assistant", "tool", "tool"]
    assert [m["tool_call_id"] for m in sent[-2:]] == ["call_l1", "call_w1"]
    assert answered.final is not None
    assert answered.final.content == (TextBlock(text="It means a carrying-over."),)


async def test_anthropic_client_tools_go_out_with_input_schema_and_thinking_is_kept(
    anthropic_fake: A.AnthropicFake,
) -> None:
    anthropic_fake.add(
        A.Reply(
            [
                A.Thinking("I need the dictionary."),
                A.ToolUse("lookup", {"word": "carryover"}, id="toolu_l1"),
                A.ToolUse("wait", {"seconds": 0}, id="toolu_w1"),
            ]
        ),
        A.Reply([A.Thinking(""), A.Text("It means a carrying-over.")]),
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
        _, answered = await pause_and_resume(agent)
    finally:
        await provider.aclose()

    first, second = anthropic_fake.message_requests
    tools = first.json["tools"]
    assert [t["name"] for t in tools] == ["wait", "lookup"]
    assert tools[1] == {
        "name": "lookup",
        "description": "Look a word up.",
        "input_schema": LOOKUP.parameters,
    }
    replayed = second.json["messages"]
    assert [b["type"] for b in replayed[1]["content"]] == ["thinking", "tool_use", "tool_use"]
    results = replayed[2]["content"]
    assert [(b["type"], b["tool_use_id"]) for b in results] == [
        ("tool_result", "toolu_l1"),
        ("tool_result", "toolu_w1"),
    ]
    assert anthropic_fake.rejections == []
    assert answered.final is not None
