"""OpenAIResponsesProvider's failures, classified for the run loop as the other providers'
are: HTTP errors (overflow, rate limits, server errors, a bad key), a response that failed, an
``error`` event, and broken streams (cut, ended early, malformed, not a stream at all), plus
the profile's timeouts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from pydantic import SecretStr, ValidationError

from app.agent.messages import TextBlock, UserMessage
from app.agent.providers.base import ProviderError, ProviderRequest, Timeouts
from app.agent.providers.openai_responses import OpenAIResponsesProvider
from app.config import AgentProfile
from app.service.agents import MissingProviderKey, build_provider
from tests.fakes._server import RawHTTP
from tests.fakes.gated_http import StallAfter
from tests.fakes.openai_responses_fake import (
    Error,
    RawSSE,
    Reply,
    ResponsesFake,
    Text,
    html_page,
    overflow,
)
from tests.helpers import HANG_GUARD_SECONDS

from ._drive import failure

REQUEST = ProviderRequest(system_prompt="", messages=(UserMessage.text("hi"),), model="gpt-fake")


@pytest.fixture(params=[True, False], ids=["stream", "json"])
async def provider(
    request: pytest.FixtureRequest, responses_fake: ResponsesFake
) -> AsyncIterator[OpenAIResponsesProvider]:
    p = OpenAIResponsesProvider(
        api_key=responses_fake.api_key,
        base_url=responses_fake.base_url,
        timeout=10,
        stream=request.param,
    )
    yield p
    await p.aclose()


@pytest.fixture
async def streaming(responses_fake: ResponsesFake) -> AsyncIterator[OpenAIResponsesProvider]:
    p = OpenAIResponsesProvider(
        api_key=responses_fake.api_key, base_url=responses_fake.base_url, timeout=10
    )
    yield p
    await p.aclose()


async def _error(provider: OpenAIResponsesProvider) -> ProviderError:
    result = await failure(provider, REQUEST)
    assert result.error is not None
    return result.error


# --- HTTP errors ------------------------------------------------------------------------------


async def test_an_input_past_the_window_is_an_overflow(
    provider: OpenAIResponsesProvider, responses_fake: ResponsesFake
) -> None:
    responses_fake.add(overflow())
    error = await _error(provider)
    assert error.kind == "overflow" and error.status == 400
    assert error.code == "context_length_exceeded"


async def test_rate_limits_and_server_errors_are_retryable(
    provider: OpenAIResponsesProvider, responses_fake: ResponsesFake
) -> None:
    responses_fake.add(Error.rate_limit(retry_after="2"), Error.server(500), Error.server(503))
    limited = await _error(provider)
    assert limited.kind == "retryable" and limited.status == 429 and limited.retry_after == 2.0
    for status in (500, 503):
        error = await _error(provider)
        assert error.kind == "retryable" and error.status == status


async def test_a_bad_key_is_fatal_and_never_echoed(responses_fake: ResponsesFake) -> None:
    key = "sk-proj-wrong-key-0123456789"
    p = OpenAIResponsesProvider(api_key=key, base_url=responses_fake.base_url)
    error = await _error(p)
    await p.aclose()
    assert error.kind == "fatal" and error.status == 401
    assert "authentication failed" in error.message
    assert key not in error.message and "6789" not in error.message


# --- failures reported after HTTP 200 ---------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        ("server_error", "retryable"),
        ("rate_limit_exceeded", "retryable"),
        ("invalid_prompt", "fatal"),
        ("context_length_exceeded", "overflow"),
    ],
)
async def test_a_failed_response_is_classified_by_its_code(
    provider: OpenAIResponsesProvider, responses_fake: ResponsesFake, code: str, kind: str
) -> None:
    responses_fake.add(Reply([Text("partial")], failed=(code, f"it failed: {code}")))
    result = await failure(provider, REQUEST)
    assert result.error is not None and result.error.kind == kind
    assert result.error.code == code
    assert f"the response failed: it failed: {code}" in result.error.message
    if provider.stream_mode:  # what streamed before the failure is the partial attempt
        assert result.message.content == (TextBlock(text="partial"),)


async def test_an_error_event_after_content(
    streaming: OpenAIResponsesProvider, responses_fake: ResponsesFake
) -> None:
    responses_fake.add(Reply([Text("so far")], error_event=("server_error", "Upstream died")))
    result = await failure(streaming, REQUEST)
    assert result.error is not None and result.error.kind == "retryable"
    assert "error event: Upstream died" in result.error.message
    assert result.message.content == (TextBlock(text="so far"),)


# --- broken streams ---------------------------------------------------------------------------


async def test_a_cut_stream_is_retryable_and_keeps_the_partial(
    streaming: OpenAIResponsesProvider, responses_fake: ResponsesFake
) -> None:
    responses_fake.add(Reply([Text("abcdefghij")], chunk_size=2, cut_after=6))
    result = await failure(streaming, REQUEST)
    assert result.error is not None and result.error.kind == "retryable"
    assert result.message.content == (TextBlock(text="abcd"),)  # events 4 and 5 were deltas


async def test_a_stream_that_ends_before_its_response_is_retryable(
    streaming: OpenAIResponsesProvider, responses_fake: ResponsesFake
) -> None:
    responses_fake.add(Reply([Text("abcdef")], chunk_size=2, end_after=6))
    result = await failure(streaming, REQUEST)
    assert result.error is not None and result.error.kind == "retryable"
    assert "ended before response.completed" in result.error.message
    assert result.message.content == (TextBlock(text="abcd"),)


async def test_a_malformed_event_is_retryable(
    streaming: OpenAIResponsesProvider, responses_fake: ResponsesFake
) -> None:
    responses_fake.add(Reply([Text("abcdefgh")], chunk_size=2, malformed_at=5))
    error = await _error(streaming)
    assert error.kind == "retryable" and error.code == "malformed_stream"


@pytest.mark.parametrize(
    "events",
    [
        [["not", "an", "object"]],
        [{"no": "type"}],
        [{"type": "response.output_text.delta", "output_index": "first", "delta": "x"}],
        [{"type": "response.output_text.delta", "output_index": 0, "content_index": 0, "delta": 7}],
        [{"type": "response.completed", "response": {"usage": {"input_tokens": "many"}}}],
    ],
    ids=["a-list", "no-type", "index-not-a-number", "delta-not-text", "usage-not-numbers"],
)
async def test_garbage_events_are_malformed_stream_data(
    streaming: OpenAIResponsesProvider, responses_fake: ResponsesFake, events: list[object]
) -> None:
    responses_fake.add(RawSSE(events))
    error = await _error(streaming)
    assert error.kind == "retryable" and error.code == "malformed_stream", error.message


async def test_unknown_events_and_item_types_are_ignored(
    streaming: OpenAIResponsesProvider, responses_fake: ResponsesFake
) -> None:
    responses_fake.add(
        RawSSE(
            [
                {"type": "response.created", "response": {"id": "resp_9", "model": "m"}},
                {"type": "response.future_event", "whatever": [1]},
                {
                    "type": "response.output_item.added",
                    "output_index": 0,
                    "item": {"type": "web_search_call"},
                },
                {
                    "type": "response.output_item.done",
                    "output_index": 0,
                    "item": {"type": "web_search_call"},
                },
                {
                    "type": "response.output_text.delta",
                    "output_index": 1,
                    "content_index": 0,
                    "delta": "ok",
                },
                {"type": "response.completed", "response": {"status": "completed"}},
            ]
        )
    )
    from ._drive import answer

    message = await answer(streaming, REQUEST)
    assert message.content == (TextBlock(text="ok"),) and message.response_id == "resp_9"


async def test_an_html_page_behind_a_200_is_fatal(
    provider: OpenAIResponsesProvider, responses_fake: ResponsesFake
) -> None:
    page = html_page(200, "Sign in to the network")
    responses_fake.add(page)
    error = await _error(provider)
    assert error.kind == "fatal" and error.code == "not_an_event_stream"
    assert "Sign in to the network" in error.message and "<html" not in error.message


async def test_a_json_answer_to_a_stream_request_is_fatal(
    streaming: OpenAIResponsesProvider, responses_fake: ResponsesFake
) -> None:
    responses_fake.add(RawHTTP(200, '{"id": "resp_1", "output": []}', "application/json"))
    error = await _error(streaming)
    assert error.kind == "fatal" and error.code == "not_an_event_stream"
    assert "stream = false" in error.message


async def test_a_json_answer_of_the_wrong_shape_is_malformed(responses_fake: ResponsesFake) -> None:
    p = OpenAIResponsesProvider(
        api_key=responses_fake.api_key, base_url=responses_fake.base_url, stream=False
    )
    responses_fake.add(
        RawHTTP(200, '{"id": "resp_1", "output": "nothing"}', "application/json"),
        RawHTTP(200, '{"id": "resp_1", "output": [', "application/json"),
    )
    for _ in range(2):
        error = await _error(p)
        assert error.kind == "retryable" and error.code == "malformed_stream", error.message
    await p.aclose()


# --- timeouts ---------------------------------------------------------------------------------


class StalledResponses(StallAfter, ResponsesFake):
    pass


def test_a_stream_that_stops_midway_fails_past_the_idle_timeout() -> None:
    async def check() -> None:
        with StalledResponses() as fake:
            fake.add(Reply([Text("x" * 50)], chunk_size=1))
            p = OpenAIResponsesProvider(
                api_key=fake.api_key, base_url=fake.base_url, timeouts=Timeouts(5.0, 0.3)
            )
            try:
                error = await asyncio.wait_for(_error(p), HANG_GUARD_SECONDS)
            finally:
                fake.stall.go.set()
                await p.aclose()
            assert fake.stall.stalled.is_set()
            assert error.kind == "retryable" and error.code == "timeout"
            assert "sent nothing for 0.3 s (idle_timeout)" in error.message

    asyncio.run(check())


def test_a_profile_sets_its_timeouts_streaming_and_key() -> None:
    profile = AgentProfile(
        provider="openai-responses",
        model="m",
        base_url="http://127.0.0.1:9/v1",
        api_key=SecretStr("sk-x"),
        connect_timeout=3,
        idle_timeout=45,
        stream=False,
    )
    built = build_provider(profile)
    assert isinstance(built, OpenAIResponsesProvider) and built.name == "openai-responses"
    assert built.timeouts == Timeouts(connect=3, idle=45) and built.stream_mode is False
    # a compatible server named by base_url may take no key, as for Chat Completions
    keyless = AgentProfile(provider="openai-responses", model="m", base_url="http://127.0.0.1:9")
    assert isinstance(build_provider(keyless), OpenAIResponsesProvider)
    # OpenAI's own API needs OPENAI_API_KEY; every profile names its model
    with pytest.raises(MissingProviderKey, match="OPENAI_API_KEY"):
        build_provider(AgentProfile(provider="openai-responses", model="m"))
    with pytest.raises(ValidationError, match="a model is required"):
        AgentProfile(provider="openai-responses")


async def test_a_refusal_sent_whole_in_its_part_still_stops_as_a_refusal(
    streaming: OpenAIResponsesProvider, responses_fake: ResponsesFake
) -> None:
    where = {"output_index": 0, "content_index": 0}
    responses_fake.add(
        RawSSE(
            [
                {
                    "type": "response.output_item.added",
                    "output_index": 0,
                    "item": {"type": "message"},
                },
                {
                    "type": "response.content_part.added",
                    **where,
                    "part": {"type": "refusal", "refusal": "No."},
                },
                {"type": "response.completed", "response": {"status": "completed"}},
            ]
        )
    )
    from ._drive import answer

    message = await answer(streaming, REQUEST)
    assert message.content == (TextBlock(text="No."),) and message.stop_reason == "refusal"
