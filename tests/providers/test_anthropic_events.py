"""How the Anthropic provider reads a streamed event: the commonest one (a piece of text for an
open text block) by a short path, every other by the general reading, with the same events and
the same protocol errors either way.

The SDK hands each event over as a ``dict``; an event of a ``dict`` subclass takes the general
reading, so the two are compared on the same events, including ones out of order."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.agent.providers.anthropic import stream as anthropic_stream
from app.agent.providers.anthropic.stream import _Translator
from app.agent.providers.base import ProviderError, TextDelta


class General(dict[str, Any]):
    """An event the short path does not take (not exactly a ``dict``)."""


def read(events: list[dict[str, Any]], wrap: bool) -> list[Any]:
    """The events each gives in turn (an error ends it, with its text), then the translator's
    state."""
    translator = _Translator()
    out: list[Any] = []
    for event in events:
        try:
            out.append(translator.read(General(event) if wrap else event))
        except (ProviderError, ValueError, TypeError, AttributeError, KeyError) as exc:
            out.append(("error", type(exc).__name__, str(exc)))
            break
    state = (translator.stop_reason, translator.stopped, dict(translator.blocks))
    return [*out, state, sorted(translator.closed)]


START = {"type": "message_start", "message": {"id": "msg_1", "model": "claude", "usage": {}}}


def block(index: int, kind: str = "text") -> dict[str, Any]:
    content: dict[str, Any] = {"type": kind}
    if kind == "text":
        content["text"] = ""
    if kind == "tool_use":
        content.update(id="toolu_1", name="f", input={})
    return {"type": "content_block_start", "index": index, "content_block": content}


def text(index: Any, piece: Any = "lo", kind: Any = "text_delta") -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": {"type": kind, "text": piece}}


STOP_0 = {"type": "content_block_stop", "index": 0}

#: sequences around one text delta that differs from the commonest in one way
CASES: list[list[dict[str, Any]]] = [
    [START, block(0), text(0)],
    [START, block(0), text(0, "")],
    [START, block(0), text(0, None)],
    [START, block(0), text(0, 3)],
    [START, block(0), text(1)],  # a block never started
    [START, block(0), text(-1)],
    [START, block(0), text(True)],
    [START, block(0), block(1), text(True)],  # a bool is not a block index
    [START, block(0), text("0")],
    [START, block(0), text(None)],
    [START, block(0), STOP_0, text(0)],  # after its block stopped
    [START, block(0, "thinking"), text(0)],  # the wrong block type
    [START, block(0, "tool_use"), text(0)],
    [START, block(0, "server_tool_use"), text(0)],  # a block type never requested
    [START, block(0), text(0, kind="thinking_delta")],
    [START, block(0), text(0, kind="citations_delta")],
    [START, block(0), {"type": "content_block_delta", "index": 0, "delta": None}],
    [START, block(0), {"type": "content_block_delta", "index": 0, "delta": "x"}],
    [START, block(0), {"type": "content_block_delta", "index": 0}],
    [START, block(0), {**text(0), "type": "ping"}],  # not a delta event
    [START, block(0), {**text(0), "type": "content_block_start"}],
    [block(0), text(0)],  # before message_start
    [text(0)],
]


@pytest.mark.parametrize("events", CASES)
def test_each_way_an_event_differs_from_a_piece_of_text_is_read_alike(
    events: list[dict[str, Any]],
) -> None:
    assert read(events, wrap=False) == read(events, wrap=True)


EVENT = st.one_of(
    st.builds(
        text,
        st.one_of(st.integers(-1, 2), st.none(), st.booleans()),
        st.one_of(st.text(max_size=3), st.none(), st.integers(0, 2)),
        st.sampled_from(["text_delta", "thinking_delta", "input_json_delta", "other"]),
    ),
    st.builds(block, st.integers(0, 2), st.sampled_from(["text", "thinking", "tool_use", "x"])),
    st.builds(lambda i: {"type": "content_block_stop", "index": i}, st.integers(0, 2)),
    st.just(START),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(EVENT, max_size=8))
def test_the_short_path_reads_any_sequence_as_the_general_reading_does(
    events: list[dict[str, Any]],
) -> None:
    assert read([START, *events], wrap=False) == read([START, *events], wrap=True)


def test_a_piece_of_text_takes_the_short_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A text delta of an open text block is read without the general reading's field
    lookups (counted), and gives its text delta."""
    lookups: list[str] = []
    general = anthropic_stream._get

    def counted(obj: Any, name: str) -> Any:
        lookups.append(name)
        return general(obj, name)

    monkeypatch.setattr(anthropic_stream, "_get", counted)
    translator = _Translator()
    translator.read(START)
    translator.read(block(0))
    assert lookups
    lookups.clear()
    assert translator.read(text(0, "Hel")) == [TextDelta(index=0, text="Hel")]
    assert lookups == []
