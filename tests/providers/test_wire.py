"""The providers' carried-over request encoding (app/agent/providers/wire.py).

A request body is built from each message's encoding, made once and extended as messages are
appended. These tests hold the encoding to its one rule: extended piece by piece, from any
earlier point, it is exactly what encoding the whole sequence at once gives, and that is the
request the providers' mappings describe (their own tests check the mapping itself).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from app.agent.messages import (
    AnyMessage,
    AssistantMessage,
    Base64Source,
    ImageBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
    ToolResultMessage,
    UserMessage,
)
from app.agent.providers import wire
from app.agent.providers.anthropic.request import MESSAGES, MessagesEncoded
from app.agent.providers.openai.request import CHAT, ChatEncoded
from app.agent.providers.wire import CHUNK, Body, splice

IMAGE = ImageBlock(source=Base64Source(media_type="image/png", data="iVBORw0KGgo="))


def _call(i: int) -> ToolCallBlock:
    return ToolCallBlock(id=f"call_{i}", name="lookup", arguments=f'{{"i": {i}}}')


def _message(kind: int, i: int) -> AnyMessage:
    """A message of one of the shapes the mappings treat apart (merging, images, reasoning)."""
    if kind == 0:
        return UserMessage.text(f"question {i}")
    if kind == 1:
        return UserMessage(content=(TextBlock(text=f"see {i}"), IMAGE))
    if kind == 2:
        return AssistantMessage(content=(TextBlock(text=f"answer {i} ünïcode ✓"),))
    if kind == 3:
        return AssistantMessage(
            content=(ThinkingBlock(thinking="hmm", signature=f"sig{i}"), _call(i)),
            provider="anthropic",
        )
    if kind == 4:
        return ToolResultMessage(
            tool_call_id=f"call_{i}", tool_name="lookup", content=(TextBlock(text=f"r{i}"),)
        )
    if kind == 5:
        return ToolResultMessage(
            tool_call_id=f"call_{i}", tool_name="lookup", content=(IMAGE,), is_error=True
        )
    if kind == 6:
        return AssistantMessage(content=(RedactedThinkingBlock(data="opaque"), _call(i)))
    return UserMessage.text("   ")  # no block Anthropic accepts: the neighbours merge


sequences = st.lists(st.integers(min_value=0, max_value=7), max_size=40).map(
    lambda kinds: tuple(_message(k, i) for i, k in enumerate(kinds))
)


@contextmanager
def _chunks(size: int) -> Iterator[None]:
    """Pieces closed into chunks of ``size`` bytes (the default is far larger than these
    sequences: small chunks put chunk ends everywhere, between and at every cut)."""
    with mock.patch.object(wire, "CHUNK", size):
        yield


CHUNK_SIZES = (CHUNK, 1, 60, 300)


def _chat(encoded: ChatEncoded, system: str = "sys") -> Any:
    return json.loads(encoded.messages_json(system))


def _turns(encoded: MessagesEncoded) -> Any:
    return json.loads(encoded.messages_json())


@settings(max_examples=50, deadline=None)
@given(sequences, st.data())
def test_an_encoding_extended_piece_by_piece_is_the_encoding_of_the_whole(
    messages: tuple[AnyMessage, ...], data: st.DataObject
) -> None:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(messages)), max_size=5)))
    with _chunks(data.draw(st.sampled_from(CHUNK_SIZES))):
        chat, turns = CHAT.encode(()), MESSAGES.encode(())
        start = 0
        for cut in [*cuts, len(messages)]:
            chat, turns = chat.extend(messages[start:cut]), turns.extend(messages[start:cut])
            start = cut
        whole_chat, whole_turns = CHAT.encode(messages), MESSAGES.encode(messages)
        assert _chat(chat) == _chat(whole_chat)
        assert _turns(turns) == _turns(whole_turns)
        assert turns.continues_unthinking_loop == whole_turns.continues_unthinking_loop


@settings(max_examples=30, deadline=None)
@given(sequences, sequences, sequences, st.sampled_from(CHUNK_SIZES))
def test_extending_an_older_encoding_leaves_the_newer_one_as_it_was(
    base: tuple[AnyMessage, ...],
    one: tuple[AnyMessage, ...],
    other: tuple[AnyMessage, ...],
    chunk: int,
) -> None:
    """A run that fails is retried from the stored context: both branches share pieces."""
    with _chunks(chunk):
        for form, read in ((CHAT, _chat), (MESSAGES, _turns)):
            root = form.encode(base)
            first = root.extend(one)
            second = root.extend(other)
            assert read(first) == read(form.encode((*base, *one)))  # type: ignore[arg-type]
            assert read(second) == read(form.encode((*base, *other)))  # type: ignore[arg-type]
            assert read(root) == read(form.encode(base))  # type: ignore[arg-type]


def test_tool_images_wait_for_the_end_of_their_batch() -> None:
    """Chat Completions takes images only from users: they follow the batch's last result."""
    call = AssistantMessage(content=(_call(1), _call(2)))
    first = ToolResultMessage(tool_call_id="call_1", tool_name="lookup", content=(IMAGE,))
    encoded = CHAT.encode((UserMessage.text("q"), call, first))
    roles = [m["role"] for m in _chat(encoded, "")]
    assert roles == ["user", "assistant", "tool", "user"]  # the images, at the end for now
    second = ToolResultMessage(
        tool_call_id="call_2", tool_name="lookup", content=(TextBlock(text="ok"),)
    )
    later = encoded.extend((second, UserMessage.text("next")))
    roles = [m["role"] for m in _chat(later, "")]
    assert roles == ["user", "assistant", "tool", "tool", "user", "user"]
    assert _chat(later, "")[4]["content"][0]["text"].startswith("Image output of tool call call_1")


