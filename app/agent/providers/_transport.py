"""The HTTP transport both SDK providers send through: aiohttp under the SDKs' own client.

The ``openai`` and ``anthropic`` SDKs send with an ``httpx2.AsyncClient``; what moves the bytes
is that client's transport. Its default (httpcore over anyio, with h11 parsing in pure Python)
was the largest part of what a request cost a run: about 1.4 M instructions of a 12.3 M run
with the ``openai`` provider (docs/performance.md, "With a real provider").
:class:`AiohttpTransport` moves the bytes with aiohttp instead (its C HTTP parser, its
connection pool), as the SDKs' own ``DefaultAioHttpClient`` does. Everything above the
transport stays the SDK's: the request it builds, its headers and auth, its error types, its
stream decoding, and so the providers' classification of every failure.

What is Carryover's here is the mapping of aiohttp's failures onto httpx's, which the SDKs and
:mod:`._http` classify: a connect timeout is ``ConnectTimeout``, a read that waited past the
idle timeout ``ReadTimeout``, a refused or unresolvable address ``ConnectError``, a server that
closed the connection (before its answer, or half-way through its body) ``RemoteProtocolError``,
a reset ``ReadError`` (so a dropped connection is never reported as a timeout).

:class:`ProviderHttpClient` is the SDKs' default client (their timeouts, limits and redirects)
with this transport for direct connections. A proxy from the environment (``HTTPS_PROXY``...)
is still honoured: its connections go through httpx's own proxy transport, as before.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
import httpx2
from yarl import URL

from app.tls import client_context

#: TCP keep-alive on every connection, as the ``anthropic`` SDK's own client sets it: an answer
#: that takes minutes (long thinking) keeps its connection alive through NATs and load
#: balancers that drop idle flows
_KEEPALIVE = [
    (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
    *(
        (socket.IPPROTO_TCP, option, value)
        for name, value in (("TCP_KEEPIDLE", 60), ("TCP_KEEPINTVL", 60), ("TCP_KEEPCNT", 5))
        if (option := getattr(socket, name, None)) is not None
    ),
]


def _socket(addr_info: Any) -> socket.socket:
    family, type_, proto, _, _ = addr_info
    sock = socket.socket(family=family, type=type_, proto=proto)
    for level, option, value in _KEEPALIVE:
        sock.setsockopt(level, option, value)
    return sock


#: aiohttp's failures as httpx's, most specific first (the first match wins)
_ERRORS: tuple[tuple[type[BaseException], type[httpx2.TransportError]], ...] = (
    (aiohttp.ConnectionTimeoutError, httpx2.ConnectTimeout),
    (aiohttp.SocketTimeoutError, httpx2.ReadTimeout),
    (aiohttp.ServerTimeoutError, httpx2.ReadTimeout),
    (aiohttp.ClientConnectorError, httpx2.ConnectError),
    (aiohttp.ServerDisconnectedError, httpx2.RemoteProtocolError),
    (aiohttp.ClientPayloadError, httpx2.RemoteProtocolError),
    (aiohttp.ClientResponseError, httpx2.RemoteProtocolError),
    (aiohttp.ClientOSError, httpx2.ReadError),
    (aiohttp.InvalidURL, httpx2.UnsupportedProtocol),
    (aiohttp.NonHttpUrlClientError, httpx2.UnsupportedProtocol),
)


def transport_error(exc: BaseException, request: httpx2.Request) -> httpx2.TransportError:
    """``exc`` (an aiohttp failure) as the httpx error the SDKs expect (any other: a network
    error)."""
    for source, target in _ERRORS:
        if isinstance(exc, source):
            return target(str(exc) or type(exc).__name__, request=request)
    return httpx2.NetworkError(str(exc) or type(exc).__name__, request=request)


class _Body(httpx2.AsyncByteStream):
    """An answer's body as it arrives; closing it hands the connection back to the pool when
    the body was read to its end (else the connection is closed)."""

    def __init__(self, response: aiohttp.ClientResponse, request: httpx2.Request) -> None:
        self._response = response
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        content = self._response.content
        try:
            while True:
                chunk = await content.readany()
                if not chunk:
                    return
                yield chunk
        except aiohttp.ClientError as exc:
            raise transport_error(exc, self._request) from exc

    async def aclose(self) -> None:
        self._response.release()


#: a body longer than this is written as its parts (:class:`_Parts`), not joined to the headers
LONG_BODY = 64 * 1024


class _Parts(aiohttp.Payload):
    """A long request body written as the parts it was handed over in, each as it is (a long
    conversation's body is megabytes: its pieces' chunks, :mod:`.wire`). aiohttp joins the
    headers to the first write into one new bytes (one segment on the wire): given the whole
    body, that would be a copy of all of it, megabytes of fresh memory written and freed per
    request. A body that came as one bytes is written as its first :data:`LONG_BODY` bytes
    (with the headers), then a view of the rest."""

    def __init__(self, parts: Sequence[bytes | memoryview], length: int) -> None:
        super().__init__(parts)
        self._parts = parts
        self._size = length  # aiohttp's ``size``

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return b"".join(self._parts).decode(encoding, errors)

    async def write(self, writer: aiohttp.abc.AbstractStreamWriter) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(
        self, writer: aiohttp.abc.AbstractStreamWriter, content_length: int | None
    ) -> None:
        length = self._size or 0
        left = length if content_length is None else min(content_length, length)
        for part in self._parts:
            view = memoryview(part)[:left]
            left -= len(view)
            await writer.write(view)
            if not left:
                return


async def _body(request: httpx2.Request) -> tuple[list[bytes | memoryview], int, bool]:
    """The parts of ``request``'s body, its length, and whether that length is already declared
    (``Content-Length``). A body handed over as bytes (the providers' short ones) is one part;
    a streamed one (a provider's long body, :class:`~.wire.Body`; an upload) is read as it
    comes, part by part, none of them copied."""
    try:
        content = request.content
        return [content], len(content), True
    except httpx2.RequestNotRead:
        pass
    stream = request.stream
    if not isinstance(stream, httpx2.AsyncByteStream):  # an async client's request never has one
        raise TypeError("a request of an async client with a sync body")
    parts: list[bytes | memoryview] = [part async for part in stream]
    length = sum(memoryview(part).nbytes for part in parts)
    declared = request.headers.get("content-length")
    return parts, length, declared is not None and declared.strip() == str(length)


def _payload(parts: list[bytes | memoryview], length: int) -> bytes | _Parts | None:
    """What aiohttp is given to send: a short body as bytes (written with the headers in one
    segment), a long one as its parts."""
    if length <= LONG_BODY:
        return b"".join(parts) or None
    if len(parts) == 1:  # one bytes: the headers go with its start, the rest as a view
        whole = memoryview(parts[0])
        parts = [whole[:LONG_BODY], whole[LONG_BODY:]]
    return _Parts(parts, length)


class Prepared:
    """What aiohttp is given of a request, taken once from the ``httpx2.Request`` an SDK built:
    its URL (as httpx encoded it), its headers (without a body's length, unless the request is
    sent as it is), its timeouts and TLS server name. :meth:`AiohttpTransport.send_prepared`
    sends it again and again with other bodies (:mod:`._prepared`)."""

    __slots__ = ("headers", "request", "sni_hostname", "timeout", "url")

    def __init__(self, request: httpx2.Request, headers: Sequence[tuple[str, str]]) -> None:
        timeout: dict[str, Any] = request.extensions.get("timeout", {})
        self.request = request
        self.url = URL(str(request.url), encoded=True)  # as httpx encoded it
        self.headers = list(headers)
        self.timeout = aiohttp.ClientTimeout(
            total=None,
            connect=timeout.get("pool"),
            sock_connect=timeout.get("connect"),
            sock_read=timeout.get("read"),
        )
        self.sni_hostname: str | None = request.extensions.get("sni_hostname")

    @classmethod
    def template(cls, sent: httpx2.Request) -> Prepared:
        """``sent`` (a request an SDK built) without its body: its headers but the body's
        length, kept with a bodiless copy of it (what an error names)."""
        headers = [
            (name, value)
            for name, value in sent.headers.multi_items()
            if name.lower() not in ("content-length", "transfer-encoding")
        ]
        bodiless = httpx2.Request(sent.method, sent.url, headers=headers)
        bodiless.extensions = dict(sent.extensions)
        return cls(bodiless, headers)


class AiohttpTransport(httpx2.AsyncBaseTransport):
    """HTTP/1.1 over aiohttp's connection pool (one pool per event loop that uses it).

    ``last_post`` is the first POST the SDK above sent through it after ``keep_post`` was
    set: the request a :class:`~._prepared.PreparedPost` takes its URL and headers from (kept
    only when asked for, so that no request's body is held on to)."""

    def __init__(self, ssl_context: ssl.SSLContext, limits: httpx2.Limits) -> None:
        self._ssl = ssl_context
        self._limits = limits
        self.last_post: httpx2.Request | None = None
        self.keep_post = False
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _session_here(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed:
            # a session belongs to the loop it was made in: a client used from another loop
            # (a test, a CLI command) gets its own
            connector = aiohttp.TCPConnector(
                ssl=self._ssl,
                limit=self._limits.max_connections or 0,
                # None is "never expires from idling" in both libraries
                keepalive_timeout=self._limits.keepalive_expiry,
                socket_factory=_socket,
            )
            # httpx above keeps the cookies, decodes the body and picks the proxy: aiohttp
            # does none of it again
            self._session = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,
                trust_env=False,
                cookie_jar=aiohttp.DummyCookieJar(),
            )
            self._loop = loop
        return self._session

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if self.keep_post and request.method == "POST":
            self.last_post, self.keep_post = request, False
        headers = request.headers
        parts, length, declared = await _body(request)
        if not declared:  # a streamed body of unknown length (an upload): sent with its length
            headers = headers.copy()  # rather than in chunks
            headers.pop("transfer-encoding", None)
            headers["content-length"] = str(length)
        prepared = Prepared(request, headers.multi_items())
        return await self._send(prepared, _payload(parts, length), prepared.headers)

    async def send_prepared(self, prepared: Prepared, body: Sequence[bytes]) -> httpx2.Response:
        """``prepared``'s request with ``body`` (its parts, none of them copied), sent with its
        ``Content-Length``: what :meth:`handle_async_request` does with a request httpx built,
        without httpx building one (:mod:`._prepared`)."""
        length = sum(len(part) for part in body)
        headers = [*prepared.headers, ("content-length", str(length))]
        return await self._send(prepared, _payload(list(body), length), headers)

    async def _send(
        self, prepared: Prepared, data: bytes | _Parts | None, headers: list[tuple[str, str]]
    ) -> httpx2.Response:
        request = prepared.request
        session = self._session_here()
        try:
            response = await session.request(
                request.method,
                prepared.url,
                headers=headers,
                data=data,
                allow_redirects=False,
                timeout=prepared.timeout,
                server_hostname=prepared.sni_hostname,
            )
        except aiohttp.ClientError as exc:
            raise transport_error(exc, request) from exc
        extensions: dict[str, Any] = {"http_version": b"HTTP/1.1"}
        if response.reason:
            extensions["reason_phrase"] = response.reason.encode()
        return httpx2.Response(
            status_code=response.status,
            headers=response.raw_headers,
            stream=_Body(response, request),
            request=request,
            extensions=extensions,
        )

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None and self._loop is asyncio.get_running_loop():
            await session.close()


_LIMITS = httpx2.Limits(max_connections=100, max_keepalive_connections=20)  # httpx's default


class ProviderHttpClient(httpx2.AsyncClient):
    """An SDK's default client (``DefaultAsyncHttpxClient``'s timeouts, limits, redirects, as
    the SDK passes them) whose direct connections go through :class:`AiohttpTransport`."""

    def _init_transport(
        self,
        verify: ssl.SSLContext | str | bool = True,
        cert: Any = None,
        trust_env: bool = True,
        http1: bool = True,
        http2: bool = False,
        limits: httpx2.Limits = _LIMITS,
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> httpx2.AsyncBaseTransport:
        if transport is not None:
            return transport
        context = httpx2.create_ssl_context(verify=verify, cert=cert, trust_env=trust_env)
        return AiohttpTransport(context, limits)


def sdk_http_client(timeout: httpx2.Timeout, limits: httpx2.Limits) -> ProviderHttpClient:
    """The client an SDK sends through: its own default ``timeout`` and ``limits`` (as its
    ``DefaultAsyncHttpxClient`` has them), redirects followed, Carryover's TLS context."""
    return ProviderHttpClient(
        verify=client_context(), timeout=timeout, limits=limits, follow_redirects=True
    )


__all__ = [
    "AiohttpTransport",
    "Prepared",
    "ProviderHttpClient",
    "sdk_http_client",
    "transport_error",
]
