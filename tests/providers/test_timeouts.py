"""A provider that stops sending: connect and idle timeouts per profile, named in the failure.

A provider that accepted the request and then sends nothing must not hold a run (and so its
conversation) for the SDK's ten minutes: past the profile's ``idle_timeout`` the attempt is a
retryable failure that says which limit it passed. The servers here never resume on their own,
so each timeout is certain to pass; the tests assert what the failure says, not when it came.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from pydantic import SecretStr

from app.agent.messages import UserMessage
from app.agent.providers._sdk import timeout_error
from app.agent.providers.anthropic import AnthropicProvider
from app.agent.providers.base import Provider, ProviderError, ProviderRequest, Timeouts
from app.agent.providers.openai import OpenAIProvider
from app.config import AgentProfile
from app.service.agents import build_provider
from tests.fakes import anthropic_fake as A
from tests.fakes import openai_fake as O
from tests.helpers import HANG_GUARD_SECONDS

from .test_common import StalledAnthropic, StalledOpenAI

SHORT = Timeouts(connect=5.0, idle=0.3)


async def _fail(provider: Provider) -> ProviderError:
    async def consume() -> None:
        async for _ in provider.stream(
            ProviderRequest(system_prompt="", messages=(UserMessage.text("x"),), model="m")
        ):
            pass

    with pytest.raises(ProviderError) as caught:
        await asyncio.wait_for(consume(), HANG_GUARD_SECONDS)
    return caught.value


@pytest.fixture
async def silent_server() -> AsyncIterator[str]:
    """A server that reads a request and never answers: the base URL to point a provider at."""
    held: list[asyncio.StreamWriter] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        await reader.read(65536)

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        for writer in held:
            writer.close()
        server.close()


@pytest.mark.parametrize("stream", [True, False])
async def test_a_provider_that_never_answers_fails_past_the_idle_timeout(
    silent_server: str, stream: bool
) -> None:
    providers: list[Provider] = [
        OpenAIProvider(
            api_key="sk-x", base_url=silent_server + "/v1", timeouts=SHORT, stream=stream
        ),
        AnthropicProvider(
            api_key="sk-ant-x", base_url=silent_server, timeouts=SHORT, stream=stream
        ),
    ]
    for provider in providers:
        try:
            error = await _fail(provider)
        finally:
            await provider.aclose()
        assert error.kind == "retryable" and error.code == "timeout"
        assert "sent nothing for 0.3 s (idle_timeout)" in error.message, error.message


def test_a_stream_that_stops_midway_fails_past_the_idle_timeout() -> None:
    async def check() -> None:
        with StalledOpenAI() as openai_fake, StalledAnthropic() as anthropic_fake:
            openai_fake.add(O.Reply(text="x" * 50, chunk_size=1))
            anthropic_fake.add(A.Reply([A.Text("x" * 50)], chunk_size=1))
            cases: list[tuple[Provider, O.OpenAIFake | A.AnthropicFake]] = [
                (
                    OpenAIProvider(
                        api_key=openai_fake.api_key, base_url=openai_fake.base_url, timeouts=SHORT
                    ),
                    openai_fake,
                ),
                (
                    AnthropicProvider(
                        api_key=anthropic_fake.api_key,
                        base_url=anthropic_fake.base_url,
                        timeouts=SHORT,
                    ),
                    anthropic_fake,
                ),
            ]
            for provider, fake in cases:
                try:
                    error = await _fail(provider)
                finally:
                    fake.stall.go.set()
                    await provider.aclose()
                assert fake.stall.stalled.is_set()  # it had begun to answer
                assert error.kind == "retryable" and error.code == "timeout"
                assert "(idle_timeout)" in error.message, error.message

    asyncio.run(check())


def test_a_connect_timeout_is_named_as_such() -> None:
    try:
        raise httpx.ConnectTimeout("timed out")
    except httpx.ConnectTimeout as exc:
        wrapped = RuntimeError("Request timed out.")
        wrapped.__cause__ = exc
    for exc_ in (wrapped, httpx.ConnectTimeout("timed out")):
        error = timeout_error("openai", exc_, Timeouts(connect=2.5, idle=60))
        assert error.kind == "retryable" and error.code == "timeout"
        assert (
            error.message == "openai: the provider could not connect within 2.5 s (connect_timeout)"
        )


@pytest.fixture
def free_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def test_a_profile_sets_its_providers_timeouts_and_streaming(free_port: int) -> None:
    for provider in ("openai", "anthropic"):
        profile = AgentProfile(
            provider=provider,
            model="m",
            base_url=f"http://127.0.0.1:{free_port}",
            api_key=SecretStr("sk-x"),
            connect_timeout=3,
            idle_timeout=45,
            stream=False,
        )
        built = build_provider(profile)
        assert isinstance(built, OpenAIProvider | AnthropicProvider)
        assert built.timeouts == Timeouts(connect=3, idle=45)
        assert built.stream_mode is False
    default = AgentProfile(provider="openai", model="m", base_url="http://127.0.0.1:1")
    assert (default.connect_timeout, default.idle_timeout, default.stream) == (10.0, 180.0, True)
