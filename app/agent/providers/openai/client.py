"""OpenAI Chat Completions provider: the client (:class:`OpenAIProvider`).

A stream that ends without a ``finish_reason`` (connection dropped, server crashed) raises a
retryable :class:`ProviderError`: the attempt is a failed one and is never stored as
replayable.

Stream faults are the provider's (docs/providers.md, "Stream faults"): a chunk that is not
valid JSON or not the chunk shape (``choices`` that is not a list) is ``retryable``
(``code: malformed_stream``); a 200 whose body is not an event stream (an HTML page; a body of
another type from which no event arrived) is ``fatal`` (``code: not_an_event_stream``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from openai.types.chat import ChatCompletion

from .._http import DECODE_ERRORS, malformed_error, not_a_response
from .._sdk import events
from ..base import ProviderError, ProviderRequest, StreamEvent, UsageUpdate
from ..wire import Body, splice
from .request import CHAT, ChatEncoded, build_tools
from .sdk import OpenAISdkProvider
from .stream import _get, _Translator, _usage


class OpenAIProvider(OpenAISdkProvider):
    """Chat Completions over the official ``openai`` SDK (``max_retries=0``: the agent retries).

    The body is built from the messages' carried-over encoding (``wire``, :mod:`..wire`) and
    posted as it is (bytes, or a long body's parts), with the request the SDK built for the path
    the first time (:mod:`.._prepared`); the SDK decodes the answer, it does not re-encode it."""

    default_name = "openai"
    wire = CHAT

    @property
    def _max_tokens_field(self) -> str:
        # Official OpenAI wants ``max_completion_tokens`` (reasoning models refuse
        # ``max_tokens``); compatible servers mostly know only ``max_tokens``.
        return "max_completion_tokens" if self.base_url is None else "max_tokens"

    def _body(self, request: ProviderRequest, *, stream: bool) -> bytes | Body:
        """The request body: the messages' encoded pieces joined, the other fields around."""
        params: dict[str, Any] = {"model": request.model or self.model}
        if request.tools:
            params["tools"] = build_tools(request.tools)
        if request.max_output_tokens is not None:
            params[self._max_tokens_field] = request.max_output_tokens
        if request.temperature is not None:
            params["temperature"] = request.temperature
        if request.output_schema is not None:
            params["response_format"] = {
                "type": "json_schema",
                "json_schema": request.output_schema.dump(),
            }
        if stream:
            params["stream"] = True
            params["stream_options"] = {"include_usage": True}
        encoded = request.encoded
        if not isinstance(encoded, ChatEncoded):
            encoded = CHAT.encode(request.messages)
        return splice(params, "messages", encoded.messages(request.system_prompt))

    async def _call(self, body: bytes | Body, *, stream: bool) -> Any:
        # each chunk as the SDK decoded it (a dict): the translator reads dicts and SDK objects
        # alike (stream._get)
        return await self._sdk.post(
            "/chat/completions", body, stream=stream, cast_to=ChatCompletion
        )

    def _chunk(self, translator: _Translator, chunk: Any) -> list[StreamEvent]:
        """The events of one chunk; a chunk that is not the documented shape is malformed."""
        if type(chunk) is dict:  # as the SDK decodes it: a piece of text, mostly
            events = translator.text_chunk(chunk)
            if events is not None:
                return events
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
        if not self.stream_mode:
            async for event in self._complete(self._body(request, stream=False)):
                yield event
            return
        translator = _Translator()
        chunks = await self._call(self._body(request, stream=True), stream=True)
        async with aclosing(events(self.name, self._api_key, self._error, chunks)) as received:
            async for chunk in received:
                for event in self._chunk(translator, chunk):
                    yield event
        if translator.finish_reason is None:
            raise ProviderError(
                "retryable", f"{self.name}: the stream ended before a finish_reason"
            )
        for event in translator.stop():
            yield event

    async def _complete(self, body: bytes | Body) -> AsyncIterator[StreamEvent]:
        response = await self._call(body, stream=False)
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
