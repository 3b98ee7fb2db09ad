"""The run service's own types: what a run is asked (:class:`RunRequest`), what it gives back
(:class:`FinishedRun`, :class:`Replayed`), and a run of this process in flight."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from app.agent.mcp import McpServer, McpToolset
from app.agent.messages import AnyMessage, ToolResultMessage, UserMessage
from app.agent.pending import Approval, ClientTool
from app.agent.records import Result, RunSettings
from app.store.stores import OnFailure, RunOutcome, StartedRun
from app.store.tables import Run

from .events import EventRecorder
from .live import LiveStream


@dataclass(frozen=True)
class RunRequest:
    """What a run is asked to do: the prompts, the agent profile, and the policies; with
    client tools and approvals (docs/tools.md), the run's client tools, the server tools it
    gates, and the answers to the conversation's pending calls.

    ``instructions``: a system prompt for this run only (the stored one is unchanged).
    ``settings``: the run's own model, temperature, token limit and output schema; with
    ``instructions``, what its profile must allow (:meth:`AgentPool.for_run`).
    ``append``: messages to add to the context as they are, without calling the model (the
    ``/v1`` surface's items added without a response); the run then has no prompts.
    ``response``: what the ``/v1`` surface keeps of a response's request (its metadata,
    instructions, tools), kept with the run row and given back with its record.
    ``mcp_servers``: the request's own MCP servers (docs/tools.md, "Remote MCP tools").
    ``tool_positions`` / ``mcp_positions``: where each client tool and each MCP server stood in
    the request's ``tools`` (a problem with one names that place)."""

    prompts: tuple[UserMessage, ...]
    agent: str = "default"
    on_failure: OnFailure = "keep"
    if_busy: Literal["reject", "wait", "enqueue"] = "reject"
    client_tools: tuple[ClientTool, ...] = ()
    require_approval: tuple[str, ...] = ()
    tool_results: tuple[ToolResultMessage, ...] = ()
    approvals: tuple[Approval, ...] = ()
    instructions: str | None = None
    settings: RunSettings = field(default_factory=RunSettings)
    append: tuple[AnyMessage, ...] = ()
    response: dict[str, Any] | None = None
    mcp_servers: tuple[McpServer, ...] = ()
    tool_positions: tuple[int, ...] = ()
    mcp_positions: tuple[int, ...] = ()

    def tool_position(self, index: int) -> int:
        """Where client tool ``index`` stood in the request's ``tools``."""
        found = self.tool_positions
        return found[index] if index < len(found) else index

    def mcp_position(self, index: int) -> int:
        """Where MCP server ``index`` stood in the request's ``tools``."""
        found = self.mcp_positions
        return found[index] if index < len(found) else len(self.client_tools) + index

    def with_mcp_servers(self, servers: tuple[McpServer, ...]) -> RunRequest:
        return replace(self, mcp_servers=servers)

    @property
    def mcp_headers(self) -> bool:
        """Does a server of the request carry headers (secrets that are never stored)?"""
        return any(s.headers for s in self.mcp_servers)


@dataclass(frozen=True)
class FinishedRun:
    """A run that ended: its row as started, the agent's Result, and what the store recorded."""

    run: Run
    result: Result
    outcome: RunOutcome


Answer = Callable[[FinishedRun], tuple[int, dict[str, Any]]]
"""How an idempotent request's answer is rendered (status code, body), to be kept for repeats."""


@dataclass(frozen=True)
class Idempotency:
    """An ``Idempotency-Key`` with the request: the key, a hash of the request, and how to
    render the answer that repeats will replay (given by the API, called after the outcome
    was recorded). ``legacy_hash``: the request's hash in the form keys stored by an earlier
    version hold (app/api/fingerprint.py), matched only against such keys."""

    key: str
    request_hash: str
    answer: Answer
    legacy_hash: str | None = None


@dataclass
class ActiveRun:
    """A run of this process in flight: its events and, once done, its outcome."""

    tenant: str
    conversation_id: str
    run_id: str
    started: StartedRun
    events: LiveStream | None  # numbered: the POST's SSE stream (bounded: app/service/live.py)
    done: asyncio.Future[FinishedRun] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    task: asyncio.Task[None] | None = None
    running: bool = False  # the task has begun (a task cancelled before it begins never does)
    stop_requested: bool = False  # asked to stop before the task began
    finishing: bool = False  # the outcome is being written: cancelling now changes nothing
    recorder: EventRecorder | None = None  # its events, stored (app/service/events.py)
    #: its MCP tools, listed before it started (None: listed when it runs, if it has any)
    toolset: McpToolset | None = None


@dataclass(frozen=True)
class Replayed:
    """The stored first answer of an idempotent request (same key, same body)."""

    status_code: int
    body: dict[str, Any]


__all__ = ["ActiveRun", "Answer", "FinishedRun", "Idempotency", "Replayed", "RunRequest"]
