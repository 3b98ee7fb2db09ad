"""Hostile provider streams inside the agent's run loop (issue 11, points 4 and 6).

A stream fault is an attempt failure like any other: the admitted prompt stays in the returned
context, every attempt that streamed something is in ``new_messages`` (retried or not), the
run's error names the fault, and the next run on the returned context works.
"""

from __future__ import annotations

from typing import Any

import pytest

from app.agent import Agent, AgentConfig, Context, Input, UserMessage
from app.agent.messages import AssistantMessage, TextBlock
from app.agent.providers.anthropic import AnthropicProvider
from app.agent.providers.base import Provider
from app.agent.providers.openai import OpenAIProvider
from app.agent.records import Result
from app.agent.retry import RetryPolicy
from tests.fakes import anthropic_fake as A
from tests.fakes import openai_fake as O

NO_WAIT = RetryPolicy(max_retries=2, base_delay=0.0, max_delay=0.0, jitter=0.0)


class Side:
    """One provider and its fake, with the scripted answers a test needs."""

    def __init__(self, name: str, openai_fake: O.OpenAIFake, anthropic_fake: A.AnthropicFake):
        self.name = name
        self.fake: Any = openai_fake if name == "openai" else anthropic_fake
        self.provider: Provider
        if name == "openai":
            self.provider = OpenAIProvider(
                api_key=openai_fake.api_key, base_url=openai_fake.base_url, model="m", timeout=10
            )
        else:
            self.provider = AnthropicProvider(
                api_key=anthropic_fake.api_key,
                base_url=anthropic_fake.base_url,
                model="m",
                max_tokens=1024,
                timeout=10,
            )

    def reply(self, text: str, **shape: Any) -> Any:
        if self.name == "openai":
            return O.Reply(text=text, chunk_size=4, **shape)
        return A.Reply([A.Text(text)], chunk_size=4, **shape)

    def malformed_after_text(self, text: str = "partial answer") -> Any:
        """A reply whose third text fragment is cut JSON (two fragments arrived before)."""
        first_text_event = 1 if self.name == "openai" else 3
        return self.reply(text, malformed_at=first_text_event + 2)

    def malformed_first(self) -> Any:
        return self.reply("never seen", malformed_at=0)

    @property
    def requests(self) -> int:
        return len(self.fake.requests)


@pytest.fixture(params=["openai", "anthropic"])
async def side(
    request: pytest.FixtureRequest, openai_fake: O.OpenAIFake, anthropic_fake: A.AnthropicFake
) -> Any:
    s = Side(request.param, openai_fake, anthropic_fake)
    yield s
    await s.provider.aclose()


async def run(side: Side, context: Context, prompt: str) -> Result:
    agent = Agent(AgentConfig(provider=side.provider, model="m", retry=NO_WAIT))
    return await agent.run(Input(context=context, prompts=(UserMessage.text(prompt),)))


def texts(result: Result) -> list[str]:
    out = []
    for m in result.new_messages:
        out.append(m.type + ":" + "".join(b.text for b in m.content if isinstance(b, TextBlock)))
    return out


async def test_malformed_chunks_every_time_fail_the_run_with_every_attempt_recorded(
    side: Side,
) -> None:
    side.fake.default = side.malformed_after_text()
    result = await run(side, Context(), "Hello?")

    assert result.status == "failed" and result.admitted
    assert result.error is not None
    assert (result.error.kind, result.error.code) == ("retryable", "malformed_stream")
    assert result.error.message.endswith("(after 2 retries)")
    assert side.requests == 3
    # the prompt, then the three attempts, each with what arrived before the cut JSON
    assert texts(result) == ["user:Hello?"] + ["assistant:partial "] * 3
    for attempt in result.new_messages[1:]:
        assert isinstance(attempt, AssistantMessage) and attempt.stop_reason == "error"
        assert attempt.error is not None and attempt.error.code == "malformed_stream"
    assert result.final is result.new_messages[-1]
    # keep: the admitted prompt continues the conversation, the failed attempts do not
    assert [m.type for m in result.context.messages] == ["user"]

    side.fake.default = None
    side.fake.add(side.reply("Both answered."))
    after = await run(side, result.context, "Still there?")
    assert after.status == "completed", after.error
    assert texts(after) == ["user:Still there?", "assistant:Both answered."]
    assert [m.type for m in after.context.messages] == ["user", "user", "assistant"]


async def test_a_malformed_chunk_once_is_a_recorded_attempt_then_the_retry_answers(
    side: Side,
) -> None:
    side.fake.add(side.malformed_after_text(), side.reply("The answer."))
    result = await run(side, Context(), "Hello?")
    assert result.status == "completed", result.error
    assert texts(result) == ["user:Hello?", "assistant:partial ", "assistant:The answer."]
    assert [m.type for m in result.context.messages] == ["user", "assistant"]


async def test_a_malformed_first_chunk_is_retried_invisibly(side: Side) -> None:
    side.fake.add(side.malformed_first(), side.reply("The answer."))
    result = await run(side, Context(), "Hello?")
    assert result.status == "completed", result.error
    assert side.requests == 2
    assert texts(result) == ["user:Hello?", "assistant:The answer."]


async def test_an_html_200_fails_at_once_and_keeps_the_prompt(side: Side) -> None:
    side.fake.add(O.html_page(200, "Captive portal"))
    result = await run(side, Context(), "Hello?")
    assert result.status == "failed" and result.error is not None
    assert (result.error.kind, result.error.code) == ("fatal", "not_an_event_stream")
    assert side.requests == 1
    assert [m.type for m in result.new_messages] == ["user", "assistant"]
    assert [m.type for m in result.context.messages] == ["user"]


async def test_anthropic_out_of_order_events_fail_at_once(
    anthropic_fake: A.AnthropicFake, openai_fake: O.OpenAIFake
) -> None:
    side = Side("anthropic", openai_fake, anthropic_fake)
    anthropic_fake.add(
        A.RawSSE(
            [
                ("message_start", {"type": "message_start", "message": {"id": "msg_1"}}),
                (
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": 0,
                        "delta": {"type": "text_delta", "text": "orphan"},
                    },
                ),
            ]
        )
    )
    try:
        result = await run(side, Context(), "Hello?")
    finally:
        await side.provider.aclose()
    assert result.status == "failed" and result.error is not None
    assert (result.error.kind, result.error.code) == ("fatal", "protocol_error")
    assert side.requests == 1
    assert [m.type for m in result.new_messages] == ["user", "assistant"]


async def test_a_stream_cut_after_text_is_retried_and_every_cut_attempt_recorded(
    side: Side,
) -> None:
    """Point 6: retries continue after content streamed (docs/decisions.md); each cut attempt
    is a run record with what arrived."""
    side.fake.default = side.reply("a long answer that is cut", cut_after=5)
    result = await run(side, Context(), "Hello?")
    assert result.status == "failed" and result.error is not None
    assert result.error.kind == "retryable"
    assert result.error.message.endswith("(after 2 retries)")
    assert side.requests == 3
    attempts = result.new_messages[1:]
    assert len(attempts) == 3
    for attempt in attempts:
        assert isinstance(attempt, AssistantMessage) and attempt.stop_reason == "error"
        assert attempt.content and not attempt.replayable
