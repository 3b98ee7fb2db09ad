"""Anthropic Messages provider: the response (Messages API events -> stream events).

Streaming: every raw SSE event is translated (``ping`` and unknown events ignored). The
stored ``arguments`` of a streamed call is the concatenation of its ``input_json_delta``
fragments, verbatim: that is what the model wrote. A call that streamed no fragment gets
the compact JSON of the ``input`` of its ``content_block_start`` (``"{}"``). Non-streaming
(``stream=False``) has only the parsed object: ``arguments`` is then
``json.dumps(input, separators=(",", ":"), ensure_ascii=False)``, the same bytes as the
compact JSON of the response body, with key order kept.

Events in an order the Messages API never sends are a ``fatal`` protocol error
(:meth:`_Translator._check_order`; the stream faults are listed in :mod:`.client`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...codec import compact_json
from ...messages import Usage, token_count
from .._http import protocol_error
from ..base import (
    BlockStop,
    MessageStart,
    MessageStop,
    RedactedThinking,
    SignatureDelta,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolCallDelta,
    ToolCallStart,
    UsageUpdate,
)


def _get(obj: Any, name: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(name)
    value = getattr(obj, name, None)
    if value is None:
        extra = getattr(obj, "model_extra", None)
        if isinstance(extra, dict):
            value = extra.get(name)
    return value


_USAGE_FIELDS = (
    "input_tokens",
    "output_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
)


def _merge_usage(usage: dict[str, int], raw: Any) -> dict[str, int]:
    """The wire usage fields updated with those ``raw`` carries (message_delta's are cumulative)."""
    if raw is None:
        return usage
    merged = dict(usage)
    for wire in _USAGE_FIELDS:
        value = _get(raw, wire)
        if isinstance(value, int) and value >= 0:
            merged[wire] = token_count(value)
    return merged


def _usage(wire: dict[str, int]) -> Usage:
    """Normalized usage: Anthropic's ``input_tokens`` leaves out cached tokens, ours counts the
    whole input (see :class:`~app.agent.messages.Usage`)."""
    cache_write = wire.get("cache_creation_input_tokens", 0)
    cache_read = wire.get("cache_read_input_tokens", 0)
    return Usage(
        input_tokens=token_count(wire.get("input_tokens", 0) + cache_write + cache_read),
        output_tokens=wire.get("output_tokens", 0),
        cache_read_tokens=cache_read,
        cache_write_tokens=cache_write,
    )


# delta type -> the block type it belongs to (delta types not listed are not checked)
_DELTA_BLOCK = {
    "text_delta": "text",
    "thinking_delta": "thinking",
    "signature_delta": "thinking",
    "input_json_delta": "tool_use",
}
_BLOCK_EVENTS = ("content_block_start", "content_block_delta", "content_block_stop")
_KNOWN_BLOCKS = ("text", "thinking", "redacted_thinking", "tool_use")


@dataclass
class _Translator:
    provider: str = "anthropic"
    wire_usage: dict[str, int] = field(default_factory=dict)
    stop_reason: str | None = None
    started: bool = False
    stopped: bool = False
    tool_inputs: dict[int, Any] = field(default_factory=dict)  # index -> start input
    tool_args_seen: set[int] = field(default_factory=set)
    blocks: dict[int, str] = field(default_factory=dict)  # index -> block type ("" unknown)
    closed: set[int] = field(default_factory=set)

    def _check_order(self, kind: Any, index: Any, event: Any) -> None:
        """Raise a protocol error for an event the Messages API never sends at this point."""
        if kind == "message_start":
            if self.started:
                raise protocol_error(self.provider, "a second message_start")
            self.started = True
            return
        if kind not in (*_BLOCK_EVENTS, "message_delta", "message_stop"):
            return  # ping, unknown (future) events
        if not self.started:
            raise protocol_error(self.provider, f"{kind} before message_start")
        if kind not in _BLOCK_EVENTS:
            return
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise protocol_error(self.provider, f"{kind} without a block index ({index!r:.40})")
        if kind == "content_block_start":
            if index in self.blocks:
                raise protocol_error(self.provider, f"block {index} started twice")
            block_type = _get(_get(event, "content_block"), "type")
            self.blocks[index] = block_type if block_type in _KNOWN_BLOCKS else ""
            return
        if index not in self.blocks:
            raise protocol_error(
                self.provider, f"{kind} for block {index} before its content_block_start"
            )
        if index in self.closed:
            raise protocol_error(self.provider, f"{kind} for block {index} after it stopped")
        if kind == "content_block_stop":
            self.closed.add(index)
            return
        delta_type = _get(_get(event, "delta"), "type")
        expected = _DELTA_BLOCK.get(delta_type) if isinstance(delta_type, str) else None
        block_type = self.blocks[index]
        if expected is not None and block_type and expected != block_type:
            raise protocol_error(
                self.provider, f"a {delta_type} for block {index}, a {block_type} block"
            )

    def read(self, event: Any) -> list[StreamEvent]:
        """The events of one event as the SDK decodes it (a dict): a piece of text by
        :meth:`text_event`, any other by :meth:`event`."""
        if type(event) is dict:
            found = self.text_event(event)
            if found is not None:
                return found
        return self.event(event)

    def text_event(self, event: dict[str, Any]) -> list[StreamEvent] | None:
        """The events of the commonest event, read with a few dict lookups: a piece of text
        for an open text block. ``None`` for any other event: :meth:`event` takes it, and
        gives what it would give for this one (a text block's index was checked when it
        started)."""
        if event.get("type") != "content_block_delta":
            return None
        index = event.get("index")
        delta = event.get("delta")
        if (
            type(index) is not int
            or type(delta) is not dict
            or delta.get("type") != "text_delta"
            or self.blocks.get(index) != "text"
            or index in self.closed
        ):
            return None
        text = delta.get("text")
        return [TextDelta(index=index, text=text)] if text else []

    def event(self, event: Any) -> list[StreamEvent]:
        kind = _get(event, "type")
        index = _get(event, "index")
        self._check_order(kind, index, event)
        if kind == "content_block_delta" and not self.blocks.get(index):
            return []  # a delta of a block type never requested (server tools, ...)
        if kind == "message_start":
            message = _get(event, "message")
            self.wire_usage = _merge_usage(self.wire_usage, _get(message, "usage"))
            return [
                MessageStart(
                    response_id=str(_get(message, "id") or ""),
                    model=str(_get(message, "model") or ""),
                ),
                UsageUpdate(usage=_usage(self.wire_usage)),
            ]
        if kind == "content_block_start" and isinstance(index, int):
            return self._block_start(index, _get(event, "content_block"))
        if kind == "content_block_delta" and isinstance(index, int):
            return self._delta(index, _get(event, "delta"))
        if kind == "content_block_stop" and isinstance(index, int):
            out: list[StreamEvent] = []
            if index in self.tool_inputs and index not in self.tool_args_seen:
                out.append(
                    ToolCallDelta(
                        index=index, arguments=compact_json(self.tool_inputs[index] or {})
                    )
                )
            return [*out, BlockStop(index=index)]
        if kind == "message_delta":
            self.wire_usage = _merge_usage(self.wire_usage, _get(event, "usage"))
            reason = _get(_get(event, "delta"), "stop_reason")
            if isinstance(reason, str) and reason:
                self.stop_reason = reason
            return [UsageUpdate(usage=_usage(self.wire_usage))]
        if kind == "message_stop":
            self.stopped = True
            return [MessageStop(stop_reason=self.stop_reason or "end_turn")]
        return []  # ping, unknown events

    def _block_start(self, index: int, block: Any) -> list[StreamEvent]:
        kind = _get(block, "type")
        if kind == "text":
            text = _get(block, "text")
            return [TextDelta(index=index, text=text)] if text else []
        if kind == "thinking":
            # Always open the block, so a thinking block that streams only its signature
            # becomes ThinkingBlock(thinking="", signature=...).
            out: list[StreamEvent] = [
                ThinkingDelta(index=index, thinking=_get(block, "thinking") or "")
            ]
            signature = _get(block, "signature")
            if signature:
                out.append(SignatureDelta(index=index, signature=signature))
            return out
        if kind == "redacted_thinking":
            return [RedactedThinking(index=index, data=_get(block, "data") or "")]
        if kind == "tool_use":
            self.tool_inputs[index] = _get(block, "input")
            return [
                ToolCallStart(
                    index=index,
                    id=str(_get(block, "id") or ""),
                    name=str(_get(block, "name") or ""),
                )
            ]
        return []  # block types never requested (server tools, ...)

    def _delta(self, index: int, delta: Any) -> list[StreamEvent]:
        kind = _get(delta, "type")
        if kind == "text_delta":
            text = _get(delta, "text")
            return [TextDelta(index=index, text=text)] if text else []
        if kind == "thinking_delta":
            return [ThinkingDelta(index=index, thinking=_get(delta, "thinking") or "")]
        if kind == "signature_delta":
            return [SignatureDelta(index=index, signature=_get(delta, "signature") or "")]
        if kind == "input_json_delta":
            partial = _get(delta, "partial_json")
            if isinstance(partial, str) and partial:
                self.tool_args_seen.add(index)
                return [ToolCallDelta(index=index, arguments=partial)]
        return []
