"""OpenAI Chat Completions-compatible provider (OpenAI, Ollama, vLLM, llama.cpp, LM Studio).

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

Streaming is translated to :mod:`~app.agent.providers.base` events. Usage is requested with
``stream_options.include_usage`` and arrives in a last chunk with no choices. A stream that
ends without a ``finish_reason`` (connection dropped, server crashed) raises a retryable
:class:`ProviderError`: the attempt is a failed one and is never stored as replayable.

Stream faults are the provider's (docs/providers.md, "Stream faults"): a chunk that is not
valid JSON or not the chunk shape (``choices`` that is not a list) is ``retryable``
(``code: malformed_stream``); a 200 whose body is not an event stream (an HTML page; a body of
another type from which no event arrived) is ``fatal`` (``code: not_an_event_stream``).

Reasoning that compatible servers stream in ``reasoning_content`` (vLLM, DeepSeek) or
``reasoning`` (Ollama, OpenRouter) becomes a thinking block with an empty signature; it is not
sent back (no such request field).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import openai

from ..messages import (
    AnyMessage,
    AssistantMessage,
    Base64Source,
    ImageBlock,
    TextBlock,
    ToolCallBlock,
    ToolResultMessage,
    Usage,
    UserMessage,
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
    scrub,
    status_error,
)
from .base import (
    BlockStop,
    MessageStart,
    MessageStop,
    ProviderError,
    ProviderRequest,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolCallDelta,
    ToolCallStart,
    ToolSpec,
    UsageUpdate,
)

__all__ = ["OpenAIProvider", "build_messages", "build_tools"]


# --- request ------------------------------------------------------------------------------


def _image_url(block: ImageBlock) -> str:
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
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block)}})
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


def build_messages(system_prompt: str, messages: Sequence[AnyMessage]) -> list[dict[str, Any]]:
    """The Chat Completions ``messages`` array for a request."""
    out: list[dict[str, Any]] = []
    if system_prompt:
        out.append({"role": "system", "content": system_prompt})
    pending_images: list[dict[str, Any]] = []

    def flush_images() -> None:
        if pending_images:
            out.append({"role": "user", "content": list(pending_images)})
            pending_images.clear()

    for message in messages:
        if isinstance(message, ToolResultMessage):
            text = "".join(b.text for b in message.content if isinstance(b, TextBlock))
            images = [b for b in message.content if isinstance(b, ImageBlock)]
            if images:
                pending_images.append(
                    {
                        "type": "text",
                        "text": f"Image output of tool call {message.tool_call_id} "
                        f"({message.tool_name}):",
                    }
                )
                pending_images.extend(
                    {"type": "image_url", "image_url": {"url": _image_url(b)}} for b in images
                )
                if not text:
                    text = "(the image output follows in the next user message)"
            out.append({"role": "tool", "tool_call_id": message.tool_call_id, "content": text})
            continue
        flush_images()
        if isinstance(message, UserMessage):
            out.append({"role": "user", "content": _user_content(message.content)})
        else:
            out.append(_assistant(message))
    flush_images()
    return out


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


# --- response -----------------------------------------------------------------------------


def _get(obj: Any, name: str) -> Any:
    """A field of an SDK object or a dict; ``None`` when absent.

    The SDK builds response objects without validation, so a field a compatible server left
    out (Ollama's tool-call ``index``) is simply missing.
    """
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


def _usage(raw: Any) -> Usage | None:
    if raw is None:
        return None
    details = _get(raw, "prompt_tokens_details")
    return Usage(
        input_tokens=max(0, int(_get(raw, "prompt_tokens") or 0)),
        output_tokens=max(0, int(_get(raw, "completion_tokens") or 0)),
        cache_read_tokens=max(0, int(_get(details, "cached_tokens") or 0)),
    )


@dataclass
class _Call:
    index: int  # our block index
    id: str
    name: str


@dataclass
class _Translator:
    """Chat Completions chunks -> stream events, with stable block indexes."""

    next_index: int = 0
    thinking_index: int | None = None
    text_index: int | None = None
    calls: list[_Call] = field(default_factory=list)
    by_wire_index: dict[int, _Call] = field(default_factory=dict)
    finish_reason: str | None = None
    started: bool = False
    token: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    def _alloc(self) -> int:
        index = self.next_index
        self.next_index += 1
        return index

    def start(self, response_id: Any, model: Any) -> list[StreamEvent]:
        if self.started:
            return []
        self.started = True
        return [MessageStart(response_id=str(response_id or ""), model=str(model or ""))]

    def reasoning(self, text: str) -> list[StreamEvent]:
        if self.thinking_index is None:
            self.thinking_index = self._alloc()
        return [ThinkingDelta(index=self.thinking_index, thinking=text)]

    def text(self, text: str) -> list[StreamEvent]:
        if self.text_index is None:
            self.text_index = self._alloc()
        return [TextDelta(index=self.text_index, text=text)]

    def _new_call(self, call_id: str | None, name: str | None) -> tuple[_Call, list[StreamEvent]]:
        index = self._alloc()
        # A missing id (Ollama) gets one that is stable for this attempt and unique enough
        # not to collide with the ids of other attempts in the conversation.
        call = _Call(index, call_id or f"call_{self.token}_{len(self.calls)}", name or "")
        self.calls.append(call)
        return call, [ToolCallStart(index=index, id=call.id, name=call.name)]

    def tool_call(self, delta: Any) -> list[StreamEvent]:
        wire_index = _get(delta, "index")
        call_id = _get(delta, "id") or None
        function = _get(delta, "function")
        name = _get(function, "name") or None
        arguments = _get(function, "arguments")
        events: list[StreamEvent] = []
        call: _Call | None = None
        if isinstance(wire_index, int):
            call = self.by_wire_index.get(wire_index)
            if call is not None and call_id is not None and call_id != call.id:
                call = None  # a server reusing an index for a new call
        elif call_id is None and name is None and self.calls:
            call = self.calls[-1]  # no index, no id, no name: continues the last call
        elif call_id is not None:
            call = next((c for c in self.calls if c.id == call_id), None)
        if call is None:
            call, events = self._new_call(call_id, name)
            if isinstance(wire_index, int):
                self.by_wire_index[wire_index] = call
        elif name and not call.name:
            call.name = name
            events.append(ToolCallStart(index=call.index, id=call.id, name=name))
        if isinstance(arguments, str) and arguments:
            events.append(ToolCallDelta(index=call.index, arguments=arguments))
        return events

    def choice(self, choice: Any, delta: Any) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        for key in ("reasoning_content", "reasoning"):
            value = _get(delta, key)
            if isinstance(value, str) and value:
                events += self.reasoning(value)
                break
        content = _get(delta, "content")
        if isinstance(content, str) and content:
            events += self.text(content)
        for tool_call in _get(delta, "tool_calls") or ():
            events += self.tool_call(tool_call)
        reason = _get(choice, "finish_reason")
        if isinstance(reason, str) and reason:
            self.finish_reason = reason
        return events

    def stop(self) -> list[StreamEvent]:
        assert self.finish_reason is not None
        indexes = sorted(
            [i for i in (self.thinking_index, self.text_index) if i is not None]
            + [c.index for c in self.calls]
        )
        return [*(BlockStop(index=i) for i in indexes), MessageStop(stop_reason=self.finish_reason)]


# --- provider -----------------------------------------------------------------------------


class OpenAIProvider:
    """Chat Completions over the official ``openai`` SDK (``max_retries=0``: the agent retries)."""

    def __init__(
        self,
        api_key: str,
        base_url: str | None = None,
        model: str = "",
        timeout: float = 600.0,
        name: str = "openai",
        *,
        stream: bool = True,
    ) -> None:
        self.name = name
        self.model = model
        self.stream_mode = stream
        self._api_key = api_key
        # Official OpenAI wants ``max_completion_tokens`` (reasoning models refuse
        # ``max_tokens``); compatible servers mostly know only ``max_tokens``.
        self._max_tokens_field = "max_completion_tokens" if base_url is None else "max_tokens"
        self._client = openai.AsyncOpenAI(
            api_key=api_key, base_url=base_url, timeout=timeout, max_retries=0
        )

    async def aclose(self) -> None:
        await self._client.close()

    def _params(self, request: ProviderRequest) -> dict[str, Any]:
        params: dict[str, Any] = {
            "model": request.model or self.model,
            "messages": build_messages(request.system_prompt, request.messages),
        }
        if request.tools:
            params["tools"] = build_tools(request.tools)
        if request.max_output_tokens is not None:
            params[self._max_tokens_field] = request.max_output_tokens
        return params

    def _error(self, exc: BaseException) -> ProviderError | None:
        """``exc`` classified, or ``None`` for an exception that is not a provider failure."""
        if isinstance(exc, ProviderError):
            return exc
        if isinstance(exc, openai.APIStatusError):
            code, error_type, message = error_fields(exc.body)
            return status_error(
                self.name,
                exc.status_code,
                code=code,
                error_type=error_type,
                message=message or exc.message,
                headers=exc.response.headers,
                api_key=self._api_key,
            )
        if isinstance(exc, (openai.APIConnectionError, *TRANSPORT_ERRORS)):
            return connection_error(self.name, exc, self._api_key)
        if isinstance(exc, openai.APIError):
            # An error object inside an HTTP 200 stream (vLLM, LiteLLM, OpenRouter...): the
            # server failed half-way, which a retry may fix, unless the prompt did not fit.
            code, error_type, message = error_fields(exc.body)
            text = scrub(message or exc.message, self._api_key)
            overflow = code == "context_length_exceeded" or is_overflow_text(text)
            return ProviderError(
                "overflow" if overflow else "retryable",
                f"{self.name}: error in the stream: {text}",
                code=code or error_type,
            )
        return None

    async def _call(self, params: dict[str, Any], *, stream: bool) -> Any:
        try:
            if stream:
                return await self._client.chat.completions.create(
                    **params, stream=True, stream_options={"include_usage": True}
                )
            return await self._client.chat.completions.create(**params)
        except BODY_DECODE_ERRORS as exc:  # the SDK could not decode a JSON body
            raise malformed_error(self.name, exc, self._api_key) from None
        except Exception as exc:
            error = self._error(exc)
            if error is None:
                raise
            raise error from None

    def _chunk(self, translator: _Translator, chunk: Any) -> list[StreamEvent]:
        """The events of one chunk; a chunk that is not the documented shape is malformed."""
        try:
            if not hasattr(chunk, "model_extra") and not isinstance(chunk, dict):
                raise ValueError(f"a chunk that is not an object: {chunk!r:.80}")
            choices = _get(chunk, "choices")
            if choices is not None and not isinstance(choices, list):
                raise ValueError(f"choices is not a list: {choices!r:.80}")
            events = translator.start(_get(chunk, "id"), _get(chunk, "model"))
            usage = _usage(_get(chunk, "usage"))
            for choice in choices or ():
                if (_get(choice, "index") or 0) != 0:
                    continue  # n > 1 is never requested
                events += translator.choice(choice, _get(choice, "delta"))
            if usage is not None:
                events.append(UsageUpdate(usage=usage))
        except DECODE_ERRORS as exc:
            raise malformed_error(self.name, exc, self._api_key) from None
        return events

    async def stream(self, request: ProviderRequest) -> AsyncIterator[StreamEvent]:
        params = self._params(request)
        if not self.stream_mode:
            async for event in self._complete(params):
                yield event
            return
        translator = _Translator()
        chunks = await self._call(params, stream=True)
        async with chunks:
            try:
                media = await check_event_stream(self.name, chunks.response, self._api_key)
            except Exception as exc:  # reading the body: a ProviderError, or a dropped line
                error = self._error(exc)
                if error is None:
                    raise
                raise error from None
            iterator = aiter(chunks)
            received = 0
            while True:
                try:
                    chunk = await anext(iterator)
                    received += 1
                except StopAsyncIteration:
                    if not received:
                        status = chunks.response.status_code
                        error = no_events_error(self.name, status, media)
                        if error is not None:
                            raise error from None
                    break
                except DECODE_ERRORS as exc:  # the SDK could not decode an event
                    raise malformed_error(self.name, exc, self._api_key) from None
                except Exception as exc:
                    error = self._error(exc)
                    if error is None:
                        raise
                    raise error from None
                for event in self._chunk(translator, chunk):
                    yield event
        if translator.finish_reason is None:
            raise ProviderError(
                "retryable", f"{self.name}: the stream ended before a finish_reason"
            )
        for event in translator.stop():
            yield event

    async def _complete(self, params: dict[str, Any]) -> AsyncIterator[StreamEvent]:
        response = await self._call(params, stream=False)
        if isinstance(response, str):  # the SDK hands over a body that is not JSON as text
            raise not_a_response(self.name, response, self._api_key)
        translator = _Translator()
        for event in translator.start(_get(response, "id"), _get(response, "model")):
            yield event
        try:
            choices = _get(response, "choices") or []
            if not isinstance(choices, list):
                raise ValueError(f"choices is not a list: {choices!r:.80}")
            if not choices:
                raise ProviderError(
                    "retryable", f"{self.name}: the response has no choices", code="no_choices"
                )
            choice = choices[0]
            events = translator.choice(choice, _get(choice, "message"))
            usage = _usage(_get(response, "usage"))
        except DECODE_ERRORS as exc:
            raise malformed_error(self.name, exc, self._api_key) from None
        for event in events:
            yield event
        if usage is not None:
            yield UsageUpdate(usage=usage)
        if translator.finish_reason is None:
            translator.finish_reason = "tool_calls" if translator.calls else "stop"
        for event in translator.stop():
            yield event
