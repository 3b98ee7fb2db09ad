"""Anthropic Messages provider: the client (:class:`AnthropicProvider`).

Errors: HTTP errors are classified in :mod:`.._http`; an ``error`` event after HTTP 200 is
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

from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import anthropic
from anthropic._models import FinalRequestOptions
from anthropic.types import Message
from opentelemetry import trace

from ...codec import compact_json
from .._http import (
    DECODE_ERRORS,
    TRANSPORT_ERRORS,
    connection_error,
    error_fields,
    is_overflow_text,
    malformed_error,
    not_a_response,
    scrub,
    status_error,
)
from .._prepared import PreparedPost, Sdk
from .._sdk import TIMEOUT_ERRORS, drain, events, send, timeout_error
from .._transport import sdk_http_client
from ..base import (
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
    Timeouts,
    ToolCallDelta,
    ToolCallStart,
    UsageUpdate,
)
from ..wire import Body, splice
from .request import MESSAGES, MessagesEncoded, build_tools
from .stream import _get, _merge_usage, _Translator, _usage

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


def _timeout_error(
    client: anthropic.AsyncAnthropic, request: Any, exc: Exception
) -> anthropic.APITimeoutError:
    """The SDK's own timeout error (naming the limit passed, where the SDK knows how)."""
    make = getattr(client, "_make_timeout_error", None)
    return anthropic.APITimeoutError(request=request) if make is None else make(request, exc)


def _connection_error(
    client: anthropic.AsyncAnthropic, request: Any, exc: Exception
) -> anthropic.APIConnectionError:
    """The SDK's own connection error (naming the host and reason, where the SDK knows how)."""
    make = getattr(client, "_make_connection_error", None)
    return anthropic.APIConnectionError(request=request) if make is None else make(request, exc)


def _direct(client: anthropic.AsyncAnthropic) -> bool:
    """Whether nothing in ``client`` decides per request: no auth of its own (credentials,
    tokens), no middleware."""
    return client.custom_auth is None and not getattr(client, "_middleware", None)


def _traced(client: anthropic.AsyncAnthropic) -> bool:
    """Whether ``client``'s next call has a span that records or carries a trace to the
    provider: the SDK has a tracer and OpenTelemetry's global tracer provider is set (until
    it is, its spans are non-recording, with no trace context to propagate). Asked per
    request: telemetry may be configured after a client's first request."""
    return getattr(client, "_tracer", None) is not None and not isinstance(
        trace.get_tracer_provider(), trace.ProxyTracerProvider
    )


def _anthropic(client: anthropic.AsyncAnthropic) -> Sdk:
    """How the ``anthropic`` SDK wraps a transport failure of ``client``'s requests."""
    return Sdk(
        timeout_error=lambda request, exc: _timeout_error(client, request, exc),
        connection_error=lambda request, exc: _connection_error(client, request, exc),
        direct=_direct,
        options=FinalRequestOptions,
        now=_traced,
    )


class AnthropicProvider:
    """Anthropic Messages over the official ``anthropic`` SDK (``max_retries=0``).

    The body is built from the messages' carried-over encoding (``wire``, :mod:`..wire`) and
    posted as it is (bytes, or a long body's parts), with the request the SDK built for the path
    the first time (:mod:`.._prepared`); the SDK decodes the answer, it does not re-encode it."""

    wire = MESSAGES

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
        timeouts: Timeouts | None = None,
    ) -> None:
        self.name = name
        self.model = model
        self.max_tokens = max_tokens
        self.thinking_budget = thinking_budget
        self.stream_mode = stream
        self._api_key = api_key
        # ``timeouts`` (a profile's) win; ``timeout`` alone bounds every wait
        self.timeouts = timeouts or Timeouts(connect=min(10.0, timeout), idle=timeout)
        self._client = anthropic.AsyncAnthropic(
            api_key=api_key,
            base_url=base_url,
            timeout=anthropic.Timeout(self.timeouts.idle, connect=self.timeouts.connect),
            max_retries=0,
            http_client=sdk_http_client(
                anthropic.DEFAULT_TIMEOUT, anthropic.DEFAULT_CONNECTION_LIMITS
            ),
        )
        # sent with the request the SDK built the first time (.._prepared)
        self._post = PreparedPost(self._client, "/v1/messages", _anthropic(self._client))

    async def aclose(self) -> None:
        await self._client.close()

    def _body(self, request: ProviderRequest, *, stream: bool) -> bytes | Body:
        """The request body: the messages' encoded pieces joined, the other fields around."""
        encoded = request.encoded
        if not isinstance(encoded, MessagesEncoded):
            encoded = MESSAGES.encode(request.messages)
        params: dict[str, Any] = {
            "model": request.model or self.model,
            "max_tokens": request.max_output_tokens or self.max_tokens,
        }
        if request.system_prompt:
            params["system"] = request.system_prompt
        if request.tools:
            params["tools"] = build_tools(request.tools)
        if self.thinking_budget and not encoded.continues_unthinking_loop:
            params["thinking"] = {"type": "enabled", "budget_tokens": self.thinking_budget}
        if request.temperature is not None:
            params["temperature"] = request.temperature
        if request.output_schema is not None:  # Anthropic's structured outputs
            params["output_config"] = {
                "format": {"type": "json_schema", "schema": request.output_schema.schema}
            }
        if stream:
            params["stream"] = True
        return splice(params, "messages", encoded.messages())

    async def _call(self, body: bytes | Body, *, stream: bool) -> Any:
        return await send(
            self.name,
            self._api_key,
            self._error,
            self._post(
                body,
                cast_to=Message,
                stream=stream,
                # each event as the SDK decoded it (a dict), as the OpenAI provider does: no
                # model built per event (docs/performance.md)
                stream_cls=anthropic.AsyncStream[object],
            ),
        )

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
        if isinstance(exc, (anthropic.APITimeoutError, *TIMEOUT_ERRORS)):
            return timeout_error(self.name, exc, self.timeouts)
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

    async def stream(self, request: ProviderRequest) -> AsyncIterator[StreamEvent]:
        if not self.stream_mode:
            async for event in self._complete(self._body(request, stream=False)):
                yield event
            return
        translator = _Translator(provider=self.name)
        stream = await self._call(self._body(request, stream=True), stream=True)
        async with aclosing(events(self.name, self._api_key, self._error, stream)) as received:
            async for event in received:
                try:
                    translated = translator.read(event)
                except DECODE_ERRORS as exc:  # an event of a shape the API never sends
                    raise malformed_error(self.name, exc, self._api_key) from None
                for out in translated:
                    if isinstance(out, MessageStop) and translator.stop_reason == OVERFLOW_STOP:
                        raise self._overflow_stop()
                    yield out
                if translator.stopped:
                    break
            if translator.stopped:  # the body's end, read: its connection is reused
                await drain(received)
        if not translator.stopped:
            raise ProviderError("retryable", f"{self.name}: the stream ended before message_stop")

    def _overflow_stop(self) -> ProviderError:
        return ProviderError(
            "overflow", f"{self.name}: the model stopped: {OVERFLOW_STOP}", code=OVERFLOW_STOP
        )

    async def _complete(self, body: bytes | Body) -> AsyncIterator[StreamEvent]:
        response = await self._call(body, stream=False)
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
                yield ToolCallDelta(index=index, arguments=compact_json(_get(block, "input") or {}))
            else:
                continue
            yield BlockStop(index=index)
        yield UsageUpdate(usage=usage)
        reason = _get(response, "stop_reason") or "end_turn"
        if reason == OVERFLOW_STOP:
            raise self._overflow_stop()
        yield MessageStop(stop_reason=str(reason))
