"""contract §1 — the lossless JSON codec.

Round trips (dump → JSON text → load gives back an equal value, and the same JSON), empty
strings kept as present keys, raw tool-call arguments byte for byte, big images; and refusals:
everything the codec does not know raises :class:`CodecError` whose ``path`` names the exact
element.
"""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from app.agent.codec import (
    CodecError,
    dump_context,
    dump_message,
    dump_messages,
    dumps_context,
    dumps_message,
    load_context,
    load_message,
    load_messages,
    loads_context,
    loads_message,
)
from app.agent.messages import (
    AssistantMessage,
    AttemptError,
    Base64Source,
    Context,
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

from . import strategies as s

# --- helpers ------------------------------------------------------------------------------------


def _canonical(value: Any) -> str:
    """JSON text that tells ``1`` from ``1.0`` and ``True`` (``==`` does not)."""
    return json.dumps(value, sort_keys=True, ensure_ascii=True)


def _through_json(data: Any, *, ensure_ascii: bool) -> Any:
    return json.loads(json.dumps(data, ensure_ascii=ensure_ascii))


def assert_message_round_trip(message: Any) -> None:
    data = dump_message(message)
    for ensure_ascii in (False, True):
        back = load_message(_through_json(data, ensure_ascii=ensure_ascii))
        assert back == message
        assert type(back) is type(message)
        assert _canonical(dump_message(back)) == _canonical(data)
    assert loads_message(dumps_message(message)) == message


#: the fields left out of a dump when they hold None (a tool call's server, when it has none)
LEFT_OUT_WHEN_NONE = {"server_label"}


def assert_full_keys(model: BaseModel, data: Any) -> None:
    """Every field of every (nested) model is present in its dump, defaults and "" included
    (but a ``server_label`` that is None, which is left out)."""
    assert isinstance(data, dict)
    fields = {
        name
        for name in type(model).model_fields
        if not (name in LEFT_OUT_WHEN_NONE and getattr(model, name) is None)
    }
    assert set(data) == fields, type(model).__name__
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            assert_full_keys(value, data[name])
        elif isinstance(value, tuple):
            assert isinstance(data[name], list)
            assert len(data[name]) == len(value)
            for item, item_data in zip(value, data[name], strict=True):
                if isinstance(item, BaseModel):
                    assert_full_keys(item, item_data)
        elif isinstance(value, str):
            assert data[name] == value  # "" stays "", never null or missing


def user_with(*blocks: Any) -> UserMessage:
    return UserMessage(content=tuple(blocks))


def assistant_with(*blocks: Any) -> AssistantMessage:
    return AssistantMessage(content=tuple(blocks))


# --- round trips: one block type at a time --------------------------------------------------


@given(s.text_blocks())
def test_text_block_round_trips(block: TextBlock) -> None:
    assert_message_round_trip(user_with(block))
    assert_message_round_trip(assistant_with(block))


@given(s.image_blocks())
def test_image_block_round_trips_in_user_and_tool_result(block: ImageBlock) -> None:
    assert_message_round_trip(user_with(block))
    assert_message_round_trip(
        ToolResultMessage(tool_call_id="c1", tool_name="shot", content=(block,))
    )


@given(s.url_sources())
def test_url_source_keeps_the_exact_url(source: UrlSource) -> None:
    message = user_with(ImageBlock(source=source))
    data = _through_json(dump_message(message), ensure_ascii=False)
    assert data["content"][0]["source"] == {"type": "url", "url": source.url}
    back = load_message(data)
    assert back.content[0].source.url == source.url


@given(s.image_bytes(), st.sampled_from(s.MEDIA_TYPES))
def test_base64_image_bytes_round_trip(raw: bytes, media_type: str) -> None:
    source = Base64Source(media_type=media_type, data=base64.b64encode(raw).decode())
    assert source.decoded_size() == len(raw)
    back = loads_message(dumps_message(user_with(ImageBlock(source=source))))
    assert base64.b64decode(back.content[0].source.data, validate=True) == raw
    assert back.content[0].source.media_type == media_type


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(s.image_bytes(large=True))
def test_big_base64_images_round_trip(raw: bytes) -> None:
    assert len(raw) >= s.LARGE_IMAGE_BYTES - 3
    data = base64.b64encode(raw).decode()
    block = ImageBlock(source=Base64Source(media_type="image/png", data=data))
    context = Context(
        messages=(
            user_with(TextBlock(text="look"), block),
            ToolResultMessage(tool_call_id="c", tool_name="screenshot", content=(block,)),
        )
    )
    back = loads_context(dumps_context(context))
    assert back == context
    for message in back.messages:
        image = message.content[-1]
        assert image.source.data == data
        assert base64.b64decode(image.source.data) == raw
        assert image.source.decoded_size() == len(raw)


@given(s.thinking_blocks())
def test_thinking_block_round_trips_including_empty_strings(block: ThinkingBlock) -> None:
    message = assistant_with(block)
    assert_message_round_trip(message)
    data = _through_json(dump_message(message), ensure_ascii=False)
    assert data["content"][0] == {
        "type": "thinking",
        "thinking": block.thinking,
        "signature": block.signature,
    }


@given(s.redacted_thinking_blocks())
def test_redacted_thinking_block_round_trips(block: RedactedThinkingBlock) -> None:
    assert_message_round_trip(assistant_with(block))


@given(s.tool_call_blocks())
def test_tool_call_block_round_trips(block: ToolCallBlock) -> None:
    assert_message_round_trip(assistant_with(block))


@given(s.raw_arguments())
def test_raw_arguments_survive_byte_for_byte(arguments: str) -> None:
    call = ToolCallBlock(id="call_1", name="lookup", arguments=arguments)
    context = Context(messages=(assistant_with(call),))
    text = dumps_context(context)
    # the JSON carries the raw string itself, not a re-serialized object
    assert json.loads(text)["messages"][0]["content"][0]["arguments"] == arguments
    back = loads_context(text).messages[0].content[0]
    assert back.arguments.encode("utf-8") == arguments.encode("utf-8")
    # and it survives a second trip through bytes
    again = loads_context(dumps_context(loads_context(text)).encode("utf-8"))
    assert again.messages[0].content[0].arguments == arguments


@pytest.mark.parametrize(
    "arguments",
    [
        "",
        " ",
        '{"a":1}',
        '{ "a" : 1 }',
        '{"a": 1.0}',
        '{"a": 1e2}',
        '{"b":1,"a":2}',
        '{"a": "\\u00e9"}',
        '{"a": "é"}',
        '{"a":',
        "{'a': 1}",
        "null",
        "[]",
        "\x00",
        '{"a": 1}\n',
        "\U0001f600",
    ],
)
def test_raw_arguments_examples_are_not_normalized(arguments: str) -> None:
    message = assistant_with(ToolCallBlock(id="x", name="y", arguments=arguments))
    assert loads_message(dumps_message(message)).content[0].arguments == arguments
    assert_message_round_trip(message)


# --- round trips: messages and contexts -----------------------------------------------------------


@given(s.user_messages())
def test_user_messages_round_trip(message: UserMessage) -> None:
    assert_message_round_trip(message)


@s.HEAVY
@given(s.assistant_messages())
def test_assistant_messages_round_trip_with_all_metadata(message: AssistantMessage) -> None:
    assert_message_round_trip(message)
    data = _through_json(dump_message(message), ensure_ascii=False)
    assert data["provider_data"] == message.provider_data
    assert _canonical(data["provider_data"]) == _canonical(message.provider_data)
    assert data["usage"] == message.usage.model_dump()
    assert data["error"] == (None if message.error is None else message.error.model_dump())


@given(s.tool_result_messages())
def test_tool_result_messages_round_trip(message: ToolResultMessage) -> None:
    assert_message_round_trip(message)


@given(s.messages())
def test_any_message_dump_has_every_field(message: Any) -> None:
    assert_full_keys(message, _through_json(dump_message(message), ensure_ascii=False))


@s.HEAVY
@given(s.contexts())
def test_contexts_round_trip_through_json(context: Context) -> None:
    data = dump_context(context)
    for ensure_ascii in (False, True):
        back = load_context(_through_json(data, ensure_ascii=ensure_ascii))
        assert back == context
        assert _canonical(dump_context(back)) == _canonical(data)
    assert_full_keys(context, data)


@s.HEAVY
@given(s.contexts())
def test_dumps_loads_context_round_trip(context: Context) -> None:
    text = dumps_context(context)
    assert loads_context(text) == context
    assert loads_context(text.encode("utf-8")) == context
    assert dumps_context(loads_context(text)) == text


@s.HEAVY
@given(st.lists(s.messages(), max_size=5))
def test_message_lists_round_trip(messages: list[Any]) -> None:
    data = _through_json(dump_messages(messages), ensure_ascii=False)
    assert load_messages(data) == tuple(messages)


@s.HEAVY
@given(s.replayable_contexts())
def test_replayable_contexts_round_trip(context: Context) -> None:
    assert loads_context(dumps_context(context)) == context


def test_empty_strings_stay_present_empty_strings() -> None:
    context = Context(
        messages=(
            UserMessage(content=(TextBlock(text=""),)),
            AssistantMessage(
                content=(
                    ThinkingBlock(thinking="", signature=""),
                    RedactedThinkingBlock(data=""),
                    TextBlock(text=""),
                    ToolCallBlock(id="c", name="n", arguments=""),
                )
            ),
            ToolResultMessage(tool_call_id="c", tool_name="n", content=(TextBlock(text=""),)),
        )
    )
    data = json.loads(dumps_context(context))
    assert data["system_prompt"] == ""
    assert data["summary"] == ""
    user, assistant, result = data["messages"]
    assert user["content"] == [{"type": "text", "text": ""}]
    assert assistant["content"] == [
        {"type": "thinking", "thinking": "", "signature": ""},
        {"type": "redacted_thinking", "data": ""},
        {"type": "text", "text": ""},
        {"type": "tool_call", "id": "c", "name": "n", "arguments": ""},
    ]
    for key in ("provider", "model", "response_id"):
        assert assistant[key] == ""
    assert assistant["provider_data"] == {}
    assert assistant["error"] is None
    assert result["content"] == [{"type": "text", "text": ""}]
    assert result["is_error"] is False
    assert loads_context(json.dumps(data)) == context


@pytest.mark.parametrize("text", ["\x00", "a\x00b", "\U0001f600", "\U0010ffff", "\u2028"])
def test_nul_and_astral_characters_are_carried(text: str) -> None:
    context = Context(system_prompt=text, summary=text, messages=(UserMessage.text(text),))
    encoded = dumps_context(context)
    if text == "\x00" or "\x00" in text:
        assert "\\u0000" in encoded  # JSON escapes NUL; it still comes back
    assert loads_context(encoded) == context
    assert loads_context(json.dumps(dump_context(context), ensure_ascii=True)) == context


def test_thinking_order_is_kept() -> None:
    blocks = (
        ThinkingBlock(thinking="first", signature="s1"),
        TextBlock(text="t"),
        RedactedThinkingBlock(data="r"),
        ThinkingBlock(thinking="", signature="s2"),
        ToolCallBlock(id="a", name="n", arguments="{}"),
        ThinkingBlock(thinking="last", signature=""),
    )
    back = loads_message(dumps_message(assistant_with(*blocks)))
    assert back.content == blocks


def test_assistant_metadata_example() -> None:
    message = AssistantMessage(
        content=(TextBlock(text="hi"),),
        provider="openai",
        model="gpt-x",
        response_id="resp_1",
        stop_reason="max_tokens",
        usage=Usage(input_tokens=10, output_tokens=2, cache_read_tokens=3, cache_write_tokens=4),
        provider_data={
            "reasoning": [
                {
                    "id": "rs_1",
                    "encrypted_content": "gAAA",
                    "n": None,
                    "f": 1.5,
                    "i": 2**64,
                    "b": False,
                    "l": [[], {}],
                }
            ]
        },
        error=AttemptError(kind="fatal", message="boom", status=400, code="bad"),
    )
    assert_message_round_trip(message)
    data = json.loads(dumps_message(message))
    assert data["provider_data"]["reasoning"][0]["i"] == 2**64
    assert isinstance(data["provider_data"]["reasoning"][0]["f"], float)


# --- refusals -------------------------------------------------------------------------------------

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()


def _valid_context_data() -> dict[str, Any]:
    """Three messages, each with at least two content blocks, as plain JSON."""
    return dump_context(
        Context(
            messages=(
                UserMessage(
                    content=(
                        ImageBlock(source=Base64Source(media_type="image/png", data=PNG)),
                        TextBlock(text="what is this?"),
                    )
                ),
                AssistantMessage(
                    content=(
                        ThinkingBlock(thinking="hm", signature="sig"),
                        ToolCallBlock(id="c1", name="look", arguments="{}"),
                    )
                ),
                ToolResultMessage(
                    tool_call_id="c1",
                    tool_name="look",
                    content=(
                        TextBlock(text="a cat"),
                        ImageBlock(source=UrlSource(url="https://example.com/cat.png")),
                    ),
                ),
            )
        )
    )


def _set(data: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    target: Any = data
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value


def _delete(data: dict[str, Any], path: tuple[Any, ...]) -> None:
    target: Any = data
    for part in path[:-1]:
        target = target[part]
    del target[path[-1]]


_DELETE = object()

REFUSALS: list[tuple[str, tuple[Any, ...], Any, str]] = [
    # unknown / missing type tags
    ("unknown message type", ("messages", 2, "type"), "system", "messages[2].type"),
    (
        "unknown block type",
        ("messages", 2, "content", 1, "type"),
        "video",
        "messages[2].content[1].type",
    ),
    (
        "block type of another message",
        ("messages", 0, "content", 1, "type"),
        "thinking",
        "messages[0].content[1].type",
    ),
    (
        "tool_call in a tool_result",
        ("messages", 2, "content", 0, "type"),
        "tool_call",
        "messages[2].content[0].type",
    ),
    (
        "unknown image source type",
        ("messages", 0, "content", 0, "source", "type"),
        "file",
        "messages[0].content[0].source.type",
    ),
    ("missing message type", ("messages", 1, "type"), _DELETE, "messages[1].type"),
    (
        "missing block type",
        ("messages", 1, "content", 1, "type"),
        _DELETE,
        "messages[1].content[1].type",
    ),
    (
        "missing source type",
        ("messages", 2, "content", 1, "source", "type"),
        _DELETE,
        "messages[2].content[1].source.type",
    ),
    ("non-string type", ("messages", 1, "type"), 3, "messages[1].type"),
    # extra unknown fields
    ("extra context field", ("metadata",), {}, "metadata"),
    ("extra message field", ("messages", 0, "name"), "bob", "messages[0].name"),
    (
        "extra block field",
        ("messages", 1, "content", 1, "input"),
        {},
        "messages[1].content[1].input",
    ),
    (
        "extra source field",
        ("messages", 0, "content", 0, "source", "detail"),
        "high",
        "messages[0].content[0].source.detail",
    ),
    (
        "extra usage field",
        ("messages", 1, "usage", "reasoning_tokens"),
        1,
        "messages[1].usage.reasoning_tokens",
    ),
    (
        "extra error field",
        ("messages", 1, "error"),
        {"kind": "fatal", "message": "m", "x": 1},
        "messages[1].error.x",
    ),
    # invalid base64
    (
        "invalid base64",
        ("messages", 0, "content", 0, "source", "data"),
        "not base64!",
        "messages[0].content[0].source.data",
    ),
    (
        "base64 without padding",
        ("messages", 0, "content", 0, "source", "data"),
        "QQ",
        "messages[0].content[0].source.data",
    ),
    (
        "base64 with a newline",
        ("messages", 0, "content", 0, "source", "data"),
        PNG + "\n",
        "messages[0].content[0].source.data",
    ),
    # wrong field types and values
    ("system_prompt null", ("system_prompt",), None, "system_prompt"),
    ("summary number", ("summary",), 1, "summary"),
    ("messages not a list", ("messages",), {"0": {}}, "messages"),
    ("message not an object", ("messages", 1), "hi", "messages[1]"),
    ("content a string", ("messages", 0, "content"), "hi", "messages[0].content"),
    ("block not an object", ("messages", 0, "content", 1), "hi", "messages[0].content[1]"),
    ("text a number", ("messages", 0, "content", 1, "text"), 5, "messages[0].content[1].text"),
    (
        "arguments an object",
        ("messages", 1, "content", 1, "arguments"),
        {"a": 1},
        "messages[1].content[1].arguments",
    ),
    (
        "missing arguments",
        ("messages", 1, "content", 1, "arguments"),
        _DELETE,
        "messages[1].content[1].arguments",
    ),
    ("empty tool call id", ("messages", 1, "content", 1, "id"), "", "messages[1].content[1].id"),
    (
        "signature null",
        ("messages", 1, "content", 0, "signature"),
        None,
        "messages[1].content[0].signature",
    ),
    (
        "thinking missing",
        ("messages", 1, "content", 0, "thinking"),
        _DELETE,
        "messages[1].content[0].thinking",
    ),
    ("unknown stop_reason", ("messages", 1, "stop_reason"), "length", "messages[1].stop_reason"),
    (
        "negative usage",
        ("messages", 1, "usage", "output_tokens"),
        -1,
        "messages[1].usage.output_tokens",
    ),
    (
        "fractional usage",
        ("messages", 1, "usage", "input_tokens"),
        1.5,
        "messages[1].usage.input_tokens",
    ),
    ("provider_data a list", ("messages", 1, "provider_data"), [], "messages[1].provider_data"),
    (
        "unknown error kind",
        ("messages", 1, "error"),
        {"kind": "oops", "message": "m"},
        "messages[1].error.kind",
    ),
    ("is_error a word", ("messages", 2, "is_error"), "maybe", "messages[2].is_error"),
    ("empty tool_call_id", ("messages", 2, "tool_call_id"), "", "messages[2].tool_call_id"),
    ("missing tool_name", ("messages", 2, "tool_name"), _DELETE, "messages[2].tool_name"),
    (
        "empty url",
        ("messages", 2, "content", 1, "source", "url"),
        "",
        "messages[2].content[1].source.url",
    ),
    (
        "empty media_type",
        ("messages", 0, "content", 0, "source", "media_type"),
        "",
        "messages[0].content[0].source.media_type",
    ),
    (
        "image without source",
        ("messages", 0, "content", 0, "source"),
        _DELETE,
        "messages[0].content[0].source",
    ),
]


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [r[1:] for r in REFUSALS],
    ids=[r[0] for r in REFUSALS],
)
def test_refusals_name_the_exact_path(path: tuple[Any, ...], value: Any, expected: str) -> None:
    data = _valid_context_data()
    load_context(copy.deepcopy(data))  # the unbroken document loads
    if value is _DELETE:
        _delete(data, path)
    else:
        _set(data, path, value)
    with pytest.raises(CodecError) as info:
        load_context(data)
    assert info.value.path == expected
    assert str(info.value).startswith(expected + ": ")
    # the same refusal through the text API
    with pytest.raises(CodecError) as info:
        loads_context(json.dumps(data))
    assert info.value.path == expected


def test_unknown_type_error_names_the_tag() -> None:
    data = _valid_context_data()
    data["messages"][2]["content"][1]["type"] = "video"
    with pytest.raises(CodecError) as info:
        load_context(data)
    assert "'video'" in info.value.message
    assert "text" in info.value.message and "image" in info.value.message


@s.HEAVY
@given(s.replayable_contexts(), st.data())
def test_any_unknown_block_type_is_refused_at_its_path(
    context: Context, data: st.DataObject
) -> None:
    with_blocks = [(i, m) for i, m in enumerate(context.messages) if m.content]
    if not with_blocks:
        return
    i, message = data.draw(st.sampled_from(with_blocks))
    j = data.draw(st.integers(min_value=0, max_value=len(message.content) - 1))
    bad_type = data.draw(
        s.texts().filter(
            lambda t: t not in {"text", "image", "thinking", "redacted_thinking", "tool_call"}
        )
    )
    doc = json.loads(dumps_context(context))
    doc["messages"][i]["content"][j]["type"] = bad_type
    with pytest.raises(CodecError) as info:
        loads_context(json.dumps(doc))
    assert info.value.path == f"messages[{i}].content[{j}].type"


@s.HEAVY
@given(s.replayable_contexts(), st.data())
def test_any_unknown_message_type_is_refused_at_its_index(
    context: Context, data: st.DataObject
) -> None:
    if not context.messages:
        return
    i = data.draw(st.integers(min_value=0, max_value=len(context.messages) - 1))
    doc = dump_context(context)
    doc["messages"][i]["type"] = data.draw(
        s.texts().filter(lambda t: t not in {"user", "assistant", "tool_result"})
    )
    with pytest.raises(CodecError) as info:
        load_context(doc)
    assert info.value.path == f"messages[{i}].type"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "not json",
        "{",
        '{"messages": [}',
        "{'a': 1}",
        "\x00",
        '{"a": 1} {"b": 2}',
        b"",
        b"{",
    ],
)
def test_not_json_is_a_codec_error(text: str | bytes) -> None:
    with pytest.raises(CodecError) as info:
        loads_context(text)
    assert info.value.path == ""
    assert "not JSON" in info.value.message
    with pytest.raises(CodecError):
        loads_message(text)


