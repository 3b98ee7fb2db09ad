"""OpenAI Chat Completions provider: the request (our messages and tools -> the wire format).

Request mapping (our messages -> ``messages``):

- the system prompt goes first as a ``system`` message (left out when empty);
- user text/images -> ``content`` parts (``image_url`` with the https URL, or a ``data:`` URL
  built from a base64 source); a user message of exactly one text block is sent as a plain
  string, which every compatible server understands;
- assistant -> concatenated text as ``content`` and ``tool_calls`` whose ``arguments`` is the
  stored raw string, byte for byte (it may not even be valid JSON: vLLM-style servers that
  re-parse it will refuse it, OpenAI does not). Thinking and redacted-thinking blocks are not
  sent (Chat Completions has no field for them);
- tool results -> ``{"role": "tool", "tool_call_id", "content": text}``. Chat Completions only
  accepts images in user messages, so images returned by tools are sent in ONE user message
  placed right after the last tool message of the batch, each group introduced by a text part
  naming its call; a result with images and no text says where its images went. ``is_error``
  has no wire field and is not sent (the tool runner's error text is the content).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from ...messages import (
    AnyMessage,
    AssistantMessage,
    Base64Source,
    ImageBlock,
    TextBlock,
    ToolCallBlock,
    ToolResultMessage,
    UserMessage,
)
from ..base import ToolSpec
from ..wire import Array, Pieces, dumps


def image_url(block: ImageBlock) -> str:
    source = block.source
    if isinstance(source, Base64Source):
        return f"data:{source.media_type};base64,{source.data}"
    return source.url


def _user_content(blocks: Sequence[TextBlock | ImageBlock]) -> str | list[dict[str, Any]]:
    if len(blocks) == 1 and isinstance(blocks[0], TextBlock):
        return blocks[0].text
    parts: list[dict[str, Any]] = []
    for block in blocks:
        if isinstance(block, TextBlock):
            parts.append({"type": "text", "text": block.text})
        else:
            parts.append({"type": "image_url", "image_url": {"url": image_url(block)}})
    return parts


def _assistant(message: AssistantMessage) -> dict[str, Any]:
    text = "".join(b.text for b in message.content if isinstance(b, TextBlock))
    calls = [b for b in message.content if isinstance(b, ToolCallBlock)]
    out: dict[str, Any] = {"role": "assistant"}
    if calls:
        # ``content`` may be null with tool calls; send text only when there is some.
        out["content"] = text or None
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                # The raw string exactly as the model produced it, never re-serialized.
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in calls
        ]
    else:
        out["content"] = text
    return out


class _Writer:
    """Our messages -> Chat Completions items, one message at a time: the one home of the
    mapping above. ``emit`` takes each finished item; images returned by tools wait in
    ``pending`` until the next message that is not a tool result (or the end of the request)."""

    __slots__ = ("emit", "pending")

    def __init__(self, emit: Callable[[dict[str, Any]], None], pending: list[dict[str, Any]]):
        self.emit = emit
        self.pending = pending

    def add(self, message: AnyMessage) -> None:
        if isinstance(message, ToolResultMessage):
            text = "".join(b.text for b in message.content if isinstance(b, TextBlock))
            images = [b for b in message.content if isinstance(b, ImageBlock)]
            if images:
                self.pending.append(
                    {
                        "type": "text",
                        "text": f"Image output of tool call {message.tool_call_id} "
                        f"({message.tool_name}):",
                    }
                )
                self.pending.extend(
                    {"type": "image_url", "image_url": {"url": image_url(b)}} for b in images
                )
                if not text:
                    text = "(the image output follows in the next user message)"
            self.emit({"role": "tool", "tool_call_id": message.tool_call_id, "content": text})
            return
        self.flush()
        if isinstance(message, UserMessage):
            self.emit({"role": "user", "content": _user_content(message.content)})
        else:
            self.emit(_assistant(message))

    def flush(self) -> None:
        if self.pending:
            self.emit(_images(self.pending))
            self.pending.clear()


def _images(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {"role": "user", "content": list(parts)}


class ChatEncoded:
    """The Chat Completions items of a sequence of messages, encoded once each
    (:mod:`..wire`): the first ``n`` of ``pieces``, then any tool images still waiting."""

    __slots__ = ("_n", "_pending", "_pieces")

    def __init__(self, pieces: Pieces, n: int, pending: tuple[dict[str, Any], ...]) -> None:
        self._pieces = pieces
        self._n = n
        self._pending = pending

    @property
    def nbytes(self) -> int:
        return self._pieces.nbytes

    def extend(self, messages: Sequence[AnyMessage]) -> ChatEncoded:
        pieces = self._pieces.at(self._n)
        pending = list(self._pending)
        writer = _Writer(lambda item: pieces.append(dumps(item)), pending)
        for message in messages:
            writer.add(message)
        return ChatEncoded(pieces, len(pieces), tuple(pending))

    def messages(self, system_prompt: str) -> Array:
        """The request's ``messages`` array: the system prompt first, when there is one."""
        before = [dumps({"role": "system", "content": system_prompt})] if system_prompt else []
        after = [dumps(_images(self._pending))] if self._pending else []
        return Array(self._pieces, self._n, before, after)

    def messages_json(self, system_prompt: str) -> bytes:
        return self.messages(system_prompt).json()


class ChatWire:
    """The Chat Completions wire format (``Provider.wire``)."""

    key = "openai-chat"

    def encode(self, messages: Sequence[AnyMessage]) -> ChatEncoded:
        return ChatEncoded(Pieces(), 0, ()).extend(messages)


CHAT = ChatWire()


def build_messages(system_prompt: str, messages: Sequence[AnyMessage]) -> list[dict[str, Any]]:
    """The Chat Completions ``messages`` array for a request, as it is sent."""
    value: list[dict[str, Any]] = json.loads(CHAT.encode(messages).messages_json(system_prompt))
    return value


def build_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.parameters,
            },
        }
        for tool in tools
    ]
