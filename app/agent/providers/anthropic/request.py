"""Anthropic Messages provider: the request (our messages and tools -> the wire format).

Request mapping (our messages -> ``messages``):

- consecutive user-side messages (the summary projection, prompts, tool results) are merged
  into ONE user turn, so the tool results of a batch are ``tool_result`` blocks of the user
  message right after the assistant turn holding their ``tool_use`` blocks (results first,
  in call order, then any prompt text that follows them);
- assistant content is sent in the order it was received: ``thinking`` blocks as
  ``{thinking, signature}`` and ``redacted_thinking`` as ``{data}``, exactly as stored, then
  text and ``tool_use``. A thinking block with an empty signature cannot have come from
  Anthropic (it came from another provider's unsigned reasoning) and is not sent: Anthropic
  would refuse it;
- empty (or whitespace-only) text blocks are dropped: Anthropic refuses them. A turn left
  empty is dropped and its neighbours merge;
- images: base64 sources as they are; URL sources as ``{"type": "url"}`` (a ``data:`` URL is
  turned into a base64 source);
- tool-call ids are sent as stored; characters Anthropic does not allow in ids (anything
  outside ``[A-Za-z0-9_-]``, possible in ids issued by other providers) become ``_`` in both
  the ``tool_use`` and its ``tool_result``.

``tool_use.input`` must be an object, but our ``arguments`` is the raw string the model
produced. It is parsed with ``json.loads`` (key order kept). DECISION: when it is empty, not
valid JSON, or not an object (a stream cut at ``max_tokens`` mid-call, or a call made by
another provider), ``{}`` is sent: there is no way to send the raw string, and ``{}`` is what
Anthropic itself reports for a call without input. The paired ``tool_result`` (normally an
error about the arguments from the tool runner) still tells the model what went wrong.

Thinking (``thinking_budget``): one thinking configuration per tool loop, as Anthropic requires.
DECISION: a request that continues a tool loop whose assistant turn does not start with a
thinking block (the loop was begun by another provider, or by a profile without thinking, and
its run ended after the tool results) is sent without ``thinking``: with it, Anthropic refuses
the request ("a final assistant message must start with a thinking block"), and the stored
history cannot be changed to satisfy it. Thinking is back on from the next turn.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...messages import (
    AnyMessage,
    AssistantMessage,
    Base64Source,
    ImageBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
    ToolResultMessage,
)
from ..base import ToolSpec
from ..wire import Array, Pieces, dumps

_BAD_ID_CHARS = re.compile(r"[^A-Za-z0-9_-]")
_DATA_URL = re.compile(r"^data:([^;,]+);base64,(.*)$", re.DOTALL)


def tool_input(arguments: str) -> dict[str, Any]:
    """The ``tool_use.input`` object for a stored raw ``arguments`` string (see module doc)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _tool_id(call_id: str) -> str:
    return _BAD_ID_CHARS.sub("_", call_id)


def _text(text: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text}] if text.strip() else []


def _image(block: ImageBlock) -> dict[str, Any]:
    source = block.source
    if isinstance(source, Base64Source):
        return {
            "type": "image",
            "source": {"type": "base64", "media_type": source.media_type, "data": source.data},
        }
    match = _DATA_URL.match(source.url)
    if match:
        return {
            "type": "image",
            "source": {"type": "base64", "media_type": match.group(1), "data": match.group(2)},
        }
    return {"type": "image", "source": {"type": "url", "url": source.url}}


