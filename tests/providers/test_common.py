"""Shared helpers of the HTTP providers, and behaviour both providers must have."""

from __future__ import annotations

import asyncio
import time
from email.utils import formatdate

import pytest

from app.agent.messages import UserMessage
from app.agent.providers._http import classify_status, parse_retry_after, scrub
from app.agent.providers.anthropic import AnthropicProvider
from app.agent.providers.base import Provider, ProviderRequest
from app.agent.providers.openai import OpenAIProvider
from tests.fakes import anthropic_fake as A
from tests.fakes import openai_fake as O
from tests.fakes.gated_http import Stall, StallAfter
from tests.helpers import HANG_GUARD_SECONDS


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "3"}, 3.0),
        ({"Retry-After": "0.5"}, 0.5),
        ({"retry-after-ms": "1200"}, 1.2),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
        ({"retry-after-ms": "junk", "retry-after": "9"}, 9.0),
        ({"retry-after": "-1"}, None),
        ({"retry-after": "soon"}, None),
        ({}, None),
    ],
)
def test_parse_retry_after(headers: dict[str, str], expected: float | None) -> None:
    assert parse_retry_after(headers) == expected


def test_parse_retry_after_http_date() -> None:
    now = time.time()
    assert parse_retry_after(
        {"retry-after": formatdate(now + 30, usegmt=True)}, now=now
    ) == pytest.approx(30, abs=1)
    assert parse_retry_after({"retry-after": formatdate(now - 30, usegmt=True)}, now=now) == 0


def test_scrub() -> None:
    key = "sk-proj-AbCdEf0123456789"
    text = f"bad key {key}; also Incorrect API key provided: sk-pro******6789."
    out = scrub(text, key)
    assert key not in out and "sk-pro" not in out and "6789" not in out
    assert out.startswith("bad key [redacted]")


@pytest.mark.parametrize(
    ("status", "code", "kind"),
    [
        (400, "context_length_exceeded", "overflow"),
        (400, None, "fatal"),
        (401, None, "fatal"),
        (403, None, "fatal"),
        (404, None, "fatal"),
        (408, None, "retryable"),
        (409, None, "retryable"),
        (429, "rate_limit_exceeded", "retryable"),
        (429, "insufficient_quota", "fatal"),
        (500, None, "retryable"),
        (529, None, "retryable"),
    ],
)
def test_classify_status(status: int, code: str | None, kind: str) -> None:
    assert classify_status(status, code=code, error_type=None, message="x") == kind


def test_overflow_wordings() -> None:
    for message in (
        "prompt is too long: 208310 tokens > 200000 maximum",
        "input length and `max_tokens` exceed context limit: 188240 + 21333 > 200000",
        "This model's maximum context length is 4096 tokens.",
        "the request exceeds the available context size, try increasing it",
    ):
        assert classify_status(400, code=None, error_type=None, message=message) == "overflow"


class StalledOpenAI(StallAfter, O.OpenAIFake):
    pass


class StalledAnthropic(StallAfter, A.AnthropicFake):
    pass


async def _cancel_midway(provider: Provider, stall: Stall) -> bool:
    """Start a stream that stalls after its first events and cancel it there; whether the
    server still held the stream open when the cancel was done."""
    got_one = asyncio.Event()

    async def consume() -> None:
        async for _ in provider.stream(
            ProviderRequest(system_prompt="", messages=(UserMessage.text("x"),), model="m")
        ):
            got_one.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(got_one.wait(), HANG_GUARD_SECONDS)
    await asyncio.to_thread(stall.stalled.wait, HANG_GUARD_SECONDS)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, HANG_GUARD_SECONDS)
    still_open = not stall.ended.is_set()
    stall.go.set()
    return still_open


async def test_cancelling_a_stream_is_prompt() -> None:
    """Cancelling does not wait for the rest of the answer: it ends while the server still
    holds the stream open mid-answer."""
    with StalledOpenAI() as openai_fake, StalledAnthropic() as anthropic_fake:
        openai_fake.add(O.Reply(text="x" * 50, chunk_size=1))
        anthropic_fake.add(A.Reply([A.Text("x" * 50)], chunk_size=1))
        stalls = [openai_fake.stall, anthropic_fake.stall]
        providers: list[Provider] = [
            OpenAIProvider(api_key=openai_fake.api_key, base_url=openai_fake.base_url, model="m"),
            AnthropicProvider(
                api_key=anthropic_fake.api_key, base_url=anthropic_fake.base_url, model="m"
            ),
        ]
        for provider, stall in zip(providers, stalls, strict=True):
            try:
                assert await _cancel_midway(provider, stall)
            finally:
                await provider.aclose()


async def test_breaking_out_of_a_stream_closes_it() -> None:
    with StalledOpenAI() as openai_fake:
        openai_fake.add(O.Reply(text="y" * 30, chunk_size=1), O.Reply(text="next"))
        provider = OpenAIProvider(
            api_key=openai_fake.api_key, base_url=openai_fake.base_url, model="m"
        )
        try:
            request = ProviderRequest(
                system_prompt="", messages=(UserMessage.text("x"),), model="m"
            )
            stream = provider.stream(request)
            async for _ in stream:
                break
            await stream.aclose()  # type: ignore[attr-defined]
            assert not openai_fake.stall.ended.is_set()  # closed while the answer was held
            openai_fake.stall.go.set()
            # the client is still usable afterwards
            events = [e async for e in provider.stream(request)]
            assert events
        finally:
            await provider.aclose()