def test_results_merge_into_the_turn_after_their_calls() -> None:
    call = AssistantMessage(content=(_call(1),))
    result = _message(4, 1)
    encoded = MESSAGES.encode((UserMessage.text("q"), call)).extend((result,))
    turns = _turns(encoded)
    assert [t["role"] for t in turns] == ["user", "assistant", "user"]
    assert encoded.continues_unthinking_loop  # the assistant turn did not start with thinking
    later = encoded.extend((UserMessage.text("and then?"),))
    assert [b["type"] for b in _turns(later)[2]["content"]] == ["tool_result", "text"]


def test_a_body_is_the_fields_with_the_encoded_messages_spliced_in() -> None:
    encoded = CHAT.encode((UserMessage.text('say "hi"'),)).messages("")
    body = json.loads(splice({"model": "m", "stream": True}, "messages", encoded))
    assert body == {
        "model": "m",
        "stream": True,
        "messages": [{"role": "user", "content": 'say "hi"'}],
    }
    assert json.loads(splice({}, "messages", CHAT.encode(()).messages(""))) == {"messages": []}
    system = json.loads(splice({}, "messages", CHAT.encode(()).messages("s")))
    assert system == {"messages": [{"role": "system", "content": "s"}]}


def _long(n: int) -> tuple[AnyMessage, ...]:
    """A conversation of ``n`` messages of about 300 bytes: at 4,000, a body of about 1.3 MB."""
    return tuple(
        UserMessage.text(f"question {i} " + "x" * 300)
        if i % 2 == 0
        else AssistantMessage(content=(TextBlock(text=f"answer {i} " + "y" * 300),))
        for i in range(n)
    )


def test_a_long_body_is_sent_as_the_pieces_own_chunks_not_a_copy_of_the_history() -> None:
    messages = _long(4_000)
    encoded = CHAT.encode(messages)
    first = splice({"model": "m"}, "messages", encoded.messages("s"))
    again = splice({"model": "m"}, "messages", encoded.messages("s"))
    assert isinstance(first, Body) and isinstance(again, Body)
    sent = json.loads(first.join())
    assert sent == {"model": "m", "messages": _chat(encoded, "s")}
    assert len(sent["messages"]) == 4_001 and len(first) == len(first.join())
    # the parts between the first and the last are the same objects, request after request:
    # what a request copies is its fields, and what follows the last closed chunk
    middle = first.parts[1:-1]
    assert len(middle) >= 4 and all(len(part) >= CHUNK for part in middle)
    assert all(a is b for a, b in zip(middle, again.parts[1:-1], strict=True))
    assert len(first.parts[0]) + len(first.parts[-1]) < CHUNK + 1_000
    # a run's next request: the messages appended, the history's chunks still the same
    later = encoded.extend((UserMessage.text("and then?"),))
    next_body = splice({"model": "m"}, "messages", later.messages("s"))
    assert isinstance(next_body, Body)
    assert all(a is b for a, b in zip(middle, next_body.parts[1:-1], strict=False))
    assert json.loads(next_body.join())["messages"][-1] == {"role": "user", "content": "and then?"}


def test_a_retry_from_an_older_point_shares_the_chunks_before_it() -> None:
    messages = _long(4_000)
    root = MESSAGES.encode(messages[:3_000])
    newer = root.extend(messages[3_000:])  # the run went on
    retried = root.extend((UserMessage.text("again"),))  # a retry from the stored context
    older = splice({}, "messages", root.messages())
    branch = splice({}, "messages", retried.messages())
    assert isinstance(older, Body) and isinstance(branch, Body)
    shared = older.parts[1:-1]  # the closed chunks before the point the branches part at
    assert shared and all(a is b for a, b in zip(shared, branch.parts[1:], strict=False))
    assert _turns(newer) == _turns(MESSAGES.encode(messages))
    assert json.loads(branch.join())["messages"] == _turns(
        MESSAGES.encode((*messages[:3_000], UserMessage.text("again")))
    )
