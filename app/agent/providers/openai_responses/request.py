"""OpenAI Responses provider: the request (our messages and tools -> ``input`` items).

The request is stateless (``store: false``): ``input`` carries the whole context every time,
each message encoded once into its items (:mod:`..wire`). The system prompt is the request's
``instructions`` (:mod:`.client`), never an input item. Mapping:

- user text/images -> one ``message`` item, role ``user``, with ``input_text`` / ``input_image``
  parts (``image_url``: the https URL, or a ``data:`` URL built from a base64 source; ``detail:
  "auto"``);
- assistant content, in the order it was received:

  - a thinking block -> the ``reasoning`` item the provider issued for it, exactly as it was
    received (``id``, ``summary``, ``encrypted_content``, byte for byte): the k-th thinking
    block of a message is the k-th item of its ``provider_data["reasoning"]``
    (:mod:`.stream` stores them so). A thinking block without such an item (one a client wrote
    into an uploaded context), or whose item has no ``encrypted_content`` (a server that did
    not honour ``include``), is not sent: a stateless request cannot replay it; nor are the
    reasoning items at the end of a message that nothing followed (an answer cut at its token
    limit while the model reasoned): OpenAI refuses a reasoning item without its following
    item. Redacted thinking (Anthropic's) is never sent;
  - a run of text blocks -> one ``message`` item, role ``assistant``, one ``output_text`` part
    per non-empty block;
  - a tool call -> ``function_call`` with ``call_id``, ``name`` and the stored raw
    ``arguments`` string, byte for byte (it may not even be valid JSON);

- a tool result -> ``function_call_output`` with ``call_id`` and ``output``: the text, or the
  ``input_text`` / ``input_image`` parts when the result holds images. ``is_error`` has no wire
  field: the tool runner's error text is the output.

An item is complete in itself (no merging across messages), so an encoding is just the items'
pieces: extending it appends the new messages' items.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from ...messages import (
    AnyMessage,
    AssistantMessage,
    ImageBlock,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
    ToolResultMessage,
    UserMessage,
)
from ..base import ToolSpec
from ..openai.request import image_url
from ..wire import Array, Pieces, dumps

#: where a message's reasoning items are kept, in the order of its thinking blocks
REASONING = "reasoning"


def _parts(blocks: Sequence[TextBlock | ImageBlock]) -> list[dict[str, Any]]:
    return [
        {"type": "input_text", "text": block.text}
        if isinstance(block, TextBlock)
        else {"type": "input_image", "image_url": image_url(block), "detail": "auto"}
        for block in blocks
    ]


def reasoning_items(message: AssistantMessage) -> list[dict[str, Any]]:
    """The reasoning items ``message`` holds for its thinking blocks, in their order; ``{}`` in
    the place of one that cannot be replayed."""
    raw = message.provider_data.get(REASONING)
    if not isinstance(raw, list):
        return []
    return [item if _replayable(item) else {} for item in raw]


def _replayable(item: Any) -> bool:
    """A reasoning item with its ``encrypted_content``: without it, a stateless request can
    only name the item by id, which OpenAI refuses (it stored nothing), so the conversation
    would fail on every later request."""
    return (
        isinstance(item, dict)
        and item.get("type") == "reasoning"
        and isinstance(item.get("encrypted_content"), str)
        and bool(item["encrypted_content"])
    )


def _assistant(message: AssistantMessage, emit: Callable[[bytes], None]) -> None:
    reasoning = reasoning_items(message)
    thinking = 0
    held: list[bytes] = []  # reasoning items, sent with the item that follows them
    texts: list[dict[str, Any]] = []

    def send(item: dict[str, Any]) -> None:
        for piece in held:
            emit(piece)
        held.clear()
        emit(dumps(item))

    def flush() -> None:
        if texts:
            send({"type": "message", "role": "assistant", "content": list(texts)})
            texts.clear()

    for block in message.content:
        if isinstance(block, TextBlock):
            if block.text:
                texts.append({"type": "output_text", "text": block.text})
            continue
        flush()
        if isinstance(block, ThinkingBlock):
            item = reasoning[thinking] if thinking < len(reasoning) else {}
            thinking += 1
            if item:
                held.append(dumps(item))  # as received, key order and all
        elif isinstance(block, ToolCallBlock):
            send(
                {
                    "type": "function_call",
                    "call_id": block.id,
                    "name": block.name,
                    # the raw string exactly as the model produced it
                    "arguments": block.arguments,
                }
            )
    flush()
    # reasoning items that nothing followed (an answer cut at its token limit while the model
    # was still reasoning) are not sent: OpenAI refuses a reasoning item without the item
    # that came after it


def _items(message: AnyMessage, emit: Callable[[bytes], None]) -> None:
    """The input items of one message, each as the bytes it has in the request."""
    if isinstance(message, UserMessage):
        emit(dumps({"type": "message", "role": "user", "content": _parts(message.content)}))
    elif isinstance(message, ToolResultMessage):
        content = message.content
        if all(isinstance(b, TextBlock) for b in content):
            output: str | list[dict[str, Any]] = "".join(
                b.text for b in content if isinstance(b, TextBlock)
            )
        else:
            output = _parts(content)
        emit(
            dumps(
                {"type": "function_call_output", "call_id": message.tool_call_id, "output": output}
            )
        )
    else:
        _assistant(message, emit)


class ResponsesEncoded:
    """The ``input`` items of a sequence of messages, each message encoded once (:mod:`..wire`):
    the first ``n`` of ``pieces``."""

    __slots__ = ("_n", "_pieces")

    def __init__(self, pieces: Pieces, n: int) -> None:
        self._pieces = pieces
        self._n = n

    @property
    def nbytes(self) -> int:
        return self._pieces.nbytes

    def extend(self, messages: Sequence[AnyMessage]) -> ResponsesEncoded:
        pieces = self._pieces.at(self._n)
        for message in messages:
            _items(message, pieces.append)
        return ResponsesEncoded(pieces, len(pieces))

    def input(self) -> Array:
        """The request's ``input`` array."""
        return Array(self._pieces, self._n)

    def input_json(self) -> bytes:
        return self.input().json()


class ResponsesWire:
    """The Responses API wire format (``Provider.wire``)."""

    key = "openai-responses"

    def encode(self, messages: Sequence[AnyMessage]) -> ResponsesEncoded:
        return ResponsesEncoded(Pieces(), 0).extend(messages)


RESPONSES = ResponsesWire()


def build_input(messages: Sequence[AnyMessage]) -> list[dict[str, Any]]:
    """The Responses ``input`` array for a request, as it is sent."""
    value: list[dict[str, Any]] = json.loads(RESPONSES.encode(messages).input_json())
    return value


def build_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """Function tools in the Responses shape (flat, not Chat Completions' nested one).
    ``strict`` is false: the Responses API makes it true by default, which refuses every
    schema that is not written for strict mode (and tools' schemas are not)."""
    return [
        {
            "type": "function",
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
            "strict": False,
        }
        for tool in tools
    ]
