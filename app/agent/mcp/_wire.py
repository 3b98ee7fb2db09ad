"""The ``mcp`` package's streamable HTTP client, as :mod:`app.agent.mcp.client` uses it:
imported on the first listing or call, not with the app (the package takes a second of CPU to
import, which a deployment without MCP servers never pays)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx2
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.types import (
    CallToolResult,
    ImageContent,
    ListToolsResult,
    PaginatedRequestParams,
    TextContent,
)

from app.addresses import IPAddress, Resolver, Target, check_url
from app.tls import client_context

from ..messages import Base64Source, ImageBlock, TextBlock, ToolResultBlock
from .servers import McpServer


@asynccontextmanager
async def session(server: McpServer, resolver: Resolver) -> AsyncIterator[ClientSession]:
    """An initialized session with ``server`` (its address checked first when it must be, and
    connected to at the address checked), closed on the way out."""
    transport: httpx2.AsyncBaseTransport = httpx2.AsyncHTTPTransport(
        verify=client_context(), trust_env=False
    )
    if server.check_addresses:
        target = await check_url(server.url, allow_private=False, resolver=resolver)
        transport = _Pinned(transport, target)
    connect = server.timeouts.connect
    timeout = httpx2.Timeout(connect=connect, read=None, write=connect, pool=connect)
    async with (
        httpx2.AsyncClient(
            headers=dict(server.headers),
            timeout=timeout,
            transport=transport,
            follow_redirects=False,
            trust_env=False,
        ) as http,
        streamable_http_client(server.url, http_client=http) as (read, write),
        ClientSession(read, write) as opened,
    ):
        await opened.initialize()
        yield opened


async def list_page(opened: ClientSession, cursor: str | None) -> ListToolsResult:
    if cursor is None:
        return await opened.list_tools()
    return await opened.list_tools(params=PaginatedRequestParams(cursor=cursor))


class _Pinned(httpx2.AsyncBaseTransport):
    """Sends every request to the address its host was checked at (``Host`` and TLS server
    name stay the name's)."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, target: Target) -> None:
        self.inner = inner
        self.target = target

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        ip: IPAddress = self.target.addresses[0]
        if request.url.host == self.target.host:
            host_header = request.url.netloc.decode("ascii")
            request.url = request.url.copy_with(host=str(ip))
            request.headers["host"] = host_header
            if request.url.scheme == "https":
                request.extensions = {**request.extensions, "sni_hostname": self.target.host}
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def first_cause(exc: BaseException) -> BaseException:
    """The exception that explains a failure (task groups wrap it in exception groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def reason(exc: BaseException) -> str:
    cause = first_cause(exc)
    if isinstance(cause, httpx2.ConnectError):
        return f"could not connect ({cause or 'connection refused'})"
    if isinstance(cause, httpx2.HTTPStatusError):
        return f"answered HTTP {cause.response.status_code}"
    text = str(cause).strip() or type(cause).__name__
    return f"{type(cause).__name__}: {text}" if type(cause).__name__ not in text else text


def blocks(result: CallToolResult, max_chars: int) -> tuple[ToolResultBlock, ...]:
    """The result as the model sees it: text and images as they are; anything else (audio,
    resources, a structured result without content) as its JSON; bounded in text."""
    out: list[ToolResultBlock] = []
    budget = max_chars
    for item in result.content:
        if isinstance(item, ImageContent):
            out.append(ImageBlock(source=Base64Source(media_type=item.mime_type, data=item.data)))
            continue
        text = (
            item.text
            if isinstance(item, TextContent)
            else json.dumps(item.model_dump(mode="json", exclude_none=True), default=str)
        )
        if len(text) > budget:
            text = text[:budget] + f"\n[cut: the tool's output passed {max_chars} characters]"
            budget = 0
        else:
            budget -= len(text)
        if text:
            out.append(TextBlock(text=text))
        if budget <= 0:
            break
    if not out and result.structured_content is not None:
        out.append(TextBlock(text=json.dumps(result.structured_content, default=str)))
    if not out:  # providers refuse an empty result
        out.append(TextBlock(text="(the tool returned no content)"))
    return tuple(out)
