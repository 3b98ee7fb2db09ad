"""OpenAI Responses provider: the response (events and output items -> stream events).

A streamed answer is a sequence of typed events, each read as the SDK decoded it (a dict); a
non-streamed one is a response object whose ``output`` items are read the same way, item by
item. Both go through :class:`_Translator`:

- ``response.created``: the response id and model;
- ``response.output_item.added`` / ``.done``: an item starts and ends. A ``reasoning`` item is a
  thinking block (its summary streamed by ``response.reasoning_summary_text.delta``, summary
  parts joined by a blank line); a ``function_call`` item is a tool call (``call_id``, ``name``;
  ``arguments`` from ``response.function_call_arguments.delta``, verbatim); a ``message`` item's
  ``output_text`` and ``refusal`` parts are text blocks (``response.output_text.delta``,
  ``response.refusal.delta``). What an item's deltas did not bring (a server that sends the
  item whole) is taken from its ``.done`` item;
- ``response.completed`` / ``response.incomplete``: the end, with the usage and, for an
  incomplete response, why (``max_output_tokens`` -> ``max_tokens``). ``response.failed`` and
  ``error`` raise a :class:`~app.agent.providers.base.ProviderError` (:func:`failure`).
  Every other event type is ignored.

The reasoning items themselves are kept exactly as received — the ``.done`` item, which holds
the complete ``encrypted_content`` — in ``provider_data["reasoning"]``, one per thinking block
and in the same order (:mod:`.request` sends them back). Usage: ``input_tokens`` (the whole
input), ``input_tokens_details.cached_tokens`` as ``cache_read_tokens``, ``output_tokens``
(reasoning tokens included, as OpenAI counts them); the reasoning tokens
(``output_tokens_details.reasoning_tokens``) are kept in ``provider_data["reasoning_tokens"]``
when there are any.

A value of the wrong shape (an event that is not an object, an index that is not a number, a
delta that is not a string) raises ``ValueError``: the client reports it as malformed stream
data.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ...messages import Usage, token_count
from ..base import (
    BlockStop,
    MessageStart,
    MessageStop,
    ProviderError,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolCallDelta,
    ToolCallStart,
    UsageUpdate,
)
from ..openai.sdk import stream_error
from .request import REASONING

#: what the model stopped for when a response is incomplete
_INCOMPLETE = {"max_output_tokens": "max_tokens", "content_filter": "content_filter"}
#: error codes of a failed response that a retry cannot fix (the request itself is refused)
_FATAL_CODES = re.compile(r"^(invalid|image_|unsupported_|empty_|failed_to_download)|quota")
#: the text parts of a ``message`` item
_TEXT_PARTS = ("output_text", "refusal")


def _object(value: Any, what: str) -> dict[str, Any]:
    """``value`` when it is an object; ``{}`` for a missing one."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{what} is not an object: {value!r:.80}")
    return value


