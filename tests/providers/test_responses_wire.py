"""The Responses API's carried-over ``input`` encoding (app/agent/providers/openai_responses):
extended piece by piece, from any earlier point, it is exactly the encoding of the whole
sequence at once (the rule tests/providers/test_wire.py holds the other formats to)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from app.agent.messages import AnyMessage, AssistantMessage, TextBlock, ThinkingBlock
from app.agent.providers.openai_responses.request import RESPONSES, ResponsesEncoded
from app.agent.providers.wire import splice

from .test_wire import _call, _message


def _reasoning(i: int) -> dict[str, Any]:
    return {
        "id": f"rs_{i}",
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": f"plan {i}"}],
        "encrypted_content": f"gAAAA{i}==",
    }


def _responses_message(kind: int, i: int) -> AnyMessage:
    """Besides the shapes every format meets: answers of this provider with reasoning items,
    one cut while reasoning (its trailing item is not sent)."""
    if kind == 8:
        return AssistantMessage(
            content=(ThinkingBlock(thinking=f"plan {i}"), _call(i)),
            provider="openai-responses",
            provider_data={"reasoning": [_reasoning(i)]},
        )
    if kind == 9:
        return AssistantMessage(
            content=(TextBlock(text="so"), ThinkingBlock(thinking=f"plan {i}")),
            provider="openai-responses",
            provider_data={"reasoning": [_reasoning(i)], "reasoning_tokens": 3},
        )
    return _message(kind, i)


sequences = st.lists(st.integers(min_value=0, max_value=9), max_size=40).map(
    lambda kinds: tuple(_responses_message(k, i) for i, k in enumerate(kinds))
)


def _input(encoded: ResponsesEncoded) -> Any:
    return json.loads(encoded.input_json())


@settings(max_examples=50, deadline=None)
@given(sequences, st.data())
def test_an_encoding_extended_piece_by_piece_is_the_encoding_of_the_whole(
    messages: tuple[AnyMessage, ...], data: st.DataObject
) -> None:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(messages)), max_size=5)))
    encoded = RESPONSES.encode(())
    start = 0
    for cut in [*cuts, len(messages)]:
        encoded = encoded.extend(messages[start:cut])
        start = cut
    assert _input(encoded) == _input(RESPONSES.encode(messages))


@settings(max_examples=30, deadline=None)
@given(sequences, sequences, sequences)
def test_extending_an_older_encoding_leaves_the_newer_one_as_it_was(
    base: tuple[AnyMessage, ...], one: tuple[AnyMessage, ...], other: tuple[AnyMessage, ...]
) -> None:
    root = RESPONSES.encode(base)
    first, second = root.extend(one), root.extend(other)
    assert _input(first) == _input(RESPONSES.encode((*base, *one)))
    assert _input(second) == _input(RESPONSES.encode((*base, *other)))
    assert _input(root) == _input(RESPONSES.encode(base))


def test_a_reasoning_item_goes_with_the_item_after_it_and_exactly_as_stored() -> None:
    messages = (_responses_message(8, 1), _responses_message(9, 2))
    items = _input(RESPONSES.encode(messages))
    assert items[0] == _reasoning(1)
    assert json.dumps(items[0]) == json.dumps(_reasoning(1))  # key order kept
    assert [i["type"] for i in items] == ["reasoning", "function_call", "message"]


def test_a_body_is_the_fields_with_the_input_spliced_in() -> None:
    encoded = RESPONSES.encode((_message(0, 1),)).input()
    body = json.loads(splice({"model": "m", "store": False}, "input", encoded))
    assert body == {
        "model": "m",
        "store": False,
        "input": [
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "question 1"}],
            }
        ],
    }
