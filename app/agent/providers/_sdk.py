"""What the SDK providers share around one request: sending it, and reading its event stream.

Both providers send a body they built from encoded pieces (:mod:`.wire`) through their SDK's
``post`` (:func:`posted`: so the SDK neither walks, encodes nor copies the history again,
while its HTTP client, auth, headers, error types and stream decoding stay the SDK's; a path's
later requests go with the request the SDK built the first time, :mod:`._prepared`), and both
read an SDK stream the same way: an HTML page behind a 200 is fatal, an event the SDK cannot
decode is malformed, a body from which no event arrived is judged by its type, and every other
failure is classified by the provider's own ``classify`` (its SDK's error types), or raised as
it is when it is not a provider failure. The classification itself lives in :mod:`._http`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, TypeVar

from ._http import (
    BODY_DECODE_ERRORS,
    DECODE_ERRORS,
    check_event_stream,
    malformed_error,
    no_events_error,
    transport_classes,
)
from .base import ProviderError, Timeouts
from .wire import Body

_T = TypeVar("_T")

#: an exception, classified as a provider failure; ``None``: not one (raised as it is)
Classify = Callable[[BaseException], ProviderError | None]


class SdkStream(Protocol):
    """An SDK's async event stream (``openai.AsyncStream``, ``anthropic.AsyncStream``)."""

    @property
    def response(self) -> Any: ...

    def __aiter__(self) -> AsyncIterator[Any]: ...

    async def __aenter__(self) -> Any: ...

    async def __aexit__(self, *exc: object) -> Any: ...


def posted(body: bytes | Body) -> dict[str, Any]:
    """An SDK ``post``'s ``content`` and ``options`` that send ``body`` as it is, with its length
    declared: httpx then sends a long body's parts (an async iterable, :class:`~.wire.Body`)
    with a ``Content-Length`` rather than in chunks, and without reading them into one bytes;
    the transport writes them as they are (:mod:`._transport`)."""
    if isinstance(body, bytes):  # httpx declares a bytes body's length itself
        return {"content": body}
    return {"content": body, "options": {"headers": {"Content-Length": str(len(body))}}}


def _classified(classify: Classify, exc: Exception) -> Exception:
    error = classify(exc)
    return exc if error is None else error


async def send(provider: str, api_key: str, classify: Classify, call: Awaitable[_T]) -> _T:
    """The SDK's answer to ``call``; its failures as :class:`ProviderError`."""
    try:
        return await call
    except BODY_DECODE_ERRORS as exc:  # the SDK could not decode a JSON body
        raise malformed_error(provider, exc, api_key) from None
    except Exception as exc:
        error = classify(exc)
        if error is None:
            raise
        raise error from None


#: how long a stream may take to end once its last event was read (:func:`drain`)
DRAIN_SECONDS = 0.05


async def drain(received: AsyncIterator[Any], within: float = DRAIN_SECONDS) -> None:
    """Read what follows a stream's last event (normally nothing but the end of the body), so
    that its HTTP connection goes back to the client's pool for the next request instead of
    being closed half read and opened again. For up to ``within`` seconds; what arrives is
    ignored, and so is a failure (the answer was complete): the connection is then closed, as
    it would have been without the drain."""
    try:
        async with asyncio.timeout(within):
            async for _ in received:
                pass
    except Exception:  # the answer is complete: nothing after it counts
        pass


async def events(
    provider: str, api_key: str, classify: Classify, stream: SdkStream
) -> AsyncGenerator[Any, None]:
    """The events of ``stream`` (closed when the iteration ends or is closed), its faults as
    :class:`ProviderError`. Close the iterator (``contextlib.aclosing``) to stop early."""
    async with stream:
        try:
            media = await check_event_stream(provider, stream.response, api_key)
        except Exception as exc:  # reading the body: a ProviderError, or a dropped line
            raise _classified(classify, exc) from None
        iterator = aiter(stream)
        received = 0
        while True:
            try:
                event = await anext(iterator)
                received += 1
            except StopAsyncIteration:
                if not received:
                    error = no_events_error(provider, stream.response.status_code, media)
                    if error is not None:
                        raise error from None
                return
            except DECODE_ERRORS as exc:  # the SDK could not decode an event
                raise malformed_error(provider, exc, api_key) from None
            except Exception as exc:
                raise _classified(classify, exc) from None
            yield event


#: a read that stalls half-way through a stream raises these unwrapped
TIMEOUT_ERRORS = transport_classes("TimeoutException")


def timeout_error(provider: str, exc: BaseException, timeouts: Timeouts) -> ProviderError:
    """A timeout (an SDK's ``APITimeoutError``, or the transport's own exception), named after
    the limit it passed: retryable."""
    cause = type(exc if isinstance(exc, TIMEOUT_ERRORS) else exc.__cause__ or exc).__name__
    if cause in ("ConnectTimeout", "PoolTimeout"):
        what = f"could not connect within {timeouts.connect:g} s (connect_timeout)"
    else:
        what = f"sent nothing for {timeouts.idle:g} s (idle_timeout)"
    return ProviderError("retryable", f"{provider}: the provider {what}", code="timeout")