def _index(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{what} is not an index: {value!r:.40}")
    return value


def _text(value: Any, what: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"{what} is not a string: {value!r:.40}")
    return value


def _count(raw: dict[str, Any], name: str) -> int:
    value = raw.get(name)
    return token_count(int(value)) if value is not None else 0


def usage_of(raw: Any) -> tuple[Usage, int] | None:
    """The normalized usage of a response, and its reasoning tokens (``None``: no usage)."""
    if raw is None:
        return None
    raw = _object(raw, "usage")
    details = _object(raw.get("input_tokens_details"), "input_tokens_details")
    output = _object(raw.get("output_tokens_details"), "output_tokens_details")
    usage = Usage(
        input_tokens=_count(raw, "input_tokens"),
        output_tokens=_count(raw, "output_tokens"),
        cache_read_tokens=_count(details, "cached_tokens"),
        cache_write_tokens=_count(details, "cache_write_tokens"),
    )
    return usage, _count(output, "reasoning_tokens")


def failure(provider: str, api_key: str, error: Any, where: str) -> ProviderError:
    """A response that failed (``response.failed``, a response with ``status: failed``) or an
    ``error`` event: an overflow when the input did not fit, fatal when the request itself is
    refused (an invalid prompt or image, no quota), else retryable (a server error, a rate
    limit)."""
    error = error if isinstance(error, dict) else {}
    code = error.get("code") if isinstance(error.get("code"), str) else None
    message = error.get("message") if isinstance(error.get("message"), str) else None
    fatal = bool(code and _FATAL_CODES.search(code))
    return stream_error(provider, api_key, code, message or "no message", fatal=fatal, where=where)


@dataclass
class _Item:
    """One output item of the response, by its ``output_index``."""

    kind: str  # "message", "reasoning", "function_call"; "" for a type never requested
    index: int = -1  # our block (reasoning, function_call)
    parts: dict[int, int] = field(default_factory=dict)  # content_index -> our block (message)
    named: bool = False  # its ToolCallStart carried the call's id and name
    streamed: bool = False  # deltas brought its content (its .done item adds none then)
    summary: int | None = None  # the last summary part streamed (reasoning)
    raw: dict[str, Any] | None = None  # the item as received complete (reasoning)


@dataclass
class _Translator:
    """Responses events (or a response's output items) -> stream events, stable block indexes."""

    provider: str
    api_key: str = ""
    items: dict[int, _Item] = field(default_factory=dict)
    next_index: int = 0
    started: bool = False
    stopped: bool = False
    refused: bool = False

    def _alloc(self) -> int:
        index = self.next_index
        self.next_index += 1
        return index

    # --- one event --------------------------------------------------------------------------

    def event(self, event: Any) -> list[StreamEvent]:
        event = _object(event, "an event")
        kind = event.get("type")
        if not isinstance(kind, str):
            raise ValueError(f"an event without a type: {event!r:.80}")
        out = self.start(event.get("response") if kind.startswith("response.") else None)
        if kind in ("response.completed", "response.incomplete"):
            return out + self.finish(_object(event.get("response"), "response"))
        if kind == "response.failed":
            response = _object(event.get("response"), "response")
            raise failure(self.provider, self.api_key, response.get("error"), "the response failed")
        if kind == "error":
            raise failure(self.provider, self.api_key, event, "error event")
        if kind not in _HANDLERS:
            return out  # created, in_progress, ….done events of parts, unknown (future) events
        at = _index(event.get("output_index"), "output_index")
        return out + _HANDLERS[kind](self, at, event)

    def start(self, response: Any) -> list[StreamEvent]:
        if self.started:
            return []
        self.started = True
        response = _object(response, "response")
        return [
            MessageStart(
                response_id=_text(response.get("id"), "id"),
                model=_text(response.get("model"), "model"),
            )
        ]

    def _added(self, at: int, event: dict[str, Any]) -> list[StreamEvent]:
        return self.added(at, _object(event.get("item"), "item"))

    def added(self, at: int, item: dict[str, Any]) -> list[StreamEvent]:
        """Item ``at`` starts (a second start of it is ignored)."""
        if at in self.items:
            return []
        kind = item.get("type")
        if kind == "reasoning":
            entry = self.items[at] = _Item("reasoning", self._alloc())
            # opened at once, so a reasoning item with no summary is still a thinking block
            return [ThinkingDelta(index=entry.index, thinking="")]
        if kind == "function_call":
            entry = self.items[at] = _Item("function_call", self._alloc())
            call_id = _text(item.get("call_id"), "call_id")
            name = _text(item.get("name"), "name")
            entry.named = bool(call_id and name)
            return [ToolCallStart(index=entry.index, id=call_id, name=name)]
        self.items[at] = _Item("message" if kind == "message" else "")
        return []

    def _part(self, at: int, part: int) -> int | None:
        """Our block of text part ``part`` of message item ``at`` (None: not a message)."""
        item = self.items.get(at)
        if item is None:
            item = self.items[at] = _Item("message")
        if item.kind != "message":
            return None
        if part not in item.parts:
            item.parts[part] = self._alloc()
        return item.parts[part]

    def _part_added(self, at: int, event: dict[str, Any]) -> list[StreamEvent]:
        part = _object(event.get("part"), "part")
        if part.get("type") not in _TEXT_PARTS:
            return []
        if part.get("type") == "refusal":
            self.refused = True
        index = self._part(at, _index(event.get("content_index"), "content_index"))
        text = _text(part.get("text") or part.get("refusal"), "text")
        if index is None or not text:
            return []
        self.items[at].streamed = True
        return [TextDelta(index=index, text=text)]

    def _text_delta(self, at: int, event: dict[str, Any]) -> list[StreamEvent]:
        index = self._part(at, _index(event.get("content_index"), "content_index"))
        delta = _text(event.get("delta"), "delta")
        if event.get("type") == "response.refusal.delta":
            self.refused = True
        if index is None or not delta:
            return []
        self.items[at].streamed = True
        return [TextDelta(index=index, text=delta)]

    def _arguments(self, at: int, event: dict[str, Any]) -> list[StreamEvent]:
        done = event.get("type") == "response.function_call_arguments.done"
        item = self.items.get(at)
        if item is None:
            item = self.items[at] = _Item("function_call", self._alloc())
        if item.kind != "function_call" or (done and item.streamed):
            return []
        arguments = _text(event.get("arguments" if done else "delta"), "arguments")
        item.streamed = True
        return [ToolCallDelta(index=item.index, arguments=arguments)] if arguments else []

    def _summary(self, at: int, event: dict[str, Any]) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        if at not in self.items:
            out = self.added(at, {"type": "reasoning"})
        item = self.items[at]
        if item.kind != "reasoning":
            return out
        part = _index(event.get("summary_index", 0), "summary_index")
        delta = _text(event.get("delta"), "delta")
        gap = "\n\n" if item.summary is not None and part != item.summary else ""
        item.summary, item.streamed = part, True
        return [*out, ThinkingDelta(index=item.index, thinking=gap + delta)]

    def _done(self, at: int, event: dict[str, Any]) -> list[StreamEvent]:
        return self.done(at, _object(event.get("item"), "item"))

    def done(self, at: int, raw: dict[str, Any]) -> list[StreamEvent]:
        """Item ``at`` is complete: what its deltas did not bring, then its blocks stop."""
        out = self.added(at, raw)
        item = self.items[at]
        if item.kind == "reasoning":
            item.raw = raw
            if not item.streamed:
                summary = raw.get("summary") or []
                if not isinstance(summary, list):
                    raise ValueError(f"summary is not a list: {summary!r:.80}")
                texts = [_text(_object(s, "summary part").get("text"), "text") for s in summary]
                if any(texts):
                    out.append(ThinkingDelta(index=item.index, thinking="\n\n".join(texts)))
            return [*out, BlockStop(index=item.index)]
        if item.kind == "function_call":
            if not item.named:
                call_id, name = _text(raw.get("call_id"), "call_id"), _text(raw.get("name"), "name")
                out.append(ToolCallStart(index=item.index, id=call_id, name=name))
                item.named = True
            if not item.streamed:
                arguments = _text(raw.get("arguments"), "arguments")
                out.append(ToolCallDelta(index=item.index, arguments=arguments))
            return [*out, BlockStop(index=item.index)]
        if item.kind == "message":
            if not item.streamed:
                content = raw.get("content") or []
                if not isinstance(content, list):
                    raise ValueError(f"content is not a list: {content!r:.80}")
                for n, part in enumerate(content):
                    part = _object(part, "content part")
                    if part.get("type") not in _TEXT_PARTS:
                        continue
                    if part.get("type") == "refusal":
                        self.refused = True
                    index = self._part(at, n)
                    text = _text(part.get("text") or part.get("refusal"), "text")
                    if index is not None and text:
                        out.append(TextDelta(index=index, text=text))
            out += [BlockStop(index=i) for i in item.parts.values()]
        return out

    # --- the end ----------------------------------------------------------------------------

    def finish(self, response: dict[str, Any]) -> list[StreamEvent]:
        """The response is over (completed or incomplete): usage, stop reason, and the
        reasoning items as ``provider_data``."""
        self.stopped = True
        out: list[StreamEvent] = []
        found = usage_of(response.get("usage"))
        reasoning_tokens = 0
        if found is not None:
            usage, reasoning_tokens = found
            out.append(UsageUpdate(usage=usage))
        output = response.get("output")
        if isinstance(output, list):  # the complete items, for any whose .done did not come
            for at, raw in enumerate(output):
                item = self.items.get(at)
                if item is not None and item.kind == "reasoning" and item.raw is None:
                    item.raw = _object(raw, "output item")
        data: dict[str, Any] = {}
        reasoning = [i for _, i in sorted(self.items.items()) if i.kind == "reasoning"]
        if reasoning:
            data[REASONING] = [item.raw or {} for item in reasoning]
        if reasoning_tokens:
            data["reasoning_tokens"] = reasoning_tokens
        out.append(MessageStop(stop_reason=self._stop_reason(response), provider_data=data))
        return out

    def _stop_reason(self, response: dict[str, Any]) -> str:
        if response.get("status") == "incomplete":
            details = _object(response.get("incomplete_details"), "incomplete_details")
            reason = _text(details.get("reason"), "reason")
            return _INCOMPLETE.get(reason, reason or "max_tokens")
        if self.refused:
            return "refusal"
        if any(i.kind == "function_call" for i in self.items.values()):
            return "tool_use"
        return "end_turn"

    def response(self, response: Any) -> list[StreamEvent]:
        """A whole (non-streamed) response: its output items in order, then its end."""
        response = _object(response, "response")
        if response.get("status") == "failed":
            raise failure(self.provider, self.api_key, response.get("error"), "the response failed")
        output = response.get("output")
        if not isinstance(output, list):
            raise ValueError(f"output is not a list: {output!r:.80}")
        out = self.start(response)
        for at, item in enumerate(output):
            out += self.done(at, _object(item, "output item"))
        return out + self.finish(response)


_HANDLERS = {
    "response.output_item.added": _Translator._added,
    "response.output_item.done": _Translator._done,
    "response.content_part.added": _Translator._part_added,
    "response.output_text.delta": _Translator._text_delta,
    "response.refusal.delta": _Translator._text_delta,
    "response.function_call_arguments.delta": _Translator._arguments,
    "response.function_call_arguments.done": _Translator._arguments,
    "response.reasoning_summary_text.delta": _Translator._summary,
}