def _user_blocks(blocks: Sequence[TextBlock | ImageBlock]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for block in blocks:
        out += _text(block.text) if isinstance(block, TextBlock) else [_image(block)]
    return out


def _assistant_blocks(message: AssistantMessage) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for block in message.content:
        if isinstance(block, ThinkingBlock):
            if block.signature:  # exactly as received; thinking may be ""
                out.append(
                    {"type": "thinking", "thinking": block.thinking, "signature": block.signature}
                )
        elif isinstance(block, RedactedThinkingBlock):
            out.append({"type": "redacted_thinking", "data": block.data})
        elif isinstance(block, TextBlock):
            out += _text(block.text)
        elif isinstance(block, ToolCallBlock):
            out.append(
                {
                    "type": "tool_use",
                    "id": _tool_id(block.id),
                    "name": block.name,
                    "input": tool_input(block.arguments),
                }
            )
    return out


def _tool_result(message: ToolResultMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "tool_result", "tool_use_id": _tool_id(message.tool_call_id)}
    content = _user_blocks(message.content)
    if content:
        out["content"] = content
    if message.is_error:
        out["is_error"] = True
    return out


def _turn_of(message: AnyMessage) -> tuple[str, list[dict[str, Any]]]:
    """The role and blocks ``message`` adds to the Messages API turns."""
    if isinstance(message, AssistantMessage):
        return "assistant", _assistant_blocks(message)
    if isinstance(message, ToolResultMessage):
        return "user", [_tool_result(message)]
    return "user", _user_blocks(message.content)


@dataclass(frozen=True, slots=True)
class _Turn:
    """What the thinking rule needs to know of a turn: its role, the type of its first block,
    and whether it holds tool results."""

    role: str
    first: str
    tool_results: bool


@dataclass(frozen=True, slots=True)
class _Open:
    """The last turn, which the next message of the same role still extends: its blocks are the
    first ``n`` of ``blocks``."""

    turn: _Turn
    blocks: Pieces
    n: int

    def json(self) -> bytes:
        return (
            b'{"role":' + dumps(self.turn.role) + b',"content":' + self.blocks.array(self.n) + b"}"
        )


class MessagesEncoded:
    """The Messages API turns of a sequence of messages, each message encoded once
    (:mod:`..wire`): the first ``n`` closed turns of ``pieces``, then the open last turn.
    Consecutive messages of one role merge into one turn; a message with no block to send adds
    nothing (see the module doc)."""

    __slots__ = ("_n", "_open", "_pieces", "_prev")

    def __init__(self, pieces: Pieces, n: int, open_: _Open | None, prev: _Turn | None) -> None:
        self._pieces = pieces
        self._n = n
        self._open = open_
        self._prev = prev  # the last closed turn

    @property
    def nbytes(self) -> int:
        return self._pieces.nbytes + (self._open.blocks.nbytes if self._open else 0)

    def extend(self, messages: Sequence[AnyMessage]) -> MessagesEncoded:
        pieces = self._pieces.at(self._n)
        prev = self._prev
        turn: _Turn | None = None
        blocks = Pieces()
        if self._open is not None:
            turn, blocks = self._open.turn, self._open.blocks.at(self._open.n)
        for message in messages:
            role, new = _turn_of(message)
            if not new:
                continue
            results = any(b["type"] == "tool_result" for b in new)
            if turn is not None and turn.role == role:
                if results and not turn.tool_results:
                    turn = _Turn(role, turn.first, True)
            else:
                if turn is not None:
                    pieces.append(_Open(turn, blocks, len(blocks)).json())
                    prev = turn
                turn, blocks = _Turn(role, new[0]["type"], results), Pieces()
            for block in new:
                blocks.append(dumps(block))
        open_ = None if turn is None else _Open(turn, blocks, len(blocks))
        return MessagesEncoded(pieces, len(pieces), open_, prev)

    def messages(self) -> Array:
        """The request's ``messages`` array."""
        after = [self._open.json()] if self._open is not None else []
        return Array(self._pieces, self._n, (), after)

    def messages_json(self) -> bytes:
        return self.messages().json()

    @property
    def continues_unthinking_loop(self) -> bool:
        """Do the turns end inside a tool loop whose assistant turn has no thinking block first?

        That is: the last (user) turn holds ``tool_result`` blocks and the assistant turn before
        it does not start with ``thinking`` / ``redacted_thinking`` — Anthropic then refuses a
        request with thinking enabled.
        """
        last, prev = (self._open.turn if self._open else None), self._prev
        if last is None or prev is None or last.role != "user" or not last.tool_results:
            return False
        return prev.first not in ("thinking", "redacted_thinking")


class MessagesWire:
    """The Messages API wire format (``Provider.wire``)."""

    key = "anthropic-messages"

    def encode(self, messages: Sequence[AnyMessage]) -> MessagesEncoded:
        return MessagesEncoded(Pieces(), 0, None, None).extend(messages)


MESSAGES = MessagesWire()


def build_messages(messages: Sequence[AnyMessage]) -> list[dict[str, Any]]:
    """The Messages API ``messages`` array, as it is sent: alternating turns, no empty block or
    turn."""
    value: list[dict[str, Any]] = json.loads(MESSAGES.encode(messages).messages_json())
    return value


def build_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools
    ]
