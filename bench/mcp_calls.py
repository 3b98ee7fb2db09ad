"""What a remote MCP tool call costs (docs/tools.md, "Remote MCP tools").

An MCP server (the ``mcp`` package's ``MCPServer`` with one tool that answers at once, on
streamable HTTP, served by uvicorn in a thread on a free port of 127.0.0.1) is called through
``app.agent.mcp.McpClient``, which opens a session per call (connect, ``initialize``, the call,
close). Against it, the floor: the same calls on ONE session kept open. Also: a listing kept in
the cache against one fetched. Both server modes are measured: stateful (sessions, SSE answers)
and stateless with JSON answers. Wall-clock times in this process (client and server share the
machine, so a loaded machine shows in every figure); each figure is the median of ``--calls``.

    .venv/bin/python bench/mcp_calls.py [--calls 200] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import uvicorn
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver import MCPServer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.agent.mcp import ListingCache, McpClient, McpServer
from bench._common import free_port, machine_note, table, write_json


def serve(stateless: bool) -> tuple[str, uvicorn.Server, threading.Thread]:
    server = MCPServer("bench", log_level="WARNING")

    @server.tool()
    async def echo(text: str) -> str:
        """Answers its text."""
        return text

    port = free_port()
    app = server.streamable_http_app(stateless_http=stateless, json_response=stateless)
    running = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=running.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not running.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the MCP server did not start")
        time.sleep(0.01)
    return f"http://127.0.0.1:{port}/mcp", running, thread


async def measure(url: str, calls: int) -> dict[str, float]:
    server = McpServer(label="bench", url=url)
    client = McpClient(cache=ListingCache(ttl=3600))
    per_call: list[float] = []
    for i in range(calls):
        started = time.perf_counter()
        await client.call_tool(server, "echo", {"text": f"t{i}"})
        per_call.append(time.perf_counter() - started)
    kept: list[float] = []
    async with streamable_http_client(url) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        for i in range(calls):
            started = time.perf_counter()
            await session.call_tool("echo", {"text": f"t{i}"})
            kept.append(time.perf_counter() - started)
    fetched: list[float] = []
    for _ in range(max(1, calls // 4)):
        started = time.perf_counter()
        await client.fetch_tools(server)
        fetched.append(time.perf_counter() - started)
    await client.list_tools(server)
    cached: list[float] = []
    for _ in range(calls):
        started = time.perf_counter()
        await client.list_tools(server)
        cached.append(time.perf_counter() - started)
    ms = 1000.0
    return {
        "call_own_session_ms": statistics.median(per_call) * ms,
        "call_kept_session_ms": statistics.median(kept) * ms,
        "listing_fetched_ms": statistics.median(fetched) * ms,
        "listing_cached_ms": statistics.median(cached) * ms,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    figures: dict[str, dict[str, float]] = {}
    for mode, stateless in (("stateful (SSE)", False), ("stateless (JSON)", True)):
        url, running, thread = serve(stateless)
        try:
            figures[mode] = asyncio.run(measure(url, args.calls))
        finally:
            running.should_exit = True
            thread.join(timeout=30)
    rows = [
        [
            mode,
            f"{f['call_own_session_ms']:.1f}",
            f"{f['call_kept_session_ms']:.1f}",
            f"{f['call_own_session_ms'] - f['call_kept_session_ms']:.1f}",
            f"{f['listing_fetched_ms']:.1f}",
            f"{f['listing_cached_ms'] * 1000:.0f} µs",
        ]
        for mode, f in figures.items()
    ]
    print(machine_note())
    print(
        table(
            [
                "server",
                "call, own session (ms)",
                "call, kept session (ms)",
                "session cost (ms)",
                "listing fetched (ms)",
                "listing cached",
            ],
            rows,
        )
    )
    write_json(args.json, {"calls": args.calls, "figures": figures, "load": os.getloadavg()})


if __name__ == "__main__":
    main()
