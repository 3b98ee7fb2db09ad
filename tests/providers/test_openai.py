"""OpenAIProvider against the fake Chat Completions server, over real HTTP."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator

import pytest

from app.agent.messages import (
    AssistantMessage,
    Base64Source,
    ImageBlock,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
    ToolResultMessage,
    UrlSource,
    Usage,
    UserMessage,
)
from app.agent.providers.base import (
    MessageStart,
    MessageStop,
    ProviderRequest,
    ToolCallDelta,
    ToolCallStart,
    ToolSpec,
    UsageUpdate,
)
from app.agent.providers.openai import OpenAIProvider
from tests.fakes.openai_fake import Error, OpenAIFake, RawSSE, Reply, ToolCall

from ._drive import answer, failure

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\nfake-image-bytes").decode()
TOOLS = (ToolSpec("lookup", "Look a thing up.", {"type": "object", "properties": {}}),)


@pytest.fixture(params=[True, False], ids=["stream", "json"])
async def provider(
    request: pytest.FixtureRequest, openai_fake: OpenAIFake
) -> AsyncIterator[OpenAIProvider]:
    p = OpenAIProvider(
        api_key=openai_fake.api_key,
        base_url=openai_fake.base_url,
        model="gpt-fake",
        timeout=10,
        stream=request.param,
    )
    yield p
    await p.aclose()


@pytest.fixture
async def streaming(openai_fake: OpenAIFake) -> AsyncIterator[OpenAIProvider]:
    p = OpenAIProvider(
        api_key=openai_fake.api_key, base_url=openai_fake.base_url, model="gpt-fake", timeout=10
    )
    yield p
    await p.aclose()


def req(
    *messages: UserMessage | AssistantMessage | ToolResultMessage,
    system: str = "Be brief.",
    tools: tuple[ToolSpec, ...] = (),
    max_tokens: int | None = None,
) -> ProviderRequest:
    return ProviderRequest(
        system_prompt=system,
        messages=messages,
        tools=tools,
        model="gpt-fake",
        max_output_tokens=max_tokens,
    )


# --- text ---------------------------------------------------------------------------------


async def test_text(provider: OpenAIProvider, openai_fake: OpenAIFake) -> None:
    openai_fake.add(
        Reply(text="Hello, wörld! 👋", prompt_tokens=21, completion_tokens=5, id="chatcmpl-abc")
    )
    message = await answer(provider, req(UserMessage.text("hi")))
    assert message.content == (TextBlock(text="Hello, wörld! 👋"),)
    assert message.stop_reason == "end_turn"
    assert message.response_id == "chatcmpl-abc"
    assert message.model == "gpt-fake"
    assert message.usage == Usage(input_tokens=21, output_tokens=5)
    sent = openai_fake.chat_requests[-1].json
    assert sent["model"] == "gpt-fake"
    assert sent["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    assert "tools" not in sent
    if provider.stream_mode:
        assert sent["stream"] is True
        assert sent["stream_options"] == {"include_usage": True}
    else:
        assert not sent.get("stream")


async def test_stream_events_shape(streaming: OpenAIProvider, openai_fake: OpenAIFake) -> None:
    openai_fake.add(Reply(text="abcdefg", chunk_size=2))
    from ._drive import attempt

    result = await attempt(streaming, req(UserMessage.text("hi")))
    assert isinstance(result.events[0], MessageStart)
    assert isinstance(result.events[-1], MessageStop)
    assert result.events[-1].stop_reason == "stop"
    texts = [e.text for e in result.events if hasattr(e, "text")]
    assert texts == ["ab", "cd", "ef", "g"]
    assert any(isinstance(e, UsageUpdate) for e in result.events)


async def test_empty_system_prompt_is_left_out(
    provider: OpenAIProvider, openai_fake: OpenAIFake
) -> None:
    openai_fake.add(Reply(text="ok"))
    await answer(provider, req(UserMessage.text("hi"), system=""))
    assert openai_fake.chat_requests[-1].json["messages"] == [{"role": "user", "content": "hi"}]


async def test_usage_with_cached_tokens(provider: OpenAIProvider, openai_fake: OpenAIFake) -> None:
    openai_fake.add(Reply(text="ok", prompt_tokens=2000, completion_tokens=12, cached_tokens=1536))
    message = await answer(provider, req(UserMessage.text("hi")))
    assert message.usage == Usage(input_tokens=2000, output_tokens=12, cache_read_tokens=1536)


async def test_usage_on_the_finish_chunk(
    streaming: OpenAIProvider, openai_fake: OpenAIFake
) -> None:
    openai_fake.add(
        Reply(text="ok", prompt_tokens=3, completion_tokens=4, usage_in_last_choice_chunk=True)
    )
    message = await answer(streaming, req(UserMessage.text("hi")))
    assert message.usage == Usage(input_tokens=3, output_tokens=4)


async def test_max_output_tokens(provider: OpenAIProvider, openai_fake: OpenAIFake) -> None:
    openai_fake.add(Reply(text="ok", finish_reason="length"))
    message = await answer(provider, req(UserMessage.text("hi"), max_tokens=64))
    assert message.stop_reason == "max_tokens"
    # a base_url means a compatible server: the widely understood ``max_tokens``
    assert openai_fake.chat_requests[-1].json["max_tokens"] == 64


async def test_reasoning_content_becomes_unsigned_thinking_and_is_not_sent_back(
    provider: OpenAIProvider, openai_fake: OpenAIFake
) -> None:
    openai_fake.add(Reply(reasoning="Let me think.", text="42"), Reply(text="ok"))
    first = await answer(provider, req(UserMessage.text("q")))
    assert first.content == (
        ThinkingBlock(thinking="Let me think.", signature=""),
        TextBlock(text="42"),
    )
    await answer(provider, req(UserMessage.text("q"), first, UserMessage.text("and?")))
    sent = openai_fake.chat_requests[-1].json["messages"]
    assert sent[2] == {"role": "assistant", "content": "42"}


# --- tool calls ---------------------------------------------------------------------------

ODD_ARGS = '{"b": 2,  "a":1 , "s":"\\u00e9é"}'  # odd spacing, key order, escapes
BROKEN_ARGS = '{"q": "unterminated'  # not valid JSON: still sent back byte for byte


async def test_tool_call_round_trip_preserves_raw_arguments(
    provider: OpenAIProvider, openai_fake: OpenAIFake
) -> None:
    openai_fake.add(
        Reply(
            text="Looking.",
            tool_calls=[
                ToolCall("lookup", ODD_ARGS, id="call_A1"),
                ToolCall("lookup", BROKEN_ARGS, id="call_B2"),
            ],
        ),
        Reply(text="Done."),
    )
    prompt = UserMessage.text("find")
    first = await answer(provider, req(prompt, tools=TOOLS))
    assert first.stop_reason == "tool_use"
    assert first.content == (
        TextBlock(text="Looking."),
        ToolCallBlock(id="call_A1", name="lookup", arguments=ODD_ARGS),
        ToolCallBlock(id="call_B2", name="lookup", arguments=BROKEN_ARGS),
    )
    sent_tools = openai_fake.chat_requests[-1].json["tools"]
    assert sent_tools == [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "Look a thing up.",
                "parameters": {"type": "object", "properties": {}},
            },
        }
    ]

    results = (
        ToolResultMessage(
            tool_call_id="call_A1", tool_name="lookup", content=(TextBlock(text="found A"),)
        ),
        ToolResultMessage(
            tool_call_id="call_B2",
            tool_name="lookup",
            content=(TextBlock(text="bad arguments"),),
            is_error=True,
        ),
    )
    second = await answer(provider, req(prompt, first, *results, tools=TOOLS))
    assert second.content == (TextBlock(text="Done."),)
    raw = openai_fake.chat_requests[-1].json["messages"]
    assert raw[2] == {
        "role": "assistant",
        "content": "Looking.",
        "tool_calls": [
            {
                "id": "call_A1",
                "type": "function",
                "function": {"name": "lookup", "arguments": ODD_ARGS},
            },
            {
                "id": "call_B2",
                "type": "function",
                "function": {"name": "lookup", "arguments": BROKEN_ARGS},
            },
        ],
    }
    assert raw[3] == {"role": "tool", "tool_call_id": "call_A1", "content": "found A"}
    assert raw[4] == {"role": "tool", "tool_call_id": "call_B2", "content": "bad arguments"}


async def test_tool_call_without_text_sends_null_content(
    provider: OpenAIProvider, openai_fake: OpenAIFake
) -> None:
    openai_fake.add(Reply(tool_calls=[ToolCall("lookup", "{}", id="call_1")]), Reply(text="k"))
    first = await answer(provider, req(UserMessage.text("x"), tools=TOOLS))
    assert first.content == (ToolCallBlock(id="call_1", name="lookup", arguments="{}"),)
    result = ToolResultMessage(
        tool_call_id="call_1", tool_name="lookup", content=(TextBlock(text="r"),)
    )
    await answer(provider, req(UserMessage.text("x"), first, result, tools=TOOLS))
    assert openai_fake.chat_requests[-1].json["messages"][2]["content"] is None


async def test_fake_rejects_reserialized_arguments(
    provider: OpenAIProvider, openai_fake: OpenAIFake
) -> None:
    openai_fake.add(Reply(tool_calls=[ToolCall("lookup", ODD_ARGS, id="call_A1")]))
    first = await answer(provider, req(UserMessage.text("x"), tools=TOOLS))
    call = first.tool_calls[0]
    reserialized = first.model_copy(
        update={
            "content": (
                call.model_copy(update={"arguments": json.dumps(json.loads(call.arguments))}),
            )
        }
    )
    result = ToolResultMessage(
        tool_call_id="call_A1", tool_name="lookup", content=(TextBlock(text="r"),)
    )
    failed = await failure(provider, req(UserMessage.text("x"), reserialized, result))
    assert failed.error is not None and failed.error.kind == "fatal"
    assert failed.error.status == 400
    assert "does not replay the tool call as issued" in failed.error.message


async def test_fake_rejects_orphan_call_and_orphan_result(
    provider: OpenAIProvider, openai_fake: OpenAIFake
) -> None:
    call = AssistantMessage(content=(ToolCallBlock(id="call_9", name="lookup", arguments="{}"),))
    failed = await failure(provider, req(UserMessage.text("x"), call, UserMessage.text("y")))
    assert failed.error is not None and failed.error.kind == "fatal"
    assert "must be followed by tool messages" in failed.error.message
    assert "call_9" in failed.error.message

    orphan = ToolResultMessage(
        tool_call_id="call_0", tool_name="lookup", content=(TextBlock(text="r"),)
    )
    failed = await failure(provider, req(UserMessage.text("x"), orphan))
    assert failed.error is not None and failed.error.kind == "fatal"
    assert "must be a response to a preceeding message with 'tool_calls'" in failed.error.message


async def test_ollama_style_deltas_without_index(
    streaming: OpenAIProvider, openai_fake: OpenAIFake
) -> None:
    openai_fake.add(
        Reply(
            tool_calls=[
                ToolCall("lookup", '{"q": "first one"}', id="call_x"),
                ToolCall("lookup", '{"q": "second"}', id="call_y"),
            ],
            omit_index=True,
            chunk_size=4,
        )
    )
    message = await answer(streaming, req(UserMessage.text("x"), tools=TOOLS))
    assert message.tool_calls == (
        ToolCallBlock(id="call_x", name="lookup", arguments='{"q": "first one"}'),
        ToolCallBlock(id="call_y", name="lookup", arguments='{"q": "second"}'),
    )


async def test_deltas_without_index_or_id_get_stable_generated_ids(
    provider: OpenAIProvider, openai_fake: OpenAIFake
) -> None:
    openai_fake.add(
        Reply(
            tool_calls=[ToolCall("lookup", '{"q": "first one"}'), ToolCall("other", '{"q": 2}')],
            omit_index=True,
            omit_id=True,
            chunk_size=5,
        )
    )
    from ._drive import attempt

    result = await attempt(provider, req(UserMessage.text("x"), tools=TOOLS))
    calls = result.message.tool_calls
    assert [(c.name, c.arguments) for c in calls] == [
        ("lookup", '{"q": "first one"}'),
        ("other", '{"q": 2}'),
    ]
    assert calls[0].id != calls[1].id
    assert all(c.id.startswith("call_") for c in calls)
    starts = [e for e in result.events if isinstance(e, ToolCallStart)]
    assert [s.id for s in starts] == [c.id for c in calls]  # one id per call, never changed
    deltas = [e for e in result.events if isinstance(e, ToolCallDelta)]
    assert {d.index for d in deltas} == {s.index for s in starts}


# --- images -------------------------------------------------------------------------------


async def test_images_base64_and_url(provider: OpenAIProvider, openai_fake: OpenAIFake) -> None:
    openai_fake.add(Reply(tool_calls=[ToolCall("shot", "{}", id="call_img")]), Reply(text="ok"))
    prompt = UserMessage(
        content=(
            TextBlock(text="What is this?"),
            ImageBlock(source=Base64Source(media_type="image/png", data=PNG)),
            ImageBlock(source=UrlSource(url="https://example.com/cat.jpg")),
        )
    )
    first = await answer(provider, req(prompt, tools=TOOLS))
    assert openai_fake.chat_requests[-1].json["messages"][1]["content"] == [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
    ]
    result = ToolResultMessage(
        tool_call_id="call_img",
        tool_name="shot",
        content=(ImageBlock(source=Base64Source(media_type="image/png", data=PNG)),),
    )
    await answer(provider, req(prompt, first, result, UserMessage.text("describe"), tools=TOOLS))
    sent = openai_fake.chat_requests[-1].json["messages"]
    assert sent[3]["role"] == "tool" and sent[3]["tool_call_id"] == "call_img"
    assert isinstance(sent[3]["content"], str) and sent[3]["content"]
    assert sent[4] == {
        "role": "user",
        "content": [
            {"type": "text", "text": "Image output of tool call call_img (shot):"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
        ],
    }
    assert sent[5] == {"role": "user", "content": "describe"}


# --- errors -------------------------------------------------------------------------------


async def test_overflow(provider: OpenAIProvider, openai_fake: OpenAIFake) -> None:
    openai_fake.add(Error.overflow())
    failed = await failure(provider, req(UserMessage.text("x")))
    assert failed.error is not None
    assert failed.error.kind == "overflow"
    assert failed.error.code == "context_length_exceeded"
    assert failed.error.status == 400


async def test_overflow_by_message_only(provider: OpenAIProvider, openai_fake: OpenAIFake) -> None:
    # vLLM / llama.cpp style: no code, only the wording
    openai_fake.add(
        Error(
            400,
            "This model's maximum context length is 4096 tokens. However, "
            "you requested 5000 tokens.",
            type="BadRequestError",
        )
    )
    failed = await failure(provider, req(UserMessage.text("x")))
    assert failed.error is not None and failed.error.kind == "overflow"


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry_after": "2"}, 2.0),
        ({"retry_after": None, "retry_after_ms": "1500"}, 1.5),
        ({"retry_after": "7", "retry_after_ms": "250"}, 0.25),
        ({"retry_after": None}, None),
    ],
)
async def test_rate_limit_retry_after(
    provider: OpenAIProvider,
    openai_fake: OpenAIFake,
    headers: dict[str, str | None],
    expected: float | None,
) -> None:
    openai_fake.add(Error.rate_limit(**headers))
    failed = await failure(provider, req(UserMessage.text("x")))
    assert failed.error is not None
    assert failed.error.kind == "retryable"
    assert failed.error.status == 429
    assert failed.error.retry_after == expected


async def test_quota_exhausted_is_fatal(provider: OpenAIProvider, openai_fake: OpenAIFake) -> None:
    openai_fake.add(
        Error(
            429,
            "You exceeded your current quota.",
            type="insufficient_quota",
            code="insufficient_quota",
        )
    )
    failed = await failure(provider, req(UserMessage.text("x")))
    assert failed.error is not None and failed.error.kind == "fatal"


@pytest.mark.parametrize("status", [500, 502, 503, 529])
async def test_server_errors_are_retryable(
    provider: OpenAIProvider, openai_fake: OpenAIFake, status: int
) -> None:
    openai_fake.add(Error.server(status), Error.server(status), Reply(text="finally"))
    for _ in range(2):
        failed = await failure(provider, req(UserMessage.text("x")))
        assert failed.error is not None
        assert failed.error.kind == "retryable" and failed.error.status == status
    assert (await answer(provider, req(UserMessage.text("x")))).content == (
        TextBlock(text="finally"),
    )


async def test_not_found_is_fatal(provider: OpenAIProvider, openai_fake: OpenAIFake) -> None:
    openai_fake.add(Error.not_found("gpt-fake"))
    failed = await failure(provider, req(UserMessage.text("x")))
    assert failed.error is not None and failed.error.kind == "fatal"
    assert failed.error.status == 404 and "does not exist" in failed.error.message


async def test_bad_key_is_fatal_and_never_echoed(openai_fake: OpenAIFake) -> None:
    key = "sk-proj-SECRETabcdefghijklmnop1234"
    p = OpenAIProvider(api_key=key, base_url=openai_fake.base_url, model="gpt-fake", timeout=10)
    try:
        failed = await failure(p, req(UserMessage.text("x")))
    finally:
        await p.aclose()
    assert failed.error is not None
    assert failed.error.kind == "fatal" and failed.error.status == 401
    assert openai_fake.rejections[-1]["error"]["message"].startswith("Incorrect API key")
    for secret in (key, key[:10], "SECRET", key[-4:]):
        assert secret not in failed.error.message
    assert "API key" in failed.error.message


async def test_cut_stream_is_retryable_and_keeps_the_partial(
    streaming: OpenAIProvider, openai_fake: OpenAIFake
) -> None:
    openai_fake.add(Reply(text="partial answer here", chunk_size=4, cut_after=4))
    failed = await failure(streaming, req(UserMessage.text("x")))
    assert failed.error is not None and failed.error.kind == "retryable"
    assert failed.message.stop_reason == "error" and not failed.message.replayable
    assert failed.message.content == (TextBlock(text="partial answ"),)


async def test_stream_ending_without_finish_reason_is_retryable(
    streaming: OpenAIProvider, openai_fake: OpenAIFake
) -> None:
    openai_fake.add(
        Reply(tool_calls=[ToolCall("lookup", '{"q": 1}', id="call_1")], chunk_size=2, end_after=3)
    )
    failed = await failure(streaming, req(UserMessage.text("x"), tools=TOOLS))
    assert failed.error is not None and failed.error.kind == "retryable"
    assert "finish_reason" in failed.error.message
    assert not failed.message.replayable


async def test_error_chunk_inside_a_200_stream(
    streaming: OpenAIProvider, openai_fake: OpenAIFake
) -> None:
    openai_fake.add(
        Reply(
            text="so far",
            stream_error={
                "error": {"message": "upstream model crashed", "type": "server_error", "code": None}
            },
        )
    )
    failed = await failure(streaming, req(UserMessage.text("x")))
    assert failed.error is not None and failed.error.kind == "retryable"
    assert "upstream model crashed" in failed.error.message
    assert failed.message.content == (TextBlock(text="so far"),)


async def test_raw_sse_unknown_fields_are_tolerated(
    streaming: OpenAIProvider, openai_fake: OpenAIFake
) -> None:
    base = {"id": "x1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    openai_fake.add(
        RawSSE(
            [
                {**base, "choices": [{"index": 0, "delta": {"content": "A", "weird": 1}}]},
                {
                    **base,
                    "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                    "extra_field": {"a": 1},
                },
                "[DONE]",
            ]
        )
    )
    message = await answer(streaming, req(UserMessage.text("x")))
    assert message.content == (TextBlock(text="A"),) and message.response_id == "x1"


async def test_unreachable_server_is_retryable() -> None:
    with OpenAIFake() as fake:
        base_url = fake.base_url
    p = OpenAIProvider(api_key="sk-x", base_url=base_url, model="m", timeout=5)
    try:
        failed = await failure(p, req(UserMessage.text("x")))
    finally:
        await p.aclose()
    assert failed.error is not None and failed.error.kind == "retryable"


async def test_read_timeout_is_retryable(openai_fake: OpenAIFake) -> None:
    openai_fake.add(Reply(text="slow", delay=1.0))
    p = OpenAIProvider(
        api_key=openai_fake.api_key, base_url=openai_fake.base_url, model="gpt-fake", timeout=0.3
    )
    try:
        failed = await failure(p, req(UserMessage.text("x")))
    finally:
        await p.aclose()
    assert failed.error is not None and failed.error.kind == "retryable"
