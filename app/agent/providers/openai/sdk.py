"""The ``openai`` SDK client both OpenAI providers send through (Chat Completions and Responses).

One client per provider instance, with the SDK's retries off (``max_retries=0``: the agent has
one retry policy) and the profile's connect and idle timeouts. A request body is posted as the
bytes the provider built from its encoded pieces (:mod:`..wire`), so the SDK neither walks nor
encodes the history; its HTTP client, authentication, headers, error types and stream decoding
stay the SDK's. A path's requests after its first are sent with the URL and headers the SDK
built for it (:mod:`.._prepared`). A streamed answer is read as the SDK decodes each event, a
dict (``stream_cls = AsyncStream[object]``): building an SDK model per chunk was most of the
CPU a streamed request cost (docs/performance.md).

:meth:`OpenAISdk.error` classifies what the SDK raises, the same way for both APIs.
"""

from __future__ import annotations

from typing import Any, ClassVar

import openai
from openai._models import FinalRequestOptions

from .._http import TRANSPORT_ERRORS, connection_error, error_fields, is_overflow_text, scrub
from .._http import status_error as _status_error
from .._prepared import PreparedPost, Sdk
from .._sdk import TIMEOUT_ERRORS, send, timeout_error
from .._transport import sdk_http_client
from ..base import ProviderError, Timeouts
from ..wire import Body


def _direct(client: openai.AsyncOpenAI) -> bool:
    """Whether nothing in ``client`` decides per request: no refreshed key, workload
    identity, provider runtime or custom auth (Carryover passes a key as a string)."""
    return (
        all(
            getattr(client, name, None) is None
            for name in ("_api_key_provider", "_workload_identity_auth", "_provider_runtime")
        )
        and client.custom_auth is None
    )


#: how the ``openai`` SDK wraps a transport failure (``AsyncAPIClient.request``)
OPENAI = Sdk(
    timeout_error=lambda request, exc: openai.APITimeoutError(request=request),
    connection_error=lambda request, exc: openai.APIConnectionError(request=request),
    direct=_direct,
    options=FinalRequestOptions,
)


class OpenAISdk:
    """An ``openai.AsyncOpenAI`` client, its error classification and its ``post``."""

    def __init__(self, name: str, api_key: str, base_url: str | None, timeouts: Timeouts) -> None:
        self.name = name
        self.api_key = api_key
        self.timeouts = timeouts
        self.client = openai.AsyncOpenAI(
            api_key=api_key,
            base_url=base_url,
            timeout=openai.Timeout(timeouts.idle, connect=timeouts.connect),
            max_retries=0,
            http_client=sdk_http_client(openai.DEFAULT_TIMEOUT, openai.DEFAULT_CONNECTION_LIMITS),
        )
        self._posts: dict[str, PreparedPost] = {}

    async def aclose(self) -> None:
        await self.client.close()

    def error(self, exc: BaseException) -> ProviderError | None:
        """``exc`` classified, or ``None`` for an exception that is not a provider failure."""
        if isinstance(exc, ProviderError):
            return exc
        if isinstance(exc, openai.APIStatusError):
            code, error_type, message = error_fields(exc.body)
            return _status_error(
                self.name,
                exc.status_code,
                code=code,
                error_type=error_type,
                message=message or exc.message,
                headers=exc.response.headers,
                api_key=self.api_key,
            )
        if isinstance(exc, (openai.APITimeoutError, *TIMEOUT_ERRORS)):
            return timeout_error(self.name, exc, self.timeouts)
        if isinstance(exc, (openai.APIConnectionError, *TRANSPORT_ERRORS)):
            return connection_error(self.name, exc, self.api_key)
        if isinstance(exc, openai.APIError):
            # An error object inside an HTTP 200 stream (vLLM, LiteLLM, OpenRouter...): the
            # server failed half-way, which a retry may fix, unless the prompt did not fit.
            code, error_type, message = error_fields(exc.body)
            return stream_error(self.name, self.api_key, code or error_type, message or exc.message)
        return None

    async def post(self, path: str, body: bytes | Body, *, stream: bool, cast_to: Any) -> Any:
        """The SDK's answer to ``POST path`` with ``body``; its failures as
        :class:`ProviderError`. Streamed: an ``AsyncStream`` of dicts. Sent with the request
        the SDK built for ``path`` the first time (:mod:`.._prepared`)."""
        post = self._posts.get(path)
        if post is None:
            post = self._posts[path] = PreparedPost(self.client, path, OPENAI)
        return await send(
            self.name,
            self.api_key,
            self.error,
            post(body, stream=stream, cast_to=cast_to, stream_cls=openai.AsyncStream[object]),
        )


class OpenAISdkProvider:
    """What both OpenAI providers are built of: a name (stored on every message they produce),
    the profile's model, streaming mode and timeouts, and their :class:`OpenAISdk` client."""

    #: the provider's name when none is given
    default_name: ClassVar[str]

    def __init__(
        self,
        api_key: str,
        base_url: str | None = None,
        model: str = "",
        timeout: float = 600.0,
        name: str = "",
        *,
        stream: bool = True,
        timeouts: Timeouts | None = None,
    ) -> None:
        self.name = name or self.default_name
        self.model = model
        self.base_url = base_url
        self.stream_mode = stream
        self._api_key = api_key
        # ``timeouts`` (a profile's) win; ``timeout`` alone bounds every wait
        self.timeouts = timeouts or Timeouts(connect=min(10.0, timeout), idle=timeout)
        self._sdk = OpenAISdk(self.name, api_key, base_url, self.timeouts)
        self._error = self._sdk.error

    async def aclose(self) -> None:
        await self._sdk.aclose()


def stream_error(
    provider: str,
    api_key: str,
    code: str | None,
    message: str,
    *,
    fatal: bool = False,
    where: str = "error in the stream",
) -> ProviderError:
    """An error the server reported after HTTP 200 (inside the stream, or as a failed
    response): an overflow when the prompt did not fit, else retryable (a server failing
    half-way), or fatal when the caller knows a retry cannot help. ``where`` names it in the
    message."""
    text = scrub(message, api_key)
    overflow = code == "context_length_exceeded" or is_overflow_text(text)
    return ProviderError(
        "overflow" if overflow else "fatal" if fatal else "retryable",
        f"{provider}: {where}: {text}",
        code=code,
    )