@pytest.mark.parametrize("text", ["[]", "null", "1", '"context"', "true"])
def test_json_that_is_not_an_object_is_a_codec_error(text: str) -> None:
    with pytest.raises(CodecError):
        loads_context(text)
    with pytest.raises(CodecError):
        loads_message(text)


def test_load_messages_paths_are_prefixed() -> None:
    data = _valid_context_data()["messages"]
    data[1]["content"][0]["type"] = "bogus"
    with pytest.raises(CodecError) as info:
        load_messages(data)
    assert info.value.path == "messages[1].content[0].type"


# --- defects found earlier, fixed: kept as regression tests ---------------------------------------


def test_load_message_path_has_no_union_tag() -> None:
    with pytest.raises(CodecError) as info:
        load_message({"type": "user", "content": [{"type": "bogus"}]})
    assert info.value.path == "content[0].type"


def test_undecodable_bytes_are_a_codec_error() -> None:
    with pytest.raises(CodecError):
        loads_context(b"\xff\xfe\x00")


def test_deeply_nested_json_is_a_codec_error() -> None:
    with pytest.raises(CodecError):
        loads_context("[" * 100_000)


def test_non_finite_numbers_are_refused() -> None:
    with pytest.raises(CodecError):
        loads_context('{"messages": [{"type": "assistant", "provider_data": {"x": NaN}}]}')


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("messages", 2, "is_error"), "true"),
        (("messages", 2, "is_error"), 1),
        (("messages", 1, "usage", "input_tokens"), "5"),
        (("messages", 1, "usage", "input_tokens"), 5.5),  # 5.0 is an integer (JSON Schema)
    ],
)
def test_wrong_json_types_are_not_coerced(path: tuple[Any, ...], value: Any) -> None:
    data = _valid_context_data()
    _set(data, path, value)
    with pytest.raises(CodecError):
        load_context(data)


def test_missing_type_message_lists_the_expected_tags() -> None:
    data = _valid_context_data()
    del data["messages"][1]["type"]
    with pytest.raises(CodecError) as info:
        load_context(data)
    assert "None" not in info.value.message
    assert "assistant" in info.value.message
