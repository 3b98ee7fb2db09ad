"""Anthropic Messages provider.

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

Streaming: every raw SSE event is translated (``ping`` and unknown events ignored). The
stored ``arguments`` of a streamed call is the concatenation of its ``input_json_delta``
fragments, verbatim: that is what the model wrote. A call that streamed no fragment gets
the compact JSON of the ``input`` of its ``content_block_start`` (``"{}"``). Non-streaming
(``stream=False``) has only the parsed object: ``arguments`` is then
``json.dumps(input, separators=(",", ":"), ensure_ascii=False)``, the same bytes as the
compact JSON of the response body, with key order kept.

Errors: HTTP errors are classified in :mod:`._http`; an ``error`` event after HTTP 200 is
classified by its error type (``overloaded_error`` -> retryable, ...); stop_reason
``model_context_window_exceeded`` is an overflow; a stream that ends before
``message_stop`` is retryable (its thinking blocks may lack their signature).

Stream faults are the provider's (docs/providers.md, "Stream faults"): an event whose data is
not valid JSON is ``retryable`` (``code: malformed_stream``); well-formed events in an order the
Messages API never sends — anything but ``ping`` before ``message_start``, a second
``message_start``, a ``content_block_delta`` or ``content_block_stop`` for a block that has not
started (or has stopped), a block started twice, a delta of another block's type — are
``fatal`` (``code: protocol_error``); a 200 whose body is not an event stream (an HTML page; a
body of another type from which no event arrived) is ``fatal`` (``code:
not_an_event_stream``).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import anthropic

from ..messages import (
    AnyMessage,
    AssistantMessage,
    Base64Source,
    ImageBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
    ToolResultMessage,
    Usage,
)
from ._http import (
    BODY_DECODE_ERRORS,
    DECODE_ERRORS,
    TRANSPORT_ERRORS,
    check_event_stream,
    connection_error,
    error_fields,
    is_overflow_text,
    malformed_error,
    no_events_error,
    not_a_response,
    protocol_error,
    scrub,
    status_error,
)
from .base import (
    BlockStop,
    MessageStart,
    MessageStop,
    ProviderError,
    ProviderRequest,
    RedactedThinking,
    SignatureDelta,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolCallDelta,
    ToolCallStart,
    ToolSpec,
    UsageUpdate,
)

__all__ = [
    "AnthropicProvider",
    "build_messages",
    "build_tools",
    "continues_unthinking_loop",
    "tool_input",
]

OVERFLOW_STOP = "model_context_window_exceeded"

# error type of an ``error`` event (sent after HTTP 200) -> (class, the equivalent status)
_EVENT_ERRORS: dict[str, tuple[str, int]] = {
    "overloaded_error": ("retryable", 529),
    "api_error": ("retryable", 500),
    "rate_limit_error": ("retryable", 429),
    "timeout_error": ("retryable", 504),
    "invalid_request_error": ("fatal", 400),
    "authentication_error": ("fatal", 401),
    "billing_error": ("fatal", 402),
    "permission_error": ("fatal", 403),
    "not_found_error": ("fatal", 404),
    "request_too_large": ("fatal", 413),
}

_BAD_ID_CHARS = re.compile(r"[^A-Za-z0-9_-]")
_DATA_URL = re.compile(r"^data:([^;,]+);base64,(.*)$", re.DOTALL)


# --- request ------------------------------------------------------------------------------


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


def build_messages(messages: Sequence[AnyMessage]) -> list[dict[str, Any]]:
    """The Messages API ``messages`` array: alternating turns, no empty block or turn."""
    turns: list[dict[str, Any]] = []
    for message in messages:
        if isinstance(message, AssistantMessage):
            role, blocks = "assistant", _assistant_blocks(message)
        elif isinstance(message, ToolResultMessage):
            role, blocks = "user", [_tool_result(message)]
        else:
            role, blocks = "user", _user_blocks(message.content)
        if not blocks:
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    return turns


def continues_unthinking_loop(turns: Sequence[dict[str, Any]]) -> bool:
    """Do ``turns`` end inside a tool loop whose assistant turn has no thinking block first?

    That is: the last (user) turn holds ``tool_result`` blocks and the assistant turn before it
    does not start with ``thinking`` / ``redacted_thinking`` — Anthropic then refuses a
    request with thinking enabled.
    """
    if len(turns) < 2 or turns[-1]["role"] != "user":
        return False
    if not any(b.get("type") == "tool_result" for b in turns[-1]["content"]):
        return False
    assistant = turns[-2]["content"]
    return not assistant or assistant[0].get("type") not in ("thinking", "redacted_thinking")


def build_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools
    ]


# --- response -----------------------------------------------------------------------------


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


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


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
            merged[wire] = value
    return merged


def _usage(wire: dict[str, int]) -> Usage:
    """Normalized usage: Anthropic's ``input_tokens`` leaves out cached tokens, ours counts the
    whole input (see :class:`~app.agent.messages.Usage`)."""
    cache_write = wire.get("cache_creation_input_tokens", 0)
    cache_read = wire.get("cache_read_input_tokens", 0)
    return Usage(
        input_tokens=wire.get("input_tokens", 0) + cache_write + cache_read,
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
                    ToolCallDelta(index=index, arguments=_compact(self.tool_inputs[index] or {}))
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


# --- provider -----------------------------------------------------------------------------


class AnthropicProvider:
    """Anthropic Messages over the official ``anthropic`` SDK (``max_retries=0``)."""

    def __init__(
        self,
        api_key: str,
        base_url: str | None = None,
        model: str = "",
        max_tokens: int = 4096,
        timeout: float = 600.0,
        thinking_budget: int | None = None,
        name: str = "anthropic",
        *,
        stream: bool = True,
    ) -> None:
        self.name = name
        self.model = model
        self.max_tokens = max_tokens
        self.thinking_budget = thinking_budget
        self.stream_mode = stream
        self._api_key = api_key
        self._client = anthropic.AsyncAnthropic(
            api_key=api_key, base_url=base_url, timeout=timeout, max_retries=0
        )

    async def aclose(self) -> None:
        await self._client.close()

    def _params(self, request: ProviderRequest) -> dict[str, Any]:
        params: dict[str, Any] = {
            "model": request.model or self.model,
            "max_tokens": request.max_output_tokens or self.max_tokens,
            "messages": build_messages(request.messages),
        }
        if request.system_prompt:
            params["system"] = request.system_prompt
        if request.tools:
            params["tools"] = build_tools(request.tools)
        if self.thinking_budget and not continues_unthinking_loop(params["messages"]):
            params["thinking"] = {"type": "enabled", "budget_tokens": self.thinking_budget}
        return params

    def _error(self, exc: BaseException) -> ProviderError | None:
        if isinstance(exc, ProviderError):
            return exc
        if isinstance(exc, anthropic.APIStatusError):
            _, error_type, message = error_fields(exc.body)
            text = message or exc.message
            if exc.status_code < 400:
                return self._event_error(error_type, text)
            return status_error(
                self.name,
                exc.status_code,
                code=None,
                error_type=error_type,
                message=text,
                headers=exc.response.headers,
                api_key=self._api_key,
            )
        if isinstance(exc, (anthropic.APIConnectionError, *TRANSPORT_ERRORS)):
            return connection_error(self.name, exc, self._api_key)
        if isinstance(exc, anthropic.APIError):
            return ProviderError("retryable", f"{self.name}: {scrub(exc.message, self._api_key)}")
        return None

    def _event_error(self, error_type: str | None, message: str) -> ProviderError:
        """An ``error`` event sent after HTTP 200, classified by its error type."""
        kind, status = _EVENT_ERRORS.get(error_type or "", ("retryable", None))
        if error_type == "invalid_request_error" and is_overflow_text(message):
            kind = "overflow"
        return ProviderError(
            "overflow" if kind == "overflow" else "fatal" if kind == "fatal" else "retryable",
            f"{self.name}: error event {error_type or 'unknown'}: {scrub(message, self._api_key)}",
            status=status,
            code=error_type,
        )

    def _raise(self, exc: Exception) -> ProviderError:
        error = self._error(exc)
        if error is None:
            raise exc
        return error

    async def stream(self, request: ProviderRequest) -> AsyncIterator[StreamEvent]:
        params = self._params(request)
        if not self.stream_mode:
            async for event in self._complete(params):
                yield event
            return
        translator = _Translator(provider=self.name)
        try:
            events = await self._client.messages.create(**params, stream=True)
        except BODY_DECODE_ERRORS as exc:  # the SDK could not decode a JSON body
            raise malformed_error(self.name, exc, self._api_key) from None
        except Exception as exc:
            raise self._raise(exc) from None
        async with events:
            try:
                media = await check_event_stream(self.name, events.response, self._api_key)
            except Exception as exc:  # reading the body: a ProviderError, or a dropped line
                raise self._raise(exc) from None
            iterator = aiter(events)
            received = 0
            while True:
                try:
                    event = await anext(iterator)
                    received += 1
                except StopAsyncIteration:
                    if not received:
                        status = events.response.status_code
                        error = no_events_error(self.name, status, media)
                        if error is not None:
                            raise error from None
                    break
                except DECODE_ERRORS as exc:  # the SDK could not decode an event
                    raise malformed_error(self.name, exc, self._api_key) from None
                except Exception as exc:
                    raise self._raise(exc) from None
                try:
                    translated = translator.event(event)
                except DECODE_ERRORS as exc:  # an event of a shape the API never sends
                    raise malformed_error(self.name, exc, self._api_key) from None
                for out in translated:
                    if isinstance(out, MessageStop) and translator.stop_reason == OVERFLOW_STOP:
                        raise self._overflow_stop()
                    yield out
                if translator.stopped:
                    break
        if not translator.stopped:
            raise ProviderError("retryable", f"{self.name}: the stream ended before message_stop")

    def _overflow_stop(self) -> ProviderError:
        return ProviderError(
            "overflow", f"{self.name}: the model stopped: {OVERFLOW_STOP}", code=OVERFLOW_STOP
        )

    async def _complete(self, params: dict[str, Any]) -> AsyncIterator[StreamEvent]:
        try:
            response = await self._client.messages.create(**params)
        except BODY_DECODE_ERRORS as exc:  # the SDK could not decode a JSON body
            raise malformed_error(self.name, exc, self._api_key) from None
        except Exception as exc:
            raise self._raise(exc) from None
        if isinstance(response, str):  # the SDK hands over a body that is not JSON as text
            raise not_a_response(self.name, response, self._api_key)
        usage = _usage(_merge_usage({}, _get(response, "usage")))
        yield MessageStart(
            response_id=str(_get(response, "id") or ""), model=str(_get(response, "model") or "")
        )
        for index, block in enumerate(_get(response, "content") or ()):
            kind = _get(block, "type")
            if kind == "text":
                text = _get(block, "text")
                if text:
                    yield TextDelta(index=index, text=text)
            elif kind == "thinking":
                yield ThinkingDelta(index=index, thinking=_get(block, "thinking") or "")
                yield SignatureDelta(index=index, signature=_get(block, "signature") or "")
            elif kind == "redacted_thinking":
                yield RedactedThinking(index=index, data=_get(block, "data") or "")
            elif kind == "tool_use":
                yield ToolCallStart(
                    index=index,
                    id=str(_get(block, "id") or ""),
                    name=str(_get(block, "name") or ""),
                )
                yield ToolCallDelta(index=index, arguments=_compact(_get(block, "input") or {}))
            else:
                continue
            yield BlockStop(index=index)
        yield UsageUpdate(usage=usage)
        reason = _get(response, "stop_reason") or "end_turn"
        if reason == OVERFLOW_STOP:
            raise self._overflow_stop()
        yield MessageStop(stop_reason=str(reason))
