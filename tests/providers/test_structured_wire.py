"""Structured outputs and per-run settings on the wire, against the strict fakes: what each
provider is sent (Chat Completions ``response_format``, Anthropic ``output_config.format``,
the run's model, temperature and token limit), an answer corrected after its violation is sent
back, one that never validates, and stops that are not retried."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from app.agent import Agent, AgentConfig, Context, Input, UserMessage
from app.agent.messages import text_of
from app.agent.providers.anthropic import AnthropicProvider
from app.agent.providers.openai import OpenAIProvider
from app.agent.records import Result, RunSettings
from app.agent.retry import RetryPolicy
from app.agent.structured import OutputSchema, parsed_output
from tests.fakes import anthropic_fake as A
from tests.fakes import openai_fake as O

NO_WAIT = RetryPolicy(max_retries=0, base_delay=0.0, max_delay=0.0, jitter=0.0)
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
TYPED = RunSettings(
    model="run-model",
    temperature=0.25,
    max_output_tokens=300,
    output_schema=OutputSchema("trip", SCHEMA, True),
)
GOOD = '{"city": "Oslo", "days": 3}'
BAD = '{"city": "Oslo", "days": 0}'


async def run(agent: Agent, settings: RunSettings = TYPED) -> Result:
    return await agent.run(
        Input(context=Context(), prompts=(UserMessage.text("plan a trip"),), settings=settings)
    )


@pytest.fixture
async def openai_agent(openai_fake: O.OpenAIFake) -> AsyncIterator[Agent]:
    provider = OpenAIProvider(
        api_key=openai_fake.api_key, base_url=openai_fake.base_url, model="gpt-fake", timeout=10
    )
    yield Agent(AgentConfig(provider=provider, model="gpt-fake", retry=NO_WAIT))
    await provider.aclose()


@pytest.fixture
async def anthropic_agent(anthropic_fake: A.AnthropicFake) -> AsyncIterator[Agent]:
    provider = AnthropicProvider(
        api_key=anthropic_fake.api_key,
        base_url=anthropic_fake.base_url,
        model="claude-fake",
        max_tokens=1024,
        timeout=10,
    )
    yield Agent(AgentConfig(provider=provider, model="claude-fake", retry=NO_WAIT))
    await provider.aclose()


def _corrected(result: Result) -> None:
    assert result.status == "completed", result.error
    assert result.final is not None
    assert parsed_output(SCHEMA, result.final) == {"city": "Oslo", "days": 3}
    kinds = [m.type for m in result.new_messages]
    assert kinds == ["user", "assistant", "user", "assistant"]
    correction = text_of(result.new_messages[2])
    assert "at $.days: 0 is less than the minimum of 1" in correction


async def test_openai_is_sent_response_format_and_the_run_settings(
    openai_fake: O.OpenAIFake, openai_agent: Agent
) -> None:
    openai_fake.add(O.Reply(text=BAD), O.Reply(text=GOOD))
    result = await run(openai_agent)
    _corrected(result)
    first, second = (r.json for r in openai_fake.chat_requests)
    for body in (first, second):
        assert body["response_format"] == {
            "type": "json_schema",
            "json_schema": {"name": "trip", "schema": SCHEMA, "strict": True},
        }
        assert body["model"] == "run-model"
        assert body["temperature"] == 0.25
        assert body["max_tokens"] == 300  # a compatible server's field (base_url given)
    # the retry replays the invalid answer and the violation, as any history
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]
    assert second["messages"][1]["content"] == BAD


async def test_openai_an_answer_that_never_validates_fails_the_run(
    openai_fake: O.OpenAIFake, openai_agent: Agent
) -> None:
    openai_fake.add(O.Reply(text=BAD), O.Reply(text="not json"))
    result = await run(openai_agent)
    assert result.status == "failed"
    assert result.error is not None and result.error.code == "output_invalid"
    assert "the answer is not JSON" in result.error.message
    assert len(openai_fake.chat_requests) == 2  # output_retries = 1


async def test_openai_a_length_stop_is_not_retried(
    openai_fake: O.OpenAIFake, openai_agent: Agent
) -> None:
    openai_fake.add(O.Reply(text='{"city": "Os', finish_reason="length"))
    result = await run(openai_agent)
    assert result.status == "failed"
    assert result.error is not None and "cut at its token limit" in result.error.message
    assert len(openai_fake.chat_requests) == 1


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
async def test_openai_a_refusal_is_not_retried(openai_fake: O.OpenAIFake, stream: bool) -> None:
    provider = OpenAIProvider(
        api_key=openai_fake.api_key,
        base_url=openai_fake.base_url,
        model="gpt-fake",
        timeout=10,
        stream=stream,
    )
    agent = Agent(AgentConfig(provider=provider, model="gpt-fake", retry=NO_WAIT))
    openai_fake.add(O.Reply(refusal="I can't help with that."))
    try:
        result = await run(agent)
    finally:
        await provider.aclose()
    assert result.status == "failed"
    assert result.final is not None and result.final.stop_reason == "refusal"
    assert text_of(result.final) == "I can't help with that."
    assert result.error is not None and "the model refused" in result.error.message
    assert len(openai_fake.chat_requests) == 1


async def test_a_run_without_settings_sends_none_of_them(
    openai_fake: O.OpenAIFake, openai_agent: Agent
) -> None:
    openai_fake.add(O.Reply(text="plain"))
    result = await run(openai_agent, RunSettings())
    assert result.status == "completed"
    body = openai_fake.chat_requests[0].json
    assert body["model"] == "gpt-fake"
    assert not {"response_format", "temperature", "max_tokens"} & set(body)


async def test_anthropic_is_sent_output_config_and_the_run_settings(
    anthropic_fake: A.AnthropicFake, anthropic_agent: Agent
) -> None:
    anthropic_fake.add(A.Reply([A.Text(BAD)]), A.Reply([A.Text(GOOD)]))
    result = await run(anthropic_agent)
    _corrected(result)
    first, second = (r.json for r in anthropic_fake.message_requests)
    for body in (first, second):
        assert body["output_config"] == {"format": {"type": "json_schema", "schema": SCHEMA}}
        assert body["model"] == "run-model"
        assert body["temperature"] == 0.25
        assert body["max_tokens"] == 300
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]


async def test_anthropic_a_refusal_is_not_retried(
    anthropic_fake: A.AnthropicFake, anthropic_agent: Agent
) -> None:
    anthropic_fake.add(A.Reply([A.Text("I can't help with that.")], stop_reason="refusal"))
    result = await run(anthropic_agent)
    assert result.status == "failed"
    assert result.error is not None and result.error.code == "output_invalid"
    assert "the model refused" in result.error.message
    assert len(anthropic_fake.message_requests) == 1
