"""Talking to MCP servers over streamable HTTP (the ``mcp`` package's client).

Every listing and every call opens its own connection and session (connect, ``initialize``,
the request, close): a session holds nothing a later call needs, a cancelled call closes its
connection (the server sees its request end, and a session-keeping server gets the
``notifications/cancelled`` the client sends), and there is no pool of half-dead sessions to
keep. The cost is the handshake (``initialize`` and its notification, and a session's closing
``DELETE``) per call; listings are cached (:mod:`app.agent.mcp.cache`).

Timeouts (:class:`~app.agent.mcp.servers.McpTimeouts`): ``connect`` bounds the TCP/TLS
connection, ``list`` a whole listing and ``call`` a whole call, handshake included. Every
failure is an :class:`McpFailure` naming the server (its label and host, never its headers or
its full URL) and what failed.

A server whose URL a request gave (``check_addresses``) is connected to only after its host's
addresses were checked (app/addresses.py), and at the address checked, so a name that resolves
differently a moment later cannot redirect the connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from app.addresses import PrivateTarget, Resolver, resolve

from ..messages import ToolResultBlock
from .cache import ListedTool, Listing, ListingCache
from .servers import McpServer

if TYPE_CHECKING:
    from mcp.client.session import ClientSession
    from mcp.types import CallToolResult, ListToolsResult

#: pages of a tools/list a server may answer (a longer listing is cut here)
MAX_LIST_PAGES = 50
#: the text a call may return to the model, in characters (the rest is cut, and it says so)
DEFAULT_MAX_RESULT_CHARS = 200_000


class McpFailure(Exception):
    """A listing or a call that failed: ``server`` names the server, ``what`` the request,
    ``reason`` why (a timeout, a refused connection, an error answer, a refused address)."""

    def __init__(self, server: McpServer, what: str, reason: str, *, timeout: bool = False):
        self.label = server.label
        self.host = urlsplit(server.url).netloc.rsplit("@", 1)[-1]
        self.what = what
        self.reason = reason
        self.timeout = timeout
        super().__init__(f"MCP server {self.label!r} ({self.host}): {what} {reason}")


def _reason(exc: BaseException) -> str:
    from . import _wire

    return _wire.reason(exc)


class McpClient:
    """Lists and calls the tools of MCP servers; one per process, shared by every agent."""

    def __init__(
        self,
        *,
        cache: ListingCache | None = None,
        resolver: Resolver = resolve,
        max_result_chars: int = DEFAULT_MAX_RESULT_CHARS,
    ) -> None:
        self.cache = cache if cache is not None else ListingCache()
        #: how request-given hosts are resolved for the address check (tests replace it)
        self.resolver = resolver
        self.max_result_chars = max_result_chars

    # --- connections ---------------------------------------------------------------------

    @asynccontextmanager
    async def session(self, server: McpServer) -> AsyncIterator[ClientSession]:
        """An initialized session with ``server``, closed on the way out."""
        from . import _wire  # the mcp package: imported on first use, not with the app

        async with _wire.session(server, self.resolver) as session:
            yield session

    # --- listings --------------------------------------------------------------------------

    async def list_tools(self, server: McpServer) -> Listing:
        """What ``server`` lists, from the cache when it holds it; :class:`McpFailure`."""
        return await self.cache.listing(server.identity, lambda: self.fetch_tools(server))

    async def fetch_tools(self, server: McpServer) -> Listing:
        """What ``server`` lists now (no cache); :class:`McpFailure` when it cannot say."""
        limit = server.timeouts.list
        try:
            async with asyncio.timeout(limit):
                return await self._list(server)
        except TimeoutError:
            raise McpFailure(
                server, "tools/list", f"timed out after {limit:g}s", timeout=True
            ) from None
        except PrivateTarget as exc:
            raise McpFailure(server, "tools/list", f"refused: {exc}") from None
        except McpFailure:
            raise
        except Exception as exc:  # the transport's and the protocol's errors alike
            raise McpFailure(server, "tools/list", _reason(exc)) from None

    async def _list(self, server: McpServer) -> Listing:
        from . import _wire

        tools: list[ListedTool] = []
        async with self.session(server) as session:
            cursor: str | None = None
            for _ in range(MAX_LIST_PAGES):
                page: ListToolsResult = await _wire.list_page(session, cursor)
                for tool in page.tools:
                    annotations = (
                        tool.annotations.model_dump(mode="json", exclude_none=True)
                        if tool.annotations is not None
                        else None
                    )
                    tools.append(
                        ListedTool(
                            name=tool.name,
                            description=tool.description or "",
                            input_schema=dict(tool.input_schema),
                            annotations=annotations,
                        )
                    )
                cursor = page.next_cursor
                if not cursor:
                    break
        return Listing.of(tuple(tools))

    # --- calls ------------------------------------------------------------------------------

    async def call_tool(
        self, server: McpServer, name: str, arguments: Mapping[str, Any]
    ) -> tuple[tuple[ToolResultBlock, ...], bool]:
        """Call ``name`` on ``server``: the result's blocks and whether the server marked it an
        error. :class:`McpFailure` when the call could not be made or did not finish in time;
        cancelling the caller closes the connection (the server sees the call end)."""
        limit = server.timeouts.call
        what = f"tools/call {name!r}"
        try:
            async with asyncio.timeout(limit):
                async with self.session(server) as session:
                    result = await session.call_tool(name, dict(arguments))
        except TimeoutError:
            raise McpFailure(server, what, f"timed out after {limit:g}s", timeout=True) from None
        except PrivateTarget as exc:
            raise McpFailure(server, what, f"refused: {exc}") from None
        except Exception as exc:
            raise McpFailure(server, what, _reason(exc)) from None
        return self._blocks(result), bool(result.is_error)

    def _blocks(self, result: CallToolResult) -> tuple[ToolResultBlock, ...]:
        from . import _wire

        return _wire.blocks(result, self.max_result_chars)


__all__ = ["McpClient", "McpFailure"]
