"""OpenAI Responses provider: the client (:class:`OpenAIResponsesProvider`).

Every request is stateless: ``POST {base_url}/responses`` with ``store: false``, ``include:
["reasoning.encrypted_content"]`` and the whole context as ``input`` (:mod:`.request`), so
nothing is kept at OpenAI and the reasoning items come back complete, to be replayed as they
were received. The system prompt is ``instructions``; ``max_output_tokens``, ``temperature``
and a run's output schema (``text.format``, ``json_schema``) are sent when set.

Errors are the ``openai`` SDK's, classified as for Chat Completions (:mod:`..openai.sdk`); a
``response.failed`` event, an ``error`` event and a non-streamed response with ``status:
failed`` are classified by their error code (:func:`.stream.failure`). Stream faults are the
provider's (docs/providers.md, "Stream faults"): an event that is not valid JSON or not the
documented shape is ``retryable`` (``code: malformed_stream``); a stream that ends before
``response.completed`` / ``response.incomplete`` is ``retryable`` (its reasoning items may be
incomplete); a 200 whose body is not an event stream (an HTML page; a body of another type
from which no event arrived) is ``fatal`` (``code: not_an_event_stream``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from .._http import DECODE_ERRORS, malformed_error, not_a_response
from .._sdk import events
from ..base import ProviderError, ProviderRequest, StreamEvent
from ..openai.sdk import OpenAISdkProvider
from ..wire import Body, splice
from .request import RESPONSES, ResponsesEncoded, build_tools
from .stream import _Translator

#: what every request asks to be sent back: the reasoning, encrypted, to replay it statelessly
INCLUDE = ("reasoning.encrypted_content",)


class OpenAIResponsesProvider(OpenAISdkProvider):
    """The Responses API over the official ``openai`` SDK (``max_retries=0``: the agent
    retries).

    The body is built from the messages' carried-over encoding (``wire``, :mod:`..wire`) and
    posted as it is (bytes, or a long body's parts), with the request the SDK built for the path
    the first time (:mod:`.._prepared`); the SDK decodes the answer, it does not re-encode it."""

    default_name = "openai-responses"
    wire = RESPONSES

    def _body(self, request: ProviderRequest, *, stream: bool) -> bytes | Body:
        """The request body: the messages' encoded items joined, the other fields around."""
        params: dict[str, Any] = {
            "model": request.model or self.model,
            "store": False,
            "include": list(INCLUDE),
        }
        if request.system_prompt:
            params["instructions"] = request.system_prompt
        if request.tools:
            params["tools"] = build_tools(request.tools)
        if request.max_output_tokens is not None:
            params["max_output_tokens"] = request.max_output_tokens
        if request.temperature is not None:
            params["temperature"] = request.temperature
        if request.output_schema is not None:
            params["text"] = {"format": {"type": "json_schema", **request.output_schema.dump()}}
        if stream:
            params["stream"] = True
        encoded = request.encoded
        if not isinstance(encoded, ResponsesEncoded):
            encoded = RESPONSES.encode(request.messages)
        return splice(params, "input", encoded.input())

    async def _call(self, body: bytes | Body, *, stream: bool) -> Any:
        # ``object``: the answer (or each event) as the SDK decoded it, a dict; no SDK model
        return await self._sdk.post("/responses", body, stream=stream, cast_to=object)

    def _translate(self, translate: Any, value: Any) -> list[StreamEvent]:
        """``translate(value)``; a value that is not the documented shape is malformed."""
        try:
            out: list[StreamEvent] = translate(value)
        except DECODE_ERRORS as exc:
            raise malformed_error(self.name, exc, self._api_key) from None
        return out

    async def stream(self, request: ProviderRequest) -> AsyncIterator[StreamEvent]:
        translator = _Translator(provider=self.name, api_key=self._api_key)
        if not self.stream_mode:
            response = await self._call(self._body(request, stream=False), stream=False)
            if isinstance(response, str):  # the SDK hands over a body that is not JSON as text
                raise not_a_response(self.name, response, self._api_key)
            for event in self._translate(translator.response, response):
                yield event
            return
        received = await self._call(self._body(request, stream=True), stream=True)
        async with aclosing(events(self.name, self._api_key, self._error, received)) as sse:
            async for data in sse:
                for event in self._translate(translator.event, data):
                    yield event
                if translator.stopped:
                    break
        if not translator.stopped:
            raise ProviderError(
                "retryable", f"{self.name}: the stream ended before response.completed"
            )
