"""How the OpenAI provider reads a streamed chunk: the commonest one (a piece of text) by a short
path, every other by the general reading, with the same events either way.

The SDK hands each chunk over as a ``dict``; a chunk of a ``dict`` subclass takes the general
reading whole, so the two are compared on the same chunks, including malformed ones."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.agent.providers.base import MessageStart, ProviderError, TextDelta
from app.agent.providers.openai import OpenAIProvider
from app.agent.providers.openai import stream as openai_stream
from app.agent.providers.openai.stream import _Translator


class General(dict[str, Any]):
    """A chunk the short path does not take (not exactly a ``dict``)."""


@pytest.fixture(scope="module")
def provider() -> Iterator[OpenAIProvider]:
    # never sends a request: only its reading of chunks is used
    yield OpenAIProvider(api_key="sk-test", base_url="http://127.0.0.1:9/v1", model="gpt-fake")


def read(provider: OpenAIProvider, chunks: list[Any], wrap: bool) -> list[Any]:
    """The events of ``chunks`` in turn (a malformed one ends it with its error's text), then
    the translator's state and its closing events."""
    translator = _Translator(token="fixed")
    out: list[Any] = []
    for chunk in chunks:
        try:
            out.append(provider._chunk(translator, General(chunk) if wrap else chunk))
        except ProviderError as exc:
            out.append(("error", exc.kind, exc.code, str(exc)))
            break
    state = (translator.finish_reason, translator.refused, translator.started)
    closing = translator.stop() if translator.finish_reason is not None else None
    return [*out, state, closing]


# Mostly text chunks, each with a chance of every way a chunk can differ from one.
PIECE = st.text(min_size=1, max_size=4)
ODD = st.sampled_from(["", None, 3, [], "x"])
MAYBE = st.one_of(ODD, PIECE)
DELTA = st.fixed_dictionaries(
    {"content": st.one_of(PIECE, PIECE, PIECE, ODD)},
    optional={
        "role": st.just("assistant"),
        "reasoning_content": MAYBE,
        "reasoning": MAYBE,
        "refusal": MAYBE,
        "tool_calls": st.one_of(
            ODD,
            st.just([{"index": 0, "id": "call_1", "function": {"name": "f", "arguments": "{}"}}]),
        ),
    },
)
CHOICE = st.fixed_dictionaries(
    {"delta": st.one_of(DELTA, DELTA, DELTA, ODD)},
    optional={
        "index": st.one_of(st.just(0), st.none(), st.just(1), st.booleans()),
        "finish_reason": st.one_of(st.none(), st.sampled_from(["", "stop", "length", 3])),
    },
)
ONE = st.lists(CHOICE, min_size=1, max_size=1)
CHUNK = st.fixed_dictionaries(
    {
        "id": st.just("chatcmpl-1"),
        "object": st.just("chat.completion.chunk"),
        "choices": st.one_of(ONE, ONE, ONE, st.lists(st.one_of(CHOICE, ODD), max_size=2), ODD),
    },
    optional={
        "model": st.just("gpt-fake"),
        "usage": st.one_of(st.none(), st.just({"prompt_tokens": 3, "completion_tokens": 4})),
    },
)


@settings(max_examples=400, deadline=None)
@given(st.lists(CHUNK, min_size=1, max_size=5))
def test_the_short_path_reads_a_chunk_as_the_general_reading_does(
    provider: OpenAIProvider, chunks: list[dict[str, Any]]
) -> None:
    assert read(provider, chunks, wrap=False) == read(provider, chunks, wrap=True)


def text_chunk(text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "model": "gpt-fake",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
    }


#: one change each to a text chunk's choice (``c``), delta (``d``) or chunk (``k``)
CHANGES: list[tuple[str, str, Any]] = [
    *(
        ("d", key, value)
        for key in ("reasoning_content", "reasoning", "refusal")
        for value in ("why", "", None, 3)
    ),
    (
        "d",
        "tool_calls",
        [{"index": 0, "id": "call_1", "function": {"name": "f", "arguments": "{}"}}],
    ),
    ("d", "tool_calls", []),
    ("d", "content", ""),
    ("d", "content", None),
    ("d", "content", 3),
    ("c", "index", 1),
    ("c", "index", None),
    ("c", "index", True),
    ("c", "finish_reason", "stop"),
    ("c", "finish_reason", ""),
    ("c", "delta", None),
    ("c", "delta", "x"),
    ("k", "usage", {"prompt_tokens": 3, "completion_tokens": 4}),
    ("k", "usage", None),
    ("k", "choices", []),
    ("k", "choices", None),
    ("k", "choices", "x"),
    (
        "k",
        "choices",
        [{"index": 0, "delta": {"content": "a"}}, {"index": 1, "delta": {"content": "b"}}],
    ),
]


@pytest.mark.parametrize(("where", "key", "value"), CHANGES)
def test_each_way_a_chunk_differs_from_a_piece_of_text_is_read_alike(
    provider: OpenAIProvider, where: str, key: str, value: Any
) -> None:
    changed = text_chunk("lo")
    target = {"k": changed, "c": changed["choices"][0], "d": changed["choices"][0]["delta"]}
    target[where][key] = value
    chunks = [text_chunk("Hel"), changed, text_chunk("!")]
    assert read(provider, chunks, wrap=False) == read(provider, chunks, wrap=True)


def test_a_piece_of_text_takes_the_short_path(
    provider: OpenAIProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the first chunk, a text chunk is read without the general reading's field lookups
    (counted), and gives its text delta."""
    lookups: list[str] = []
    general = openai_stream._get

    def counted(obj: Any, name: str) -> Any:
        lookups.append(name)
        return general(obj, name)

    monkeypatch.setattr("app.agent.providers.openai.client._get", counted)
    translator = _Translator()
    first = provider._chunk(translator, text_chunk("Hel"))
    assert first == [MessageStart(response_id="chatcmpl-1", model="gpt-fake"), TextDelta(0, "Hel")]
    assert lookups  # the first chunk starts the message: the general reading
    lookups.clear()
    assert provider._chunk(translator, text_chunk("lo")) == [TextDelta(0, "lo")]
    assert lookups == []
    finish = text_chunk("")
    finish["choices"][0]["finish_reason"] = "stop"
    assert provider._chunk(translator, finish) == []
    assert lookups and translator.finish_reason == "stop"
