"""AnthropicProvider against the fake Messages server, over real HTTP."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from app.agent.messages import (
    AssistantMessage,
    Base64Source,
    ImageBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
    ToolResultMessage,
    UrlSource,
    Usage,
    UserMessage,
)
from app.agent.providers.anthropic import AnthropicProvider, build_messages, tool_input
from app.agent.providers.base import ProviderRequest, ToolSpec
from tests.fakes.anthropic_fake import (
    AnthropicFake,
    Error,
    RawSSE,
    Redacted,
    Reply,
    Text,
    Thinking,
    ToolUse,
    sign,
)

from ._drive import answer, attempt, failure

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\nfake-image-bytes").decode()
TOOLS = (ToolSpec("lookup", "Look a thing up.", {"type": "object", "properties": {}}),)


def make(
    fake: AnthropicFake,
    *,
    stream: bool = True,
    thinking: int | None = None,
    api_key: str | None = None,
    timeout: float = 10,
) -> AnthropicProvider:
    return AnthropicProvider(
        api_key=api_key or fake.api_key,
        base_url=fake.base_url,
        model="claude-fake",
        max_tokens=8192,
        timeout=timeout,
        thinking_budget=thinking,
        stream=stream,
    )


@pytest.fixture(params=[True, False], ids=["stream", "json"])
async def provider(
    request: pytest.FixtureRequest, anthropic_fake: AnthropicFake
) -> AsyncIterator[AnthropicProvider]:
    p = make(anthropic_fake, stream=request.param)
    yield p
    await p.aclose()


@pytest.fixture(params=[True, False], ids=["stream", "json"])
async def thinker(
    request: pytest.FixtureRequest, anthropic_fake: AnthropicFake
) -> AsyncIterator[AnthropicProvider]:
    p = make(anthropic_fake, stream=request.param, thinking=2048)
    yield p
    await p.aclose()


@pytest.fixture
async def streaming(anthropic_fake: AnthropicFake) -> AsyncIterator[AnthropicProvider]:
    p = make(anthropic_fake)
    yield p
    await p.aclose()


def req(
    *messages: UserMessage | AssistantMessage | ToolResultMessage,
    system: str = "Be brief.",
    tools: tuple[ToolSpec, ...] = TOOLS,
    max_tokens: int | None = None,
) -> ProviderRequest:
    return ProviderRequest(
        system_prompt=system,
        messages=messages,
        tools=tools,
        model="claude-fake",
        max_output_tokens=max_tokens,
    )


def result(call_id: str, text: str = "result", *, is_error: bool = False) -> ToolResultMessage:
    return ToolResultMessage(
        tool_call_id=call_id, tool_name="lookup", content=(TextBlock(text=text),), is_error=is_error
    )


# --- text and usage -----------------------------------------------------------------------


async def test_text_and_usage(provider: AnthropicProvider, anthropic_fake: AnthropicFake) -> None:
    anthropic_fake.add(
        Reply(
            [Text("Hello, wörld! 👋")],
            id="msg_01abc",
            input_tokens=30,
            output_tokens=6,
            cache_creation_input_tokens=1000,
            cache_read_input_tokens=2000,
        )
    )
    message = await answer(provider, req(UserMessage.text("hi")))
    assert message.content == (TextBlock(text="Hello, wörld! 👋"),)
    assert message.stop_reason == "end_turn"
    assert message.response_id == "msg_01abc"
    assert message.model == "claude-fake"
    # input_tokens counts the whole input: 30 uncached + 1000 written + 2000 read from cache
    assert message.usage == Usage(
        input_tokens=3030, output_tokens=6, cache_write_tokens=1000, cache_read_tokens=2000
    )
    sent = anthropic_fake.message_requests[-1]
    assert anthropic_fake.api_key in (
        sent.headers.get("x-api-key"),
        sent.headers.get("authorization", "")[len("Bearer ") :],
    )
    assert sent.headers["anthropic-version"]
    body = sent.json
    assert body["system"] == "Be brief."
    assert body["max_tokens"] == 8192
    assert "thinking" not in body
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert body["tools"] == [
        {
            "name": "lookup",
            "description": "Look a thing up.",
            "input_schema": {"type": "object", "properties": {}},
        }
    ]
    assert bool(body.get("stream")) is provider.stream_mode


async def test_no_system_and_max_output_tokens(
    provider: AnthropicProvider, anthropic_fake: AnthropicFake
) -> None:
    anthropic_fake.add(Reply([Text("ok")], stop_reason="max_tokens"))
    message = await answer(
        provider, req(UserMessage.text("hi"), system="", tools=(), max_tokens=100)
    )
    assert message.stop_reason == "max_tokens"
    body = anthropic_fake.message_requests[-1].json
    assert "system" not in body and "tools" not in body and body["max_tokens"] == 100


async def test_cumulative_usage_from_message_delta(
    streaming: AnthropicProvider, anthropic_fake: AnthropicFake
) -> None:
    anthropic_fake.add(
        RawSSE(
            [
                (
                    "message_start",
                    {
                        "type": "message_start",
                        "message": {
                            "id": "msg_1",
                            "type": "message",
                            "role": "assistant",
                            "model": "claude-x",
                            "content": [],
                            "stop_reason": None,
                            "stop_sequence": None,
                            "usage": {
                                "input_tokens": 40,
                                "output_tokens": 1,
                                "cache_read_input_tokens": 12,
                                "cache_creation_input_tokens": 3,
                            },
                        },
                    },
                ),
                (
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": 0,
                        "content_block": {"type": "text", "text": ""},
                    },
                ),
                (
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": 0,
                        "delta": {"type": "text_delta", "text": "hey"},
                    },
                ),
                ("content_block_stop", {"type": "content_block_stop", "index": 0}),
                (
                    "message_delta",
                    {
                        "type": "message_delta",
                        "delta": {"stop_reason": "end_turn"},
                        "usage": {"output_tokens": 17},
                    },
                ),
                ("message_stop", {"type": "message_stop"}),
            ]
        )
    )
    message = await answer(streaming, req(UserMessage.text("hi")))
    assert message.usage == Usage(
        input_tokens=40 + 12 + 3, output_tokens=17, cache_read_tokens=12, cache_write_tokens=3
    )
    assert message.model == "claude-x"


async def test_ping_and_unknown_events_are_ignored(
    streaming: AnthropicProvider, anthropic_fake: AnthropicFake
) -> None:
    anthropic_fake.add(Reply([Text("one"), Text("two")], unknown_event=True, ping=True))
    message = await answer(streaming, req(UserMessage.text("hi")))
    assert message.content == (TextBlock(text="one"), TextBlock(text="two"))


# --- thinking and tool calls --------------------------------------------------------------


async def test_thinking_redacted_and_tool_call_replayed_exactly(
    thinker: AnthropicProvider, anthropic_fake: AnthropicFake
) -> None:
    anthropic_fake.add(
        Reply(
            [
                Thinking("I should look it up.\nCarefully."),
                Redacted("UkVEQUNURUQ="),
                Text("Calling."),
                ToolUse("lookup", {"b": 2, "a": [1, "é"]}, id="toolu_01"),
            ]
        ),
        Reply([Thinking("Got it."), Text("Done.")]),
    )
    prompt = UserMessage.text("find it")
    first = await answer(thinker, req(prompt))
    args = (
        '{"b": 2, "a": [1, "\\u00e9"]}' if thinker.stream_mode else '{"b":2,"a":[1,"é"]}'
    )  # streamed verbatim / compact JSON of the input
    assert first.content == (
        ThinkingBlock(
            thinking="I should look it up.\nCarefully.",
            signature=sign("I should look it up.\nCarefully."),
        ),
        RedactedThinkingBlock(data="UkVEQUNURUQ="),
        TextBlock(text="Calling."),
        ToolCallBlock(id="toolu_01", name="lookup", arguments=args),
    )
    assert first.stop_reason == "tool_use"
    assert anthropic_fake.message_requests[-1].json["thinking"] == {
        "type": "enabled",
        "budget_tokens": 2048,
    }

    second = await answer(
        thinker, req(prompt, first, result("toolu_01", "42"), UserMessage.text("thanks"))
    )
    assert second.content[-1] == TextBlock(text="Done.")
    sent = anthropic_fake.message_requests[-1].json["messages"]
    assert sent[1] == {
        "role": "assistant",
        "content": [
            {
                "type": "thinking",
                "thinking": "I should look it up.\nCarefully.",
                "signature": sign("I should look it up.\nCarefully."),
            },
            {"type": "redacted_thinking", "data": "UkVEQUNURUQ="},
            {"type": "text", "text": "Calling."},
            {
                "type": "tool_use",
                "id": "toolu_01",
                "name": "lookup",
                "input": {"b": 2, "a": [1, "é"]},
            },
        ],
    }
    # the tool result and the next prompt share ONE user turn, results first
    assert sent[2] == {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_01",
                "content": [{"type": "text", "text": "42"}],
            },
            {"type": "text", "text": "thanks"},
        ],
    }


async def test_empty_thinking_with_only_a_signature(
    thinker: AnthropicProvider, anthropic_fake: AnthropicFake
) -> None:
    anthropic_fake.add(
        Reply([Thinking(""), ToolUse("lookup", {"q": 1}, id="toolu_e")]), Reply([Text("ok")])
    )
    first = await answer(thinker, req(UserMessage.text("x")))
    assert first.content[0] == ThinkingBlock(thinking="", signature=sign(""))
    await answer(thinker, req(UserMessage.text("x"), first, result("toolu_e")))
    sent = anthropic_fake.message_requests[-1].json["messages"][1]["content"][0]
    assert sent == {"type": "thinking", "thinking": "", "signature": sign("")}


async def test_batch_results_go_in_one_user_message(
    provider: AnthropicProvider, anthropic_fake: AnthropicFake
) -> None:
    anthropic_fake.add(
        Reply(
            [ToolUse("lookup", {"n": 1}, id="toolu_a"), ToolUse("lookup", {"n": 2}, id="toolu_b")]
        ),
        Reply([Text("both done")]),
    )
    summary = UserMessage.text("<summary>Earlier we talked.</summary>")
    prompt = UserMessage.text("run both")
    first = await answer(provider, req(summary, prompt))
    assert [c.id for c in first.tool_calls] == ["toolu_a", "toolu_b"]
    await answer(
        provider,
        req(
            summary,
            prompt,
            first,
            result("toolu_a", "one"),
            result("toolu_b", "failed", is_error=True),
        ),
    )
    sent = anthropic_fake.message_requests[-1].json["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[0]["content"] == [
        {"type": "text", "text": "<summary>Earlier we talked.</summary>"},
        {"type": "text", "text": "run both"},
    ]
    assert sent[2]["content"] == [
        {
            "type": "tool_result",
            "tool_use_id": "toolu_a",
            "content": [{"type": "text", "text": "one"}],
        },
        {
            "type": "tool_result",
            "tool_use_id": "toolu_b",
            "content": [{"type": "text", "text": "failed"}],
            "is_error": True,
        },
    ]


async def test_tool_call_without_input_deltas(
    streaming: AnthropicProvider, anthropic_fake: AnthropicFake
) -> None:
    anthropic_fake.add(
        Reply([ToolUse("lookup", partial_json="", id="toolu_0")]), Reply([Text("ok")])
    )
    first = await answer(streaming, req(UserMessage.text("x")))
    assert first.tool_calls == (ToolCallBlock(id="toolu_0", name="lookup", arguments="{}"),)
    await answer(streaming, req(UserMessage.text("x"), first, result("toolu_0")))
    assert anthropic_fake.message_requests[-1].json["messages"][1]["content"][0]["input"] == {}


@pytest.mark.parametrize("raw", ['{"q": "cut at max_tok', "[1, 2]", "", "null"])
async def test_arguments_that_are_not_a_json_object_are_sent_as_empty_input(
    provider: AnthropicProvider, anthropic_fake: AnthropicFake, raw: str
) -> None:
    # e.g. a call cut by max_tokens, or one issued by another provider
    anthropic_fake.add(Reply([Text("ok")]))
    call = AssistantMessage(
        content=(ToolCallBlock(id="call_1", name="lookup", arguments=raw),),
        stop_reason="max_tokens",
    )
    await answer(provider, req(UserMessage.text("x"), call, result("call_1", "bad args")))
    sent = anthropic_fake.message_requests[-1].json["messages"][1]["content"]
    assert sent == [{"type": "tool_use", "id": "call_1", "name": "lookup", "input": {}}]
    assert tool_input(raw) == {}


async def test_streamed_invalid_json_arguments_are_kept_verbatim(
    streaming: AnthropicProvider, anthropic_fake: AnthropicFake
) -> None:
    anthropic_fake.add(
        Reply(
            [ToolUse("lookup", partial_json='{"q": "cut her', id="toolu_c")],
            stop_reason="max_tokens",
        )
    )
    message = await answer(streaming, req(UserMessage.text("x")))
    assert message.stop_reason == "max_tokens"
    assert message.tool_calls[0].arguments == '{"q": "cut her'


async def test_foreign_ids_and_unsigned_thinking(
    provider: AnthropicProvider, anthropic_fake: AnthropicFake
) -> None:
    anthropic_fake.add(Reply([Text("ok")]))
    foreign = AssistantMessage(
        content=(
            ThinkingBlock(thinking="unsigned reasoning from a local model", signature=""),
            TextBlock(text="  "),
            ToolCallBlock(id="call:abc.1", name="lookup", arguments='{"x":1}'),
        ),
        provider="openai",
    )
    await answer(provider, req(UserMessage.text("x"), foreign, result("call:abc.1")))
    sent = anthropic_fake.message_requests[-1].json["messages"]
    assert sent[1]["content"] == [
        {"type": "tool_use", "id": "call_abc_1", "name": "lookup", "input": {"x": 1}}
    ]
    assert sent[2]["content"][0]["tool_use_id"] == "call_abc_1"


async def test_empty_text_blocks_and_empty_turns_are_dropped(
    provider: AnthropicProvider, anthropic_fake: AnthropicFake
) -> None:
    anthropic_fake.add(Reply([Text("ok")]))
    await answer(
        provider,
        req(
            UserMessage(content=(TextBlock(text=""), TextBlock(text="hello"))),
            AssistantMessage(content=(TextBlock(text=""),)),
            UserMessage.text("again"),
        ),
    )
    assert anthropic_fake.message_requests[-1].json["messages"] == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "hello"}, {"type": "text", "text": "again"}],
        }
    ]


# --- the fake refuses what the real API refuses -------------------------------------------


async def test_fake_refuses_changed_or_missing_thinking(anthropic_fake: AnthropicFake) -> None:
    p = make(anthropic_fake, thinking=2048)
    try:
        anthropic_fake.add(Reply([Thinking("plan"), ToolUse("lookup", {"q": 1}, id="toolu_t")]))
        first = await answer(p, req(UserMessage.text("x")))
        thinking = first.content[0]
        assert isinstance(thinking, ThinkingBlock)

        def variant(*blocks: object) -> AssistantMessage:
            return first.model_copy(update={"content": blocks})

        changed_sig = variant(
            thinking.model_copy(update={"signature": sign("other")}), *first.content[1:]
        )
        changed_text = variant(
            thinking.model_copy(update={"thinking": "plan!"}), *first.content[1:]
        )
        missing = variant(*first.content[1:])
        expected = {
            "changed signature": (changed_sig, "Invalid `signature` in `thinking` block"),
            "changed text": (changed_text, "Invalid `signature` in `thinking` block"),
        }
        for label, (message, text) in expected.items():
            failed = await failure(p, req(UserMessage.text("x"), message, result("toolu_t")))
            assert failed.error is not None, label
            assert failed.error.kind == "fatal" and failed.error.status == 400, label
            assert text in failed.error.message, label
        # The fake refuses a tool loop whose assistant turn lost its thinking...
        body = {
            "model": "claude-fake",
            "max_tokens": 4096,
            "thinking": {"type": "enabled", "budget_tokens": 2048},
            "messages": build_messages((UserMessage.text("x"), missing, result("toolu_t"))),
        }
        async with httpx.AsyncClient() as http:
            refused = await http.post(
                f"{anthropic_fake.base_url}/v1/messages",
                json=body,
                headers={"x-api-key": anthropic_fake.api_key, "anthropic-version": "2023-06-01"},
            )
        assert refused.status_code == 400
        assert "Expected `thinking` or `redacted_thinking`, but found" in refused.text
        # ... so the provider sends such a request without thinking (one thinking
        # configuration per tool loop), and it is accepted
        anthropic_fake.add(Reply([Text("ok")]))
        await answer(p, req(UserMessage.text("x"), missing, result("toolu_t")))
        assert "thinking" not in anthropic_fake.message_requests[-1].json
    finally:
        await p.aclose()


async def test_fake_refuses_changed_tool_input_and_orphans(
    provider: AnthropicProvider, anthropic_fake: AnthropicFake
) -> None:
    anthropic_fake.add(Reply([ToolUse("lookup", {"b": 1, "a": 2}, id="toolu_k")]))
    first = await answer(provider, req(UserMessage.text("x")))
    call = first.tool_calls[0]
    reordered = first.model_copy(
        update={"content": (call.model_copy(update={"arguments": '{"a": 2, "b": 1}'}),)}
    )
    failed = await failure(provider, req(UserMessage.text("x"), reordered, result("toolu_k")))
    assert failed.error is not None and "does not replay tool_use" in failed.error.message

    failed = await failure(provider, req(UserMessage.text("x"), first, UserMessage.text("y")))
    assert failed.error is not None and failed.error.kind == "fatal"
    assert (
        "`tool_use` ids were found without `tool_result` blocks immediately after: toolu_k"
        in failed.error.message
    )

    failed = await failure(provider, req(UserMessage.text("x"), result("toolu_zz")))
    assert failed.error is not None and "unexpected `tool_use_id`" in failed.error.message


def test_fake_rule_empty_text_blocks() -> None:
    fake = AnthropicFake()
    block: dict[str, Any] = {"type": "text", "text": ""}
    body = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": [block]}]}
    with pytest.raises(Exception, match="text content blocks must be non-empty"):
        fake.validate(body)
    block["text"] = " \n"
    with pytest.raises(Exception, match="non-whitespace text"):
        fake.validate(body)


# --- images -------------------------------------------------------------------------------


async def test_images(provider: AnthropicProvider, anthropic_fake: AnthropicFake) -> None:
    anthropic_fake.add(Reply([ToolUse("shot", {}, id="toolu_img")]), Reply([Text("a cat")]))
    prompt = UserMessage(
        content=(
            TextBlock(text="What is this?"),
            ImageBlock(source=Base64Source(media_type="image/png", data=PNG)),
            ImageBlock(source=UrlSource(url="https://example.com/cat.jpg")),
            ImageBlock(source=UrlSource(url=f"data:image/png;base64,{PNG}")),
        )
    )
    first = await answer(provider, req(prompt))
    png = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
    assert anthropic_fake.message_requests[-1].json["messages"][0]["content"] == [
        {"type": "text", "text": "What is this?"},
        png,
        {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
        png,
    ]
    shot = ToolResultMessage(
        tool_call_id="toolu_img",
        tool_name="shot",
        content=(
            TextBlock(text="screenshot:"),
            ImageBlock(source=Base64Source(media_type="image/png", data=PNG)),
        ),
    )
    await answer(provider, req(prompt, first, shot))
    assert anthropic_fake.message_requests[-1].json["messages"][2]["content"] == [
        {
            "type": "tool_result",
            "tool_use_id": "toolu_img",
            "content": [{"type": "text", "text": "screenshot:"}, png],
        }
    ]


# --- errors -------------------------------------------------------------------------------


async def test_overflow_http_400(
    provider: AnthropicProvider, anthropic_fake: AnthropicFake
) -> None:
    anthropic_fake.add(Error.overflow())
    failed = await failure(provider, req(UserMessage.text("x")))
    assert failed.error is not None and failed.error.kind == "overflow"
    assert failed.error.status == 400 and failed.error.code == "invalid_request_error"


async def test_overflow_stop_reason(
    provider: AnthropicProvider, anthropic_fake: AnthropicFake
) -> None:
    anthropic_fake.add(Reply([Text("partial")], stop_reason="model_context_window_exceeded"))
    failed = await failure(provider, req(UserMessage.text("x")))
    assert failed.error is not None and failed.error.kind == "overflow"
    assert not failed.message.replayable


async def test_rate_limit_retry_after(
    provider: AnthropicProvider, anthropic_fake: AnthropicFake
) -> None:
    anthropic_fake.add(Error.rate_limit("3"), Error.rate_limit(None))
    failed = await failure(provider, req(UserMessage.text("x")))
    assert failed.error is not None
    assert (failed.error.kind, failed.error.status, failed.error.retry_after) == (
        "retryable",
        429,
        3.0,
    )
    failed = await failure(provider, req(UserMessage.text("x")))
    assert failed.error is not None and failed.error.retry_after is None


@pytest.mark.parametrize(
    "error",
    [Error.overloaded(), Error.api_error(500), Error.api_error(503)],
    ids=["529", "500", "503"],
)
async def test_overload_and_5xx_are_retryable(
    provider: AnthropicProvider, anthropic_fake: AnthropicFake, error: Error
) -> None:
    anthropic_fake.add(error, error, Reply([Text("back")]))
    for _ in range(2):
        failed = await failure(provider, req(UserMessage.text("x")))
        assert failed.error is not None
        assert failed.error.kind == "retryable" and failed.error.status == error.status
        assert failed.error.code == error.type
    assert (await answer(provider, req(UserMessage.text("x")))).content == (TextBlock(text="back"),)


@pytest.mark.parametrize(
    ("status", "kind"),
    [(403, "permission_error"), (404, "not_found_error"), (400, "invalid_request_error")],
)
async def test_client_errors_are_fatal(
    provider: AnthropicProvider, anthropic_fake: AnthropicFake, status: int, kind: str
) -> None:
    anthropic_fake.add(Error(status, kind, "nope"))
    failed = await failure(provider, req(UserMessage.text("x")))
    assert failed.error is not None
    assert (failed.error.kind, failed.error.status) == ("fatal", status)


async def test_bad_key_is_fatal_and_never_echoed(anthropic_fake: AnthropicFake) -> None:
    key = "sk-ant-api03-SECRETabcdefghijklmnop"
    p = make(anthropic_fake, api_key=key)
    try:
        failed = await failure(p, req(UserMessage.text("x")))
    finally:
        await p.aclose()
    assert failed.error is not None
    assert (failed.error.kind, failed.error.status) == ("fatal", 401)
    assert "SECRET" not in failed.error.message and key not in failed.error.message
    assert "authentication_error" in failed.error.message


async def test_error_event_after_200(
    streaming: AnthropicProvider, anthropic_fake: AnthropicFake
) -> None:
    anthropic_fake.add(
        Reply([Text("half an answer")], error_event=("overloaded_error", "Overloaded"))
    )
    failed = await failure(streaming, req(UserMessage.text("x")))
    assert failed.error is not None
    assert (failed.error.kind, failed.error.code) == ("retryable", "overloaded_error")
    assert failed.message.content == (TextBlock(text="half an answer"),)
    assert failed.message.stop_reason == "error"


@pytest.mark.parametrize(
    ("error_type", "message", "kind"),
    [
        ("api_error", "Internal server error", "retryable"),
        ("invalid_request_error", "prompt is too long: 200001 tokens > 200000 maximum", "overflow"),
        ("invalid_request_error", "something else", "fatal"),
        ("brand_new_error", "?", "retryable"),
    ],
)
async def test_error_event_classification(
    streaming: AnthropicProvider,
    anthropic_fake: AnthropicFake,
    error_type: str,
    message: str,
    kind: str,
) -> None:
    anthropic_fake.add(Reply([Text("x")], error_event=(error_type, message), error_after=1))
    failed = await failure(streaming, req(UserMessage.text("x")))
    assert failed.error is not None and failed.error.kind == kind


async def test_cut_stream_is_retryable(
    streaming: AnthropicProvider, anthropic_fake: AnthropicFake
) -> None:
    anthropic_fake.add(Reply([Text("a long answer")], chunk_size=2, cut_after=5))
    failed = await failure(streaming, req(UserMessage.text("x")))
    assert failed.error is not None and failed.error.kind == "retryable"
    assert failed.message.stop_reason == "error"
    assert failed.message.content == (TextBlock(text="a lo"),)


async def test_stream_ending_before_the_signature_is_retryable(
    anthropic_fake: AnthropicFake,
) -> None:
    p = make(anthropic_fake, thinking=2048)
    try:
        anthropic_fake.add(
            Reply([Thinking("deep thought", stream_signature=False), Text("answer")], end_after=6)
        )
        result_ = await attempt(p, req(UserMessage.text("x")))
    finally:
        await p.aclose()
    assert result_.error is not None and result_.error.kind == "retryable"
    assert "message_stop" in result_.error.message
    assert not result_.message.replayable
    assert result_.message.content[0] == ThinkingBlock(thinking="deep thought", signature="")


async def test_unreachable_server_is_retryable() -> None:
    with AnthropicFake() as fake:
        base_url = fake.base_url
    p = AnthropicProvider(api_key="sk-ant-x", base_url=base_url, model="m", timeout=5)
    try:
        failed = await failure(p, req(UserMessage.text("x")))
    finally:
        await p.aclose()
    assert failed.error is not None and failed.error.kind == "retryable"


async def test_read_timeout_is_retryable(anthropic_fake: AnthropicFake) -> None:
    anthropic_fake.add(Reply([Text("slow")], delay=1.0))
    p = make(anthropic_fake, timeout=0.3)
    try:
        failed = await failure(p, req(UserMessage.text("x")))
    finally:
        await p.aclose()
    assert failed.error is not None and failed.error.kind == "retryable"


def test_build_messages_merges_user_side_turns() -> None:
    call = AssistantMessage(content=(ToolCallBlock(id="t1", name="lookup", arguments="{}"),))
    turns = build_messages(
        (UserMessage.text("a"), UserMessage.text("b"), call, result("t1"), UserMessage.text("c"))
    )
    assert [t["role"] for t in turns] == ["user", "assistant", "user"]
    assert [b["type"] for b in turns[2]["content"]] == ["tool_result", "text"]
