"""The MCP tools of one run: what its servers list, filtered and checked, and how a call to one
is made (docs/tools.md, "Remote MCP tools").

- :func:`list_servers` lists every server of a run at once (cached listings,
  :mod:`app.agent.mcp.cache`); the first server that cannot be listed makes a toolset whose
  ``failure`` names it — the run then fails before its prompts are admitted.
- :func:`build` keeps, per server, the tools ``allowed_tools`` lets through (and whose names a
  provider accepts), and refuses a name found twice — two servers, or a server and a tool of
  the agent or of the run (:class:`~app.agent.pending.InvalidTools`, a 422 for the API).
- :class:`RunTools` runs one call: an MCP tool through :class:`~app.agent.mcp.client.McpClient`
  (a failure or a timeout is an ``is_error`` result naming the server: the model sees it, the
  run goes on), any other name through the agent's :class:`~app.agent.tools.ToolRegistry`.
  Only a listed, allowed tool is ever called on a server.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..messages import AttemptError, ToolCallBlock, ToolResultMessage
from ..pending import InvalidTools
from ..providers.base import ToolSpec
from ..tools import ToolRegistry, error_result
from .cache import ListedTool, Listing
from .client import McpClient, McpFailure
from .servers import BUILTIN_LABEL, NAME, McpServer


@dataclass(frozen=True)
class McpTool:
    """One tool the model may call, and the server that runs it."""

    server: McpServer
    listed: ListedTool

    @property
    def name(self) -> str:
        return self.listed.name

    @property
    def spec(self) -> ToolSpec:
        schema = dict(self.listed.input_schema)
        schema.setdefault("type", "object")  # providers need an object schema at the top
        return ToolSpec(name=self.name, description=self.listed.description, parameters=schema)

    @property
    def requires_approval(self) -> bool:
        return self.server.require_approval.requires(self.name)


@dataclass(frozen=True)
class McpToolset:
    """The MCP tools of a run, by name, and what each server listed (after its filter).

    ``failure``: the first server that could not be listed (the run fails before admission).
    """

    servers: tuple[McpServer, ...] = ()
    tools: Mapping[str, McpTool] = field(default_factory=dict)
    listings: tuple[tuple[McpServer, tuple[ListedTool, ...]], ...] = ()
    failure: McpFailure | None = None

    @property
    def specs(self) -> tuple[ToolSpec, ...]:
        return tuple(t.spec for t in self.tools.values())

    @property
    def gated(self) -> frozenset[str]:
        """The tools whose calls wait for an approval."""
        return frozenset(n for n, t in self.tools.items() if t.requires_approval)

    def label_of(self, name: str) -> str | None:
        tool = self.tools.get(name)
        return tool.server.label if tool is not None else None

    def failure_error(self) -> AttemptError | None:
        if self.failure is None:
            return None
        code = "mcp_list_timeout" if self.failure.timeout else "mcp_unavailable"
        return AttemptError(kind="fatal", message=str(self.failure), code=code)


async def list_servers(
    client: McpClient, servers: Sequence[McpServer]
) -> list[Listing | McpFailure]:
    """Every server's listing (or its failure), in order; listed concurrently."""

    async def one(server: McpServer) -> Listing | McpFailure:
        try:
            return await client.list_tools(server)
        except McpFailure as exc:
            return exc

    return list(await asyncio.gather(*(one(s) for s in servers)))


def build(
    servers: Sequence[McpServer],
    listed: Sequence[Listing | McpFailure],
    taken: Mapping[str, str],
    where: Mapping[str, str] | None = None,
) -> McpToolset:
    """The toolset of ``servers`` from their listings (same order). ``taken`` maps each name
    already used (server tools of the agent, client tools of the run) to what uses it;
    ``where`` maps a server's label to the input field a clash is reported at."""
    where = where or {}
    for outcome in listed:
        if isinstance(outcome, McpFailure):
            return McpToolset(servers=tuple(servers), failure=outcome)
    tools: dict[str, McpTool] = {}
    listings: list[tuple[McpServer, tuple[ListedTool, ...]]] = []
    for server, outcome in zip(servers, listed, strict=True):
        assert isinstance(outcome, Listing)
        kept: list[ListedTool] = []
        for tool in outcome.tools:
            if not server.allows(tool.name) or not NAME.fullmatch(tool.name):
                continue
            field_ = where.get(server.label, f"agent (its MCP server {server.label!r})")
            if tool.name in taken:
                raise InvalidTools(
                    field_,
                    f"MCP server {server.label!r} offers a tool named {tool.name!r}, which is "
                    f"already {taken[tool.name]}",
                )
            other = tools.get(tool.name)
            if other is not None:
                raise InvalidTools(
                    field_,
                    f"MCP servers {other.server.label!r} and {server.label!r} both offer a tool "
                    f"named {tool.name!r}; leave it out of one's allowed_tools",
                )
            tools[tool.name] = McpTool(server, tool)
            kept.append(tool)
        listings.append((server, tuple(kept)))
    return McpToolset(servers=tuple(servers), tools=tools, listings=tuple(listings))


@dataclass(frozen=True)
class RunTools:
    """How one run executes a call: its MCP tools, else the agent's server tools."""

    registry: ToolRegistry
    mcp: McpToolset | None = None
    client: McpClient | None = None

    def server_of(self, name: str) -> str | None:
        """The label of the server that runs ``name`` (``carryover`` for the agent's own)."""
        if self.mcp is not None and name in self.mcp.tools:
            return self.mcp.tools[name].server.label
        if name in self.registry.tools:
            return BUILTIN_LABEL
        return None

    async def call(self, call: ToolCallBlock) -> ToolResultMessage:
        tool = self.mcp.tools.get(call.name) if self.mcp is not None else None
        if tool is None:
            return await self.registry.call(call)
        if call.server_label is not None and call.server_label != tool.server.label:
            return error_result(
                call,
                f"tool {call.name!r} was called on MCP server {call.server_label!r}, which no "
                "longer offers it to this run",
            )
        arguments = _arguments(call)
        if isinstance(arguments, str):
            return error_result(call, arguments)
        assert self.client is not None
        try:
            blocks, is_error = await self.client.call_tool(tool.server, call.name, arguments)
        except McpFailure as exc:
            return error_result(call, str(exc))
        return ToolResultMessage(
            tool_call_id=call.id, tool_name=call.name, content=blocks, is_error=is_error
        )


def _arguments(call: ToolCallBlock) -> dict[str, Any] | str:
    """The call's arguments as an object, or why they are not one (the model is told)."""
    try:
        raw = json.loads(call.arguments) if call.arguments.strip() else {}
    except json.JSONDecodeError as exc:
        return f"arguments are not valid JSON: {exc}"
    if not isinstance(raw, dict):
        return "arguments must be a JSON object"
    return raw


__all__ = ["McpTool", "McpToolset", "RunTools", "build", "list_servers"]
