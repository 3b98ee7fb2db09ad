"""The codec's piecewise encoding and decoding (issue 10: a long list of messages is encoded
and decoded a few hundred messages per pydantic call, so no single call holds the GIL for
long): the pieces give exactly what one call gives, and a bad message is named by its index
in the whole list, whatever piece it is in."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.agent.codec import (
    CodecError,
    MessageList,
    dump_messages,
    dumps_json,
    dumps_message,
    json_pieces,
    load_context,
    loads_message_texts,
    model_value,
)
from app.agent.messages import AnyMessage, Context
from app.agent.records import Compaction

from .strategies import messages

_LISTS = st.lists(messages(), max_size=12)


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(_LISTS, st.integers(min_value=1, max_value=5))
def test_pieces_join_to_the_dumped_list(items: list[AnyMessage], chunk: int) -> None:
    joined = b"[" + b",".join(json_pieces(items, chunk)) + b"]"
    assert json.loads(joined) == dump_messages(items)


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(_LISTS, st.integers(min_value=1, max_value=5))
def test_texts_load_back_in_pieces(items: list[AnyMessage], chunk: int) -> None:
    texts = [dumps_message(m) for m in items]
    assert loads_message_texts(texts, chunk=chunk) == items
    context = Context(messages=tuple(items))
    assert load_context({"messages": [json.loads(t) for t in texts]}) == context


def test_a_bad_text_is_named_by_its_index_in_the_whole_list() -> None:
    good = dumps_message(load_context({"messages": [{"type": "user", "content": []}]}).messages[0])
    texts = [good] * 7 + ['{"type":"user","content":[{"type":"text"}]}'] + [good] * 3
    with pytest.raises(CodecError) as caught:
        loads_message_texts(texts, chunk=3)
    assert caught.value.path == "messages[7].content[0].text"


async def test_dumps_json_is_the_compact_json_of_the_value() -> None:
    items = load_context(
        {
            "messages": [
                {"type": "user", "content": [{"type": "text", "text": f'ü \u2028 "{i}"\n'}]}
                for i in range(7)
            ]
        }
    ).messages
    compaction = Compaction(
        reason="manual",
        folded=items,
        previous_summary="",
        summary="s",
        tokens_before=9,
        tokens_after=1,
        at=0,
    )
    value = {
        "a": [model_value(compaction, folded=compaction.folded), MessageList(())],
        "b": MessageList(items[:2]),
        "text": "\x00 not a placeholder",
    }
    plain = {
        "a": [compaction.model_dump(mode="json"), []],
        "b": dump_messages(items[:2]),
        "text": "\x00 not a placeholder",
    }
    assert await dumps_json(value) == _compact(plain).encode()
    assert list(model_value(compaction, folded=items)) == list(compaction.model_dump())
