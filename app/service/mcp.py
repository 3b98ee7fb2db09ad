"""Remote MCP tools in the run service (docs/tools.md, "Remote MCP tools").

- :meth:`McpService.admit` checks a request's own MCP servers before anything else happens:
  each ``server_url`` must start with an entry of ``CARRYOVER_MCP_ALLOWED_URLS``, and its host
  must resolve to public addresses unless that entry names a private address itself (the
  operator's explicit yes, as ``--allow-private`` is for a webhook). Refused: 422 on
  ``body.tools[i].server_url``, and no connection is made. A queued or background run cannot
  keep a request's MCP ``headers`` (they are never stored): 422 too.
- :meth:`McpService.prelist` lists the run's servers (cached) before the run starts, so a tool
  name found twice is a 422 before anything is stored; a server that cannot be listed is left
  to the run, which fails before its prompts are admitted, naming it.
- :meth:`McpService.reachability`: each profile's servers, listed (cached) or why not, for
  ``/readyz`` and ``carryover config``.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

from app.addresses import PrivateTarget, Resolver, address_reason, check_url, resolve
from app.agent.mcp import McpClient, McpFailure, McpServer, McpToolset
from app.agent.messages import Context
from app.agent.pending import InvalidTools
from app.agent.records import Input
from app.agent.run import Agent
from app.config import Settings
from app.errors import CarryoverError

from .pending import refusal
from .types import RunRequest

#: the longest ``/readyz`` waits for one server's listing (seconds)
READINESS_LIST_TIMEOUT = 5.0


class McpServerRefused(CarryoverError):
    """422 ``validation-error`` on ``body.tools[i]…``: an MCP server a request may not use."""

    slug = "validation-error"
    status = 422

    def __init__(self, field: str, reason: str) -> None:
        path = f"body.{field}"
        super().__init__(f"{path}: {reason}", errors=[{"path": path, "message": reason}])
        self.field = field
        self.reason = reason


def _names_private(prefix: str) -> bool:
    """Does an allowed prefix name a private address itself (a literal one, or localhost)?"""
    host = (urlsplit(prefix).hostname or "").lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return address_reason(ipaddress.ip_address(host)) is not None
    except ValueError:
        return False


def matching_prefix(url: str, prefixes: Sequence[str]) -> str | None:
    """The allowed prefix ``url`` starts with, at a boundary (the prefix ends with ``/``, or
    the URL goes on with ``/``, ``?`` or ``#`` or ends there): ``https://a.example`` allows
    ``https://a.example/mcp``, not ``https://a.example.evil.test/`` nor another port."""
    for prefix in prefixes:
        if not url.startswith(prefix):
            continue
        rest = url[len(prefix) :]
        if prefix.endswith("/") or not rest or rest[0] in "/?#":
            return prefix
    return None


class McpService:
    """The process's MCP client and the checks of a request's own servers."""

    def __init__(self, settings: Settings, client: McpClient) -> None:
        self.settings = settings
        self.client = client
        #: how request-given hosts are resolved for the address check (tests replace it)
        self.resolver: Resolver = resolve

    async def admit(self, request: RunRequest, *, queued: bool) -> RunRequest:
        """``request`` with its MCP servers checked (and marked for the address check at each
        connection); :class:`McpServerRefused` otherwise. Nothing is connected to."""
        if not request.mcp_servers:
            return request
        allowed = self.settings.mcp_allowed_urls
        checked: list[McpServer] = []
        for i, server in enumerate(request.mcp_servers):
            field = f"tools[{request.mcp_position(i)}]"
            if queued and server.headers:
                raise McpServerRefused(
                    f"{field}.headers",
                    "a queued or background run cannot carry MCP headers: they are secrets "
                    "and are never stored; run it directly (if_busy: reject, without "
                    "respond-async), or configure the server in an agent profile",
                )
            prefix = matching_prefix(server.url, allowed)
            if prefix is None:
                reason = (
                    "no MCP server URL is allowed here: the operator allows some with "
                    "CARRYOVER_MCP_ALLOWED_URLS"
                    if not allowed
                    else f"{server.url!r} does not start with an allowed URL "
                    "(CARRYOVER_MCP_ALLOWED_URLS)"
                )
                raise McpServerRefused(f"{field}.server_url", reason)
            private_ok = _names_private(prefix)
            if not private_ok:
                try:
                    await check_url(server.url, allow_private=False, resolver=self.resolver)
                except PrivateTarget as exc:
                    raise McpServerRefused(f"{field}.server_url", f"refused: {exc}") from None
                except ValueError as exc:
                    raise McpServerRefused(f"{field}.server_url", str(exc)) from None
            checked.append(server.model_copy(update={"check_addresses": not private_ok}))
        return request.with_mcp_servers(tuple(checked))

    async def prelist(self, agent: Agent, request: RunRequest) -> McpToolset | None:
        """The run's MCP tools, listed before it starts (None: it has no MCP server). A name
        found twice: 422 (:class:`~app.service.pending.BadClientTools`)."""
        if not (agent.config.mcp_servers or request.mcp_servers):
            return None
        try:
            return await agent.list_tools(
                Input(
                    context=Context(),
                    client_tools=request.client_tools,
                    mcp_servers=request.mcp_servers,
                )
            )
        except InvalidTools as exc:
            found = refusal(exc, request)
            assert found is not None
            raise found from None

    async def reachability(
        self, servers: Mapping[str, Sequence[McpServer]]
    ) -> dict[str, dict[str, str | None]]:
        """Per profile, per server label: None when it lists its tools (cached listings
        count), else why not. Servers are asked concurrently, each for at most
        :data:`READINESS_LIST_TIMEOUT` seconds."""

        async def one(server: McpServer) -> str | None:
            try:
                async with asyncio.timeout(READINESS_LIST_TIMEOUT):
                    await self.client.list_tools(server)
            except McpFailure as exc:
                return f"{exc.what} {exc.reason}"
            except TimeoutError:
                return f"tools/list timed out after {READINESS_LIST_TIMEOUT:g}s"
            return None

        flat = [(p, s) for p, group in servers.items() for s in group]
        answers = await asyncio.gather(*(one(s) for _, s in flat))
        out: dict[str, dict[str, str | None]] = {p: {} for p in servers}
        for (profile, server), answer in zip(flat, answers, strict=True):
            out[profile][server.label] = answer
        return out


__all__ = ["McpServerRefused", "McpService", "matching_prefix"]
