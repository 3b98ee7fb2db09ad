"""A provider's requests after its first are sent with the request the SDK built for its path.

What must not change: what the provider sends (every header, the body), what it reads, and
every failure as the agent sees it (kind, code, status, retry_after, message). Each fault is
therefore met twice: by a fresh provider, whose request the SDK builds and sends itself, and by
a provider whose first request went out already, so that this one is sent prepared; the two
errors must be equal. And the SDK builds no request of its own for a prepared one (counted).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx2
import pytest

from app.agent.messages import UserMessage, text_of
from app.agent.providers._transport import AiohttpTransport, Prepared
from app.agent.providers.anthropic import AnthropicProvider
from app.agent.providers.base import Provider, ProviderError, ProviderRequest
from app.agent.providers.openai import OpenAIProvider
from app.agent.providers.openai_responses import OpenAIResponsesProvider
from tests.fakes import anthropic_fake as A
from tests.fakes import openai_fake as O
from tests.fakes import openai_responses_fake as R
from tests.fakes._server import FakeServer, RawHTTP, html_page

from ._drive import answer, failure

Make = Callable[[], Provider]


def _request() -> ProviderRequest:
    return ProviderRequest(
        system_prompt="be brief", messages=(UserMessage.text("hi"),), model="m-fake"
    )


def _openai(fake: O.OpenAIFake, stream: bool) -> Make:
    return lambda: OpenAIProvider(
        api_key=fake.api_key, base_url=fake.base_url, model="m-fake", timeout=10, stream=stream
    )


def _anthropic(fake: A.AnthropicFake, stream: bool) -> Make:
    return lambda: AnthropicProvider(
        api_key=fake.api_key, base_url=fake.base_url, model="m-fake", timeout=10, stream=stream
    )


def _responses(fake: R.ResponsesFake, stream: bool) -> Make:
    return lambda: OpenAIResponsesProvider(
        api_key=fake.api_key, base_url=fake.base_url, model="m-fake", timeout=10, stream=stream
    )


# each provider: its fake, how to make it, a good answer, the faults met as an error status or
# a failed answer, and those of a stream only (the fake's own shapes)
CASES: dict[str, Any] = {
    "openai": (
        O.OpenAIFake,
        _openai,
        lambda: O.Reply(text="fine"),
        lambda: [
            O.Error.rate_limit(retry_after="2"),
            O.Error.overflow(),
            O.Error.server(503),
            O.Error.not_found(),
        ],
        lambda: [
            O.Reply(text="cut short", cut_after=2),
            O.Reply(text="garbled", malformed_at=2),
        ],
    ),
    "anthropic": (
        A.AnthropicFake,
        _anthropic,
        lambda: A.Reply(blocks=[A.Text("fine")]),
        lambda: [
            A.Error.rate_limit(retry_after="3"),
            A.Error.overflow(),
            A.Error.overloaded(),
        ],
        lambda: [
            A.Reply(blocks=[A.Text("cut short")], cut_after=3),
            A.Reply(blocks=[A.Text("garbled")], malformed_at=3),
            A.Reply(blocks=[A.Text("x")], error_event=("overloaded_error", "Overloaded")),
        ],
    ),
    "openai-responses": (
        R.ResponsesFake,
        _responses,
        lambda: R.Reply(items=[R.Text("fine")]),
        lambda: [
            R.overflow(),
            R.Reply(failed=("server_error", "The model failed")),
        ],
        lambda: [
            R.Reply(items=[R.Text("cut short")], cut_after=2),
            R.Reply(items=[R.Text("garbled")], malformed_at=2),
        ],
    ),
}
COMMON_FAULTS = [
    lambda: html_page(502),
    lambda: html_page(200, "Sign in"),
    lambda: RawHTTP(401, '{"error": {"message": "bad key sk-abc***wxyz"}}', "application/json"),
    lambda: RawHTTP(200, "not json at all", "text/plain"),
]
MODES = [(name, stream) for name in CASES for stream in (True, False)]


def _describe(error: ProviderError | None) -> tuple[Any, ...]:
    """What the agent sees of a failure; in the message, numbers (the fake numbers its
    answers: an id's length moves a column that a JSON error names) are left out."""
    assert error is not None
    return (
        error.kind,
        error.code,
        error.status,
        error.retry_after,
        re.sub(r"\d+", "#", error.message),
    )


@pytest.fixture
async def made() -> AsyncIterator[list[Provider]]:
    providers: list[Provider] = []
    yield providers
    for provider in providers:
        await provider.aclose()  # type: ignore[attr-defined]


def _fake(name: str) -> Any:
    fake: FakeServer = CASES[name][0]()
    return fake  # started and stopped by ``with``


async def _warm(fake: Any, make: Make, good: Any, made: list[Provider]) -> Provider:
    """A provider whose first request went out: its next is sent prepared."""
    provider = make()
    made.append(provider)
    fake.add(good())
    await answer(provider, _request())
    assert _post_of(provider).prepared
    assert _transport_of(provider).last_post is None  # no request (nor its body) held on to
    return provider


def _transport_of(provider: Provider) -> AiohttpTransport:
    client = provider._client if isinstance(provider, AnthropicProvider) else provider._sdk.client  # type: ignore[attr-defined]
    transport = client._client._transport
    assert isinstance(transport, AiohttpTransport)
    return transport


def _post_of(provider: Provider) -> Any:
    if isinstance(provider, AnthropicProvider):
        return provider._post
    assert isinstance(provider, (OpenAIProvider, OpenAIResponsesProvider))
    return next(iter(provider._sdk._posts.values()))


@pytest.mark.parametrize(("name", "stream"), MODES)
async def test_a_prepared_request_sends_what_the_sdk_sent(
    name: str, stream: bool, made: list[Provider]
) -> None:
    _, make_for, good, _, _ = CASES[name]
    with _fake(name) as fake:
        provider = await _warm(fake, make_for(fake, stream), good, made)
        fake.add(good())
        second = await answer(provider, _request())
        first, again = fake.requests[-2], fake.requests[-1]
        assert again.headers == first.headers  # every header, the length included
        assert again.body == first.body
        assert again.path == first.path
        assert text_of(second) == "fine"


@pytest.mark.parametrize(("name", "stream"), MODES)
async def test_every_fault_is_the_same_error_sent_prepared_or_by_the_sdk(
    name: str, stream: bool, made: list[Provider]
) -> None:
    _, make_for, good, faults, stream_faults = CASES[name]
    with _fake(name) as fake:
        make = make_for(fake, stream)
        warmed = await _warm(fake, make, good, made)
        met = [*faults(), *(stream_faults() if stream else ()), *(c() for c in COMMON_FAULTS)]
        for fault in met:
            fresh = make()
            made.append(fresh)
            fake.add(fault)
            by_sdk = (await failure(fresh, _request())).error
            fake.add(fault)
            prepared = (await failure(warmed, _request())).error
            assert _describe(prepared) == _describe(by_sdk), fault
            assert _post_of(warmed).prepared
            fake.add(good())  # the connection is sound for the next one
            assert text_of(await answer(warmed, _request())) == "fine"


@pytest.mark.parametrize(
    "raised",
    [
        httpx2.ConnectTimeout("connect timed out"),
        httpx2.ReadTimeout("read timed out"),
        httpx2.ConnectError("All connection attempts failed"),
        httpx2.RemoteProtocolError("Server disconnected"),
        httpx2.ReadError("Connection reset by peer"),
    ],
    ids=lambda exc: type(exc).__name__,
)
@pytest.mark.parametrize("name", list(CASES))
async def test_a_transport_failure_is_the_same_error_sent_prepared_or_by_the_sdk(
    name: str, raised: Exception, made: list[Provider], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, make_for, good, _, _ = CASES[name]
    with _fake(name) as fake:
        make = make_for(fake, True)
        warmed = await _warm(fake, make, good, made)
        fresh = make()
        made.append(fresh)

        async def failing(self: AiohttpTransport, *args: Any) -> httpx2.Response:
            raise type(raised)(str(raised), request=args[0].request)

        # what moves the bytes, under both paths: the SDK's own request and a prepared one
        monkeypatch.setattr(AiohttpTransport, "_send", failing)
        by_sdk = (await failure(fresh, _request())).error
        prepared = (await failure(warmed, _request())).error
        assert _describe(prepared) == _describe(by_sdk)
        assert by_sdk is not None and by_sdk.kind == "retryable"


async def test_a_redirect_is_followed_and_the_sdk_sends_from_then_on(
    made: list[Provider],
) -> None:
    with O.OpenAIFake() as fake:
        provider = await _warm(fake, _openai(fake, True), lambda: O.Reply(text="fine"), made)
        moved = RawHTTP(307, "", "text/plain", {"location": f"{fake.base_url}/chat/completions"})
        fake.add(moved, O.Reply(text="after the move"))
        assert text_of(await answer(provider, _request())) == "after the move"
        assert [r.path for r in fake.requests[-2:]] == ["/v1/chat/completions"] * 2
        assert not _post_of(provider).prepared
        fake.add(O.Reply(text="still fine"))
        assert text_of(await answer(provider, _request())) == "still fine"


async def test_the_sdk_builds_no_request_for_a_prepared_one(
    made: list[Provider], monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[str] = []
    sent: list[Prepared] = []
    for client in ("openai", "anthropic"):
        module = __import__(f"{client}._base_client", fromlist=["BaseClient"])
        original = module.BaseClient._build_request

        def counting(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            built.append(type(self).__name__)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(module.BaseClient, "_build_request", counting)
    original_send = AiohttpTransport.send_prepared

    async def recording(self: AiohttpTransport, prepared: Prepared, body: Any) -> Any:
        sent.append(prepared)
        return await original_send(self, prepared, body)

    monkeypatch.setattr(AiohttpTransport, "send_prepared", recording)
    for name in CASES:
        _, make_for, good, _, _ = CASES[name]
        with _fake(name) as fake:
            provider = make_for(fake, True)()
            made.append(provider)
            for _ in range(4):
                fake.add(good())
                await answer(provider, _request())
    assert len(built) == 3  # each provider's first request
    assert len(sent) == 9  # and the other three of each


async def test_an_anthropic_client_whose_spans_record_is_sent_by_the_sdk(
    made: list[Provider], monkeypatch: pytest.MonkeyPatch
) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    with A.AnthropicFake() as fake:
        good = CASES["anthropic"][2]
        provider = await _warm(fake, _anthropic(fake, True), good, made)
        # telemetry configured after the first request: the SDK's spans now record
        monkeypatch.setattr(trace, "get_tracer_provider", lambda: TracerProvider())
        assert not _post_of(provider).prepared
        sent: list[Any] = []
        monkeypatch.setattr(AiohttpTransport, "send_prepared", lambda *a: sent.append(a))
        fake.add(good())
        assert text_of(await answer(provider, _request())) == "fine"
        assert sent == []
        assert _transport_of(provider).last_post is None
