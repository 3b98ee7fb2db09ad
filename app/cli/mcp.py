"""``carryover mcp list TARGET``: what an MCP server offers (docs/tools.md, "Remote MCP tools").

TARGET is a URL (``--header NAME:VALUE`` and ``--header-env NAME=VARIABLE`` add headers; the
operator's own tool, so no allowed prefix applies) or an agent profile, whose servers are each
listed with their filters applied: which tools its runs see and which of those wait for an
approval. Exit status 0 when every server listed its tools, 1 when one could not, 2 for a usage
or configuration error.

:func:`reachability` is what ``carryover config`` reports of each profile's servers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from typing import Any

from app.agent.mcp import McpClient, McpFailure, McpServer, McpTimeouts
from app.config import Settings
from app.config.mcp import header_problem, url_problem
from app.observability import configure_logging

from .common import CliError, load_settings

#: the longest ``carryover config`` waits for one server's listing (seconds)
CONFIG_LIST_TIMEOUT = 5.0


def add_parser(commands: Any) -> None:
    mcp = commands.add_parser(
        "mcp",
        help="list what an MCP server (or a profile's MCP servers) offers",
        description="Connect to an MCP server over streamable HTTP and list its tools. TARGET "
        "is a URL, or the name of an agent profile (each of its servers, as its runs see them). "
        "Exit status 1 when a server could not be listed.",
    )
    actions = mcp.add_subparsers(dest="mcp_command", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="list a server's tools")
    listing.add_argument("target", metavar="TARGET", help="a server URL, or an agent profile")
    listing.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="NAME:VALUE",
        help="a header for a URL target (visible to other users of this machine: prefer "
        "--header-env for a secret)",
    )
    listing.add_argument(
        "--header-env",
        action="append",
        default=[],
        metavar="NAME=VARIABLE",
        help="a header for a URL target, its value read from an environment variable",
    )
    listing.add_argument("--json", action="store_true", help="one JSON document")


def _headers(args: argparse.Namespace) -> dict[str, str]:
    headers: dict[str, str] = {}
    for given in args.header:
        name, sep, value = given.partition(":")
        if not sep or not name.strip():
            raise CliError(f"--header {given!r}: write NAME:VALUE", status=2)
        headers[name.strip()] = value.strip()
    for given in args.header_env:
        name, sep, variable = given.partition("=")
        if not sep or not name.strip() or not variable.strip():
            raise CliError(f"--header-env {given!r}: write NAME=VARIABLE", status=2)
        value = os.environ.get(variable.strip(), "")
        if not value:
            raise CliError(f"--header-env {given!r}: {variable.strip()} is not set", status=2)
        headers[name.strip()] = value
    problem = header_problem(headers)
    if problem is not None:
        raise CliError(f"--header: {problem}", status=2)
    return headers


def _servers(args: argparse.Namespace, settings: Settings) -> list[McpServer]:
    target: str = args.target
    if target.startswith(("http://", "https://")):
        problem = url_problem(target)
        if problem is not None:
            raise CliError(problem, status=2)
        timeouts = McpTimeouts(
            connect=settings.mcp_connect_timeout,
            list=settings.mcp_list_timeout,
            call=settings.mcp_call_timeout,
        )
        return [McpServer(label="cli", url=target, headers=_headers(args), timeouts=timeouts)]
    if args.header or args.header_env:
        raise CliError("--header and --header-env are for a URL target", status=2)
    profiles = settings.profiles()
    if target not in profiles:
        known = ", ".join(sorted(profiles))
        raise CliError(f"{target!r} is neither a URL nor an agent profile ({known})", status=2)
    servers = [server.server() for server in profiles[target].mcp_servers]
    if not servers:
        raise CliError(f"agent profile {target!r} names no MCP server", status=2)
    return servers


def mcp_command(args: argparse.Namespace) -> int:
    settings = load_settings()
    configure_logging("WARNING", settings.log_format, settings.secret_values())
    servers = _servers(args, settings)
    client = McpClient()

    async def fetch(server: McpServer) -> dict[str, Any]:
        try:
            listing = await client.fetch_tools(server)
        except McpFailure as exc:
            return {"server_label": server.label, "url": server.url, "error": str(exc)}
        tools = [
            {
                "name": tool.name,
                "description": tool.description,
                "input_schema": dict(tool.input_schema),
                "offered": server.allows(tool.name),
                "requires_approval": server.require_approval.requires(tool.name),
            }
            for tool in listing.tools
        ]
        return {"server_label": server.label, "url": server.url, "tools": tools}

    async def everything() -> list[dict[str, Any]]:
        return list(await asyncio.gather(*(fetch(s) for s in servers)))

    found = asyncio.run(everything())
    if args.json:
        print(json.dumps({"servers": found}, indent=2))
    else:
        profile = not args.target.startswith(("http://", "https://"))
        for entry in found:
            if "error" in entry:
                print(f"{entry['server_label']} ({entry['url']}): {entry['error']}")
                continue
            print(f"{entry['server_label']} ({entry['url']}): {len(entry['tools'])} tool(s)")
            for tool in entry["tools"]:
                notes = []
                if profile and not tool["offered"]:
                    notes.append("not in allowed_tools: runs never see it")
                elif profile and tool["requires_approval"]:
                    notes.append("asks for approval")
                note = f"  [{'; '.join(notes)}]" if notes else ""
                summary = tool["description"].strip().splitlines()[0] if tool["description"] else ""
                print(f"  {tool['name']}{' - ' + summary if summary else ''}{note}")
    return 1 if any("error" in entry for entry in found) else 0


def reachability(settings: Settings) -> dict[str, dict[str, str]]:
    """Per profile, per MCP server: ``N tool(s)`` when it listed its tools, else why not
    (each server asked for at most :data:`CONFIG_LIST_TIMEOUT` seconds, all at once)."""
    client = McpClient()
    servers = [
        (name, config.server())
        for name, profile in sorted(settings.profiles().items())
        for config in profile.mcp_servers
    ]

    async def one(server: McpServer) -> str:
        try:
            async with asyncio.timeout(CONFIG_LIST_TIMEOUT):
                listing = await client.fetch_tools(server)
        except McpFailure as exc:
            return f"unreachable: {exc.what} {exc.reason}"
        except TimeoutError:
            return f"unreachable: tools/list timed out after {CONFIG_LIST_TIMEOUT:g}s"
        offered = [t for t in listing.tools if server.allows(t.name)]
        return f"reachable, {len(offered)} tool(s) offered"

    async def everything() -> list[str]:
        return list(await asyncio.gather(*(one(s) for _, s in servers)))

    answers = asyncio.run(everything()) if servers else []
    out: dict[str, dict[str, str]] = {}
    for (profile, server), answer in zip(servers, answers, strict=True):
        out.setdefault(profile, {})[server.label] = answer
    return out


COMMANDS = {"mcp": mcp_command}

__all__ = ["COMMANDS", "add_parser", "mcp_command", "reachability"]
