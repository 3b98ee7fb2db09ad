"""Hostile provider streams (issue 11, point 4): every fault is a ProviderError with its kind.

Both providers, over real HTTP against the fakes: a chunk cut in the middle of its JSON, a
chunk of the wrong shape, empty ``choices``, Anthropic events out of order, an HTML error page
(5xx and 200), a 200 that is not an event stream. The kinds are the ones docs/providers.md
("Stream faults") lists: malformed data is ``retryable`` (``malformed_stream``), a protocol
violation and a body that is not a stream are ``fatal``, an HTML 5xx is the 5xx it is.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from app.agent.messages import TextBlock, UserMessage
from app.agent.providers.anthropic import AnthropicProvider
from app.agent.providers.base import Provider, ProviderRequest
from app.agent.providers.openai import OpenAIProvider
from tests.fakes import anthropic_fake as A
from tests.fakes import openai_fake as O
from tests.fakes._server import RawHTTP, html_page

from ._drive import answer, failure

ISSUE_CHUNK = '{"id": "x", "choices": [{"index": 0, "delta": {"content": "bro'


def openai(fake: O.OpenAIFake, *, stream: bool = True) -> OpenAIProvider:
    return OpenAIProvider(
        api_key=fake.api_key, base_url=fake.base_url, model="gpt-fake", timeout=10, stream=stream
    )


def anthropic(fake: A.AnthropicFake, *, stream: bool = True) -> AnthropicProvider:
    return AnthropicProvider(
        api_key=fake.api_key,
        base_url=fake.base_url,
        model="claude-fake",
        max_tokens=1024,
        timeout=10,
        stream=stream,
    )


def req(model: str) -> ProviderRequest:
    return ProviderRequest(system_prompt="", messages=(UserMessage.text("hi"),), model=model)


@pytest.fixture
async def gpt(openai_fake: O.OpenAIFake) -> AsyncIterator[OpenAIProvider]:
    p = openai(openai_fake)
    yield p
    await p.aclose()


@pytest.fixture
async def claude(anthropic_fake: A.AnthropicFake) -> AsyncIterator[AnthropicProvider]:
    p = anthropic(anthropic_fake)
    yield p
    await p.aclose()


# --- malformed JSON ---------------------------------------------------------------------------


async def test_openai_malformed_chunk_mid_stream_keeps_the_partial(
    gpt: OpenAIProvider, openai_fake: O.OpenAIFake
) -> None:
    openai_fake.add(O.Reply(text="partial answer", chunk_size=4, malformed_at=3))
    failed = await failure(gpt, req("gpt-fake"))
    assert failed.error is not None
    assert (failed.error.kind, failed.error.code) == ("retryable", "malformed_stream")
    assert failed.error.message.startswith("openai: malformed stream data (JSONDecodeError)")
    assert failed.message.stop_reason == "error" and not failed.message.replayable
    assert failed.message.content == (TextBlock(text="partial "),)


async def test_openai_the_issue_chunk_then_the_stream_goes_on(
    gpt: OpenAIProvider, openai_fake: O.OpenAIFake
) -> None:
    base = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    openai_fake.add(
        O.RawSSE(
            [
                {**base, "choices": [{"index": 0, "delta": {"content": "it is "}}]},
                ISSUE_CHUNK,
                {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                "[DONE]",
            ]
        )
    )
    failed = await failure(gpt, req("gpt-fake"))
    assert failed.error is not None and failed.error.code == "malformed_stream"
    assert failed.message.content == (TextBlock(text="it is "),)


async def test_openai_the_issue_chunk_then_the_stream_ends(
    gpt: OpenAIProvider, openai_fake: O.OpenAIFake
) -> None:
    openai_fake.add(O.RawSSE([ISSUE_CHUNK]))
    failed = await failure(gpt, req("gpt-fake"))
    assert failed.error is not None
    assert (failed.error.kind, failed.error.code) == ("retryable", "malformed_stream")
    assert failed.message.content == ()


@pytest.mark.parametrize(
    "payload",
    [
        42,
        ["a", "list"],
        {"id": "x", "choices": {"0": {"delta": {"content": "a"}}}},
        {"id": "x", "choices": [{"index": 0, "delta": {"tool_calls": 7}}]},
    ],
    ids=["number", "list", "choices-object", "tool-calls-number"],
)
async def test_openai_chunk_of_the_wrong_shape_is_malformed(
    gpt: OpenAIProvider, openai_fake: O.OpenAIFake, payload: Any
) -> None:
    openai_fake.add(O.RawSSE([payload, "[DONE]"]))
    failed = await failure(gpt, req("gpt-fake"))
    assert failed.error is not None
    assert (failed.error.kind, failed.error.code) == ("retryable", "malformed_stream")


async def test_openai_only_empty_choices_is_a_stream_without_an_end(
    gpt: OpenAIProvider, openai_fake: O.OpenAIFake
) -> None:
    base = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    openai_fake.add(O.RawSSE([{**base, "choices": []}, {**base, "choices": []}, "[DONE]"]))
    failed = await failure(gpt, req("gpt-fake"))
    assert failed.error is not None and failed.error.kind == "retryable"
    assert "finish_reason" in failed.error.message


async def test_openai_json_mode_empty_choices_and_malformed_body(
    openai_fake: O.OpenAIFake,
) -> None:
    openai_fake.add(
        RawHTTP(200, '{"id": "x", "choices": []}', "application/json"),
        RawHTTP(200, '{"id": "x", "choices": [{"message": {"content": "bro', "application/json"),
    )
    p = openai(openai_fake, stream=False)
    try:
        empty = await failure(p, req("gpt-fake"))
        cut = await failure(p, req("gpt-fake"))
    finally:
        await p.aclose()
    assert empty.error is not None and (empty.error.kind, empty.error.code) == (
        "retryable",
        "no_choices",
    )
    assert cut.error is not None and (cut.error.kind, cut.error.code) == (
        "retryable",
        "malformed_stream",
    )


async def test_anthropic_malformed_event_mid_stream_keeps_the_partial(
    claude: AnthropicProvider, anthropic_fake: A.AnthropicFake
) -> None:
    # events: message_start, ping, content_block_start, "a lo", "ng a", <cut JSON>, ...
    anthropic_fake.add(A.Reply([A.Text("a long answer")], chunk_size=4, malformed_at=5))
    failed = await failure(claude, req("claude-fake"))
    assert failed.error is not None
    assert (failed.error.kind, failed.error.code) == ("retryable", "malformed_stream")
    assert failed.error.message.startswith("anthropic: malformed stream data (JSONDecodeError)")
    assert failed.message.content == (TextBlock(text="a long a"),)


async def test_anthropic_json_mode_malformed_body(anthropic_fake: A.AnthropicFake) -> None:
    anthropic_fake.add(RawHTTP(200, '{"id": "msg_1", "content": [{"type": "te', "application/json"))
    p = anthropic(anthropic_fake, stream=False)
    try:
        failed = await failure(p, req("claude-fake"))
    finally:
        await p.aclose()
    assert failed.error is not None
    assert (failed.error.kind, failed.error.code) == ("retryable", "malformed_stream")


# --- Anthropic event order --------------------------------------------------------------------

START = (
    "message_start",
    {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-fake",
            "content": [],
            "stop_reason": None,
            "usage": {"input_tokens": 3, "output_tokens": 1},
        },
    },
)


def block_start(index: int, kind: str = "text") -> tuple[str, dict[str, Any]]:
    block: dict[str, Any] = {"type": kind}
    if kind == "text":
        block["text"] = ""
    elif kind == "tool_use":
        block.update(id="toolu_1", name="lookup", input={})
    return (
        "content_block_start",
        {"type": "content_block_start", "index": index, "content_block": block},
    )


def text_delta(index: int, text: str = "hey") -> tuple[str, dict[str, Any]]:
    return (
        "content_block_delta",
        {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "text_delta", "text": text},
        },
    )


def block_stop(index: int) -> tuple[str, dict[str, Any]]:
    return ("content_block_stop", {"type": "content_block_stop", "index": index})


MESSAGE_DELTA = (
    "message_delta",
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}},
)
STOP = ("message_stop", {"type": "message_stop"})


@pytest.mark.parametrize(
    ("events", "what"),
    [
        (
            [START, text_delta(0), block_stop(0), MESSAGE_DELTA, STOP],
            "before its content_block_start",
        ),
        ([MESSAGE_DELTA, START, STOP], "message_delta before message_start"),
        ([block_start(0), text_delta(0), START], "content_block_start before message_start"),
        ([START, block_start(0), text_delta(0), block_stop(3), STOP], "block 3 before its"),
        ([START, block_start(0), block_stop(0), text_delta(0), STOP], "block 0 after it stopped"),
        ([START, block_start(0), block_start(0), STOP], "block 0 started twice"),
        ([START, START, STOP], "a second message_start"),
        ([START, block_start(0, "tool_use"), text_delta(0), STOP], "a text_delta for block 0"),
        (
            [START, ("content_block_delta", {"type": "content_block_delta", "delta": {}}), STOP],
            "without a block index",
        ),
    ],
    ids=[
        "delta-before-start",
        "message-delta-first",
        "block-before-message",
        "unknown-index",
        "delta-after-stop",
        "started-twice",
        "two-message-starts",
        "wrong-delta-type",
        "no-index",
    ],
)
async def test_anthropic_events_out_of_order_are_a_fatal_protocol_error(
    claude: AnthropicProvider,
    anthropic_fake: A.AnthropicFake,
    events: list[tuple[str, Any]],
    what: str,
) -> None:
    anthropic_fake.add(A.RawSSE(events))
    failed = await failure(claude, req("claude-fake"))
    assert failed.error is not None
    assert (failed.error.kind, failed.error.code) == ("fatal", "protocol_error")
    assert what in failed.error.message, failed.error.message


async def test_anthropic_blocks_of_unknown_types_and_their_deltas_are_ignored(
    claude: AnthropicProvider, anthropic_fake: A.AnthropicFake
) -> None:
    server_tool = (
        "content_block_delta",
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "?"}},
    )
    anthropic_fake.add(
        A.RawSSE(
            [
                START,
                block_start(0, "server_tool_use"),
                server_tool,
                block_stop(0),
                block_start(1),
                text_delta(1, "fine"),
                (
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": 1,
                        "delta": {"type": "citations_delta"},
                    },
                ),
                block_stop(1),
                MESSAGE_DELTA,
                STOP,
            ]
        )
    )
    message = await answer(claude, req("claude-fake"))
    assert message.content == (TextBlock(text="fine"),)


# --- bodies that are not the API's ------------------------------------------------------------


def both(
    openai_fake: O.OpenAIFake, anthropic_fake: A.AnthropicFake, stream: bool
) -> list[tuple[Provider, str, Any]]:
    return [
        (openai(openai_fake, stream=stream), "gpt-fake", openai_fake),
        (anthropic(anthropic_fake, stream=stream), "claude-fake", anthropic_fake),
    ]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
async def test_html_error_page_5xx_is_retryable_and_summarized(
    openai_fake: O.OpenAIFake, anthropic_fake: A.AnthropicFake, stream: bool
) -> None:
    for provider, model, fake in both(openai_fake, anthropic_fake, stream):
        fake.add(html_page(502, "502 Bad Gateway"))
        try:
            failed = await failure(provider, req(model))
        finally:
            await provider.aclose()
        error = failed.error
        assert error is not None and (error.kind, error.status) == ("retryable", 502)
        assert error.message == (
            f'{provider.name}: HTTP 502: HTML page "502 Bad Gateway": nginx/1.25.3'
        )


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
async def test_html_page_behind_a_200_is_fatal(
    openai_fake: O.OpenAIFake, anthropic_fake: A.AnthropicFake, stream: bool
) -> None:
    for provider, model, fake in both(openai_fake, anthropic_fake, stream):
        fake.add(html_page(200, "Sign in to the guest network"))
        try:
            failed = await failure(provider, req(model))
        finally:
            await provider.aclose()
        error = failed.error
        assert error is not None
        assert (error.kind, error.code) == ("fatal", "not_an_event_stream")
        assert 'HTML page "Sign in to the guest network"' in error.message
        assert "<" not in error.message


async def test_html_404_is_fatal(
    openai_fake: O.OpenAIFake, anthropic_fake: A.AnthropicFake
) -> None:
    for provider, model, fake in both(openai_fake, anthropic_fake, True):
        fake.add(html_page(404, "404 Not Found"))
        try:
            failed = await failure(provider, req(model))
        finally:
            await provider.aclose()
        assert failed.error is not None and (failed.error.kind, failed.error.status) == (
            "fatal",
            404,
        )


async def test_stream_answered_with_a_json_body(
    openai_fake: O.OpenAIFake, anthropic_fake: A.AnthropicFake
) -> None:
    """A server that ignores ``stream: true`` and answers JSON: no event arrives, fatal, with
    a hint."""
    for provider, model, fake in both(openai_fake, anthropic_fake, True):
        fake.add(RawHTTP(200, '{"id": "x", "choices": []}', "application/json"))
        try:
            ignored = await failure(provider, req(model))
        finally:
            await provider.aclose()
        assert ignored.error is not None
        assert (ignored.error.kind, ignored.error.code) == ("fatal", "not_an_event_stream")
        assert "application/json, not an event stream" in ignored.error.message
        assert "stream = false" in ignored.error.message


async def test_sse_labelled_as_json_is_still_read(
    openai_fake: O.OpenAIFake, anthropic_fake: A.AnthropicFake
) -> None:
    """Lenient on purpose: only HTML is refused before reading; a stream that delivers
    events is a stream, whatever its label."""
    openai_body = "".join(
        f"data: {chunk}\n\n"
        for chunk in (
            '{"id": "x", "choices": [{"index": 0, "delta": {"content": "ok"}}]}',
            '{"id": "x", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}',
            "[DONE]",
        )
    )
    events = [START, block_start(0), text_delta(0, "ok"), block_stop(0), MESSAGE_DELTA, STOP]
    anthropic_body = "".join(
        f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events
    )
    openai_fake.add(RawHTTP(200, openai_body, "application/json"))
    anthropic_fake.add(RawHTTP(200, anthropic_body, "application/json"))
    for provider, model, _ in both(openai_fake, anthropic_fake, True):
        try:
            message = await answer(provider, req(model))
        finally:
            await provider.aclose()
        assert message.content == (TextBlock(text="ok"),)


async def test_an_empty_sse_body_is_a_cut_stream(
    openai_fake: O.OpenAIFake, anthropic_fake: A.AnthropicFake
) -> None:
    for provider, model, fake in both(openai_fake, anthropic_fake, True):
        fake.add(RawHTTP(200, "", "text/event-stream"))
        try:
            failed = await failure(provider, req(model))
        finally:
            await provider.aclose()
        assert failed.error is not None and failed.error.kind == "retryable"


async def test_a_plain_text_stream_is_still_read_as_sse(openai_fake: O.OpenAIFake) -> None:
    """Lenient on purpose: some compatible servers send SSE as text/plain."""
    body = "".join(
        f"data: {chunk}\n\n"
        for chunk in (
            '{"id": "x", "choices": [{"index": 0, "delta": {"content": "ok"}}]}',
            '{"id": "x", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}',
            "[DONE]",
        )
    )
    openai_fake.add(RawHTTP(200, body, "text/plain"))
    p = openai(openai_fake)
    try:
        message = await answer(p, req("gpt-fake"))
    finally:
        await p.aclose()
    assert message.content == (TextBlock(text="ok"),)


def test_summarize_body() -> None:
    from app.agent.providers._http import summarize_body

    page = "<html><head><title>Oops &amp; co</title><script>var x = '<b>';</script></head>"
    page += "<body><h1>Oops &amp; co</h1><p>Try   again\nlater.</p>" + "<p>x</p>" * 100_000
    summary = summarize_body(page)
    assert summary.startswith('HTML page "Oops & co": Try again later. x x')
    assert len(summary) <= 260 and "<" not in summary and "var x" not in summary
    assert summarize_body("<!DOCTYPE html><p>no title</p>") == "HTML page: no title"
    assert summarize_body("plain  text\n\nbody") == "plain text body"
    assert summarize_body("y" * 1000) == "y" * 200 + "…"
