"""A provider's POST of one path, sent with the request the SDK built for that path.

Both SDKs build every request from scratch: options copied and prepared, the URL merged and
parsed, the headers merged (auth, platform, retry count, read timeout), an ``httpx2.Request``
made and sent down the client's auth, redirect and hook layers. For a provider that posts one
path with the same client, everything but the body is the same each time, and building it
was the largest part of what a request cost a run above the transport (docs/performance.md,
"The SDKs' request, built once per path").

:class:`PreparedPost` therefore lets the SDK send a path's first request its own way, keeps
the URL and headers that request went out with (:attr:`.AiohttpTransport.last_post`), and
sends later bodies of that path with them straight onto the transport. What comes back is the
SDK's again: a 2xx answer is processed by the SDK's own ``_process_response`` (its stream
class decodes the events, its models parse a body), an error status becomes the SDK's own
error (``_make_status_error_from_response``), and a transport failure the SDK's timeout or
connection error, built as the SDK builds them (the ``Sdk`` given). So every error type,
message and the providers' classification of them are as before.

The SDK's own path is kept when the client has anything that decides per request (the
``Sdk``'s ``direct`` says, once: a token refreshed, a request signed, middleware; its ``now``,
before each request: a span that records or propagates a trace), or while the SDK's requests
do not go through the aiohttp transport (a proxy); and from the first redirect on (httpx
follows redirects, the prepared request does not).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx2

from ._sdk import posted
from ._transport import AiohttpTransport, Prepared
from .wire import Body


@dataclass(frozen=True)
class Sdk:
    """What differs between the SDKs around a prepared request."""

    #: the SDK's error for a transport timeout of ``request`` (raised ``from`` the cause)
    timeout_error: Callable[[httpx2.Request, httpx2.TimeoutException], Exception]
    #: the SDK's error for any other transport failure of ``request``
    connection_error: Callable[[httpx2.Request, Exception], Exception]
    #: whether a client's requests may be sent prepared: nothing in it decides per request
    #: (asked once, after its first request)
    direct: Callable[[Any], bool]
    #: the SDK's ``FinalRequestOptions`` class (``_process_response`` reads the options)
    options: Any
    #: whether the client's next request is one the SDK must send itself, when that can
    #: change after its first (asked before each request; ``None``: it cannot)
    now: Callable[[Any], bool] | None = None


class PreparedPost:
    """``POST path`` of one SDK client: the SDK's own the first time, then prepared."""

    def __init__(self, client: Any, path: str, sdk: Sdk) -> None:
        self._client = client
        self._path = path
        self._sdk = sdk
        self._prepared: Prepared | None = None
        self._transport: AiohttpTransport | None = None
        self._options = sdk.options.construct(method="post", url=path)
        #: the SDK's own path for good: a redirect, or a client that decides per request
        self._sdk_only = False

    @property
    def prepared(self) -> bool:
        """Whether the next request is sent prepared."""
        return self._prepared is not None and not self._sdk_only and not self._sdk_now()

    def _sdk_now(self) -> bool:
        now = self._sdk.now
        return now is not None and now(self._client)

    async def __call__(
        self, body: bytes | Body, *, stream: bool, cast_to: Any, stream_cls: Any
    ) -> Any:
        """The SDK's answer to ``POST path`` with ``body`` (an SDK stream when ``stream``)."""
        if self._prepared is None or self._sdk_only or self._sdk_now():
            return await self._sdk_post(body, stream=stream, cast_to=cast_to, stream_cls=stream_cls)
        assert self._transport is not None
        request = self._prepared.request
        parts = (body,) if isinstance(body, bytes) else body.parts
        try:
            response = await self._transport.send_prepared(self._prepared, parts)
        except httpx2.TimeoutException as exc:
            raise self._sdk.timeout_error(request, exc) from exc
        except httpx2.RequestError as exc:
            raise self._sdk.connection_error(request, exc) from exc
        if response.has_redirect_location:  # httpx follows it: the SDK's path from now on
            await response.aclose()
            self._sdk_only = True
            return await self._sdk_post(body, stream=stream, cast_to=cast_to, stream_cls=stream_cls)
        client = self._client
        if not response.is_success:
            try:
                await response.aread()
            finally:
                await response.aclose()
            raise client._make_status_error_from_response(response) from None
        return await client._process_response(
            cast_to=cast_to,
            options=self._options,
            response=response,
            stream=stream,
            stream_cls=stream_cls,
            retries_taken=0,
        )

    async def _sdk_post(
        self, body: bytes | Body, *, stream: bool, cast_to: Any, stream_cls: Any
    ) -> Any:
        transport = self._ours() if self._prepared is None and not self._sdk_only else None
        if transport is not None:
            transport.keep_post = True  # the next POST it sends: this one
        try:
            return await self._client.post(
                self._path, cast_to=cast_to, **posted(body), stream=stream, stream_cls=stream_cls
            )
        finally:
            if transport is not None:
                self._keep(transport)

    def _ours(self) -> AiohttpTransport | None:
        """The aiohttp transport under the SDK's client, when its requests may be sent
        prepared (else the SDK's path for good)."""
        client = getattr(self._client, "_client", None)  # the SDK's httpx client
        transport = getattr(client, "_transport", None)
        if not isinstance(transport, AiohttpTransport) or not self._sdk.direct(self._client):
            # an httpx client of the caller's, not Carryover's; or a client that decides
            # something per request
            self._sdk_only = True
            return None
        return transport

    def _keep(self, transport: AiohttpTransport) -> None:
        """Keep the URL and headers of the request the SDK just sent through ``transport``."""
        sent, transport.last_post, transport.keep_post = transport.last_post, None, False
        if sent is None or not sent.url.path.endswith(self._path):
            return  # went elsewhere (a proxy's transport): try again next time
        self._prepared = Prepared.template(sent)
        self._transport = transport
