"""The values one run of :class:`~app.agent.run.Agent` works with: its config, the plan
:meth:`~app.agent.run.Agent.check` makes of an Input, the state the run builds up, and the small
helpers every stage shares (the failure that ends a run, the event emitter)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field

from .events import EventSink, RunEvent
from .mcp import McpClient, McpServer, McpToolset
from .mcp.servers import check_labels
from .messages import AnyMessage, AssistantMessage, AttemptError, Context, ToolCallBlock, Usage
from .opaque import carry_over
from .pending import Kinds, PendingKind, RequiredAction, Resume, validate_approval_names
from .providers.base import Provider, ProviderError, ToolSpec
from .records import Compaction, Result, RunSettings, RunStatus
from .retry import RetryPolicy
from .sizes import ContextSize, SizeBounds
from .tokens import TokenTally
from .tools import CallRunner, ToolRegistry


@dataclass(frozen=True)
class AgentConfig:
    """How an agent runs. One config (and one Agent) serves any number of contexts."""

    provider: Provider
    model: str = ""
    tools: ToolRegistry = field(default_factory=ToolRegistry)
    context_window: int = 128_000
    compact_at: float = 0.8
    #: share of the window kept after a threshold compaction
    keep_after_compaction: float = 0.4
    max_turns: int = 32
    max_overflow_retries: int = 2
    max_output_tokens: int | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    #: server tools whose calls wait for the application's decision (docs/tools.md)
    approval_required: frozenset[str] = frozenset()
    #: how many times an answer that does not match the run's output schema is sent back
    #: to the model with the violation (docs/runs.md, "Structured outputs")
    output_retries: int = 1
    #: remote MCP servers of every run (docs/tools.md, "Remote MCP tools")
    mcp_servers: tuple[McpServer, ...] = ()
    #: lists and calls MCP tools (one per process, with its listing cache); needed as soon as
    #: the config or a run names an MCP server
    mcp: McpClient | None = None

    def __post_init__(self) -> None:
        validate_approval_names(self.approval_required, self.tools.tools, field="approval_required")
        check_labels(self.mcp_servers, "mcp_servers")


@dataclass(frozen=True)
class RunPlan:
    """What :meth:`Agent.check` makes of an Input: the tools offered to the model, the names
    whose calls pause the run (client tools and approval-gated server tools), and how the
    context's pending calls are answered; and the run's own settings."""

    tools: tuple[ToolSpec, ...]
    holds: frozenset[str] = frozenset()
    resume: Resume | None = None
    settings: RunSettings = field(default_factory=RunSettings)
    #: runs a call: the agent's tools, and the run's MCP tools when it has any
    runner: CallRunner | None = None
    #: the run's client tools (a held call to one of them is a client call; any other held
    #: call awaits an approval)
    client_names: frozenset[str] = frozenset()
    #: the server that executes each server-side tool, recorded on its calls (``server_label``)
    labels: Mapping[str, str] = field(default_factory=dict)
    #: the kinds of the context's pending calls, as stored with them
    kinds: Kinds | None = None
    #: the run's MCP tools (None: it has no MCP server)
    mcp: McpToolset | None = None


class _RunFailed(Exception):
    def __init__(self, error: AttemptError) -> None:
        super().__init__(error.message)
        self.error = error


@dataclass
class _State:
    """What one run has produced so far; turned into a Result however the run ends."""

    context: Context
    tally: TokenTally  # always the tally of context.messages
    #: the bounds the context stays within, and its running size (both None: not tracked)
    bounds: SizeBounds | None = None
    size: ContextSize | None = None
    new_messages: list[AnyMessage] = field(default_factory=list)
    final: AssistantMessage | None = None
    compactions: list[Compaction] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    admitted: bool = False
    plan: RunPlan = field(default_factory=lambda: RunPlan(tools=()))
    #: ids of the calls this run executes; on failure the unfinished ones are closed
    closable: set[str] = field(default_factory=set)
    #: answers sent back for not matching the run's output schema (app.agent.structured)
    corrections: int = 0
    #: the kind of each call this run held (and of the pending calls it was given)
    kinds: dict[str, PendingKind] = field(default_factory=dict)

    def append(self, *messages: AnyMessage) -> None:
        """Messages that join both the continuation state and the run record."""
        before = self.context
        # one concatenation of the tuples (unpacking both into a new one copies twice)
        self.context = before.model_copy(update={"messages": before.messages + messages})
        carry_over(before, self.context, messages)  # what a provider is sent, in O(appended)
        self.tally = self.tally.extend(messages)
        if self.size is not None:
            self.size = self.size.extend(messages)
        self.new_messages.extend(messages)

    def attempt(self, message: AssistantMessage) -> AssistantMessage:
        """Every attempt is a run record; only a replayable one joins the context. Its calls to
        server-side tools record the server that runs them (``server_label``: a replayable
        attempt's, whose calls run; a failed attempt stays as the provider sent it); the
        attempt as recorded is returned."""
        if message.replayable:
            message = stamped(message, self.plan.labels)
        self.final = message
        self.usage = self.usage + message.usage
        if message.replayable:
            self.append(message)
            holds = self.plan.holds
            self.closable.update(c.id for c in message.tool_calls if c.name not in holds)
            for call in message.tool_calls:
                if call.name in holds:
                    client = call.name in self.plan.client_names
                    self.kinds[call.id] = "client" if client else "approval"
        else:
            self.new_messages.append(message)
        return message

    def result(
        self,
        status: RunStatus,
        error: AttemptError | None = None,
        required: RequiredAction | None = None,
    ) -> Result:
        return Result(
            status=status,
            context=self.context,
            new_messages=tuple(self.new_messages),
            final=self.final,
            compactions=tuple(self.compactions),
            usage=self.usage,
            error=error,
            admitted=self.admitted,
            required_action=required,
        )


CANCELLED = AttemptError(kind="aborted", message="the run was cancelled")


def stamped(message: AssistantMessage, labels: Mapping[str, str]) -> AssistantMessage:
    """``message`` with each call to a server-side tool recording its server (O(its blocks);
    the message itself when nothing changes)."""
    if not labels or not any(
        isinstance(b, ToolCallBlock) and b.server_label is None and b.name in labels
        for b in message.content
    ):
        return message
    content = tuple(
        b.model_copy(update={"server_label": labels[b.name]})
        if isinstance(b, ToolCallBlock) and b.server_label is None and b.name in labels
        else b
        for b in message.content
    )
    return message.model_copy(update={"content": content})


def _error(exc: ProviderError, prefix: str = "") -> AttemptError:
    return AttemptError(
        kind=exc.kind, message=prefix + exc.message, status=exc.status, code=exc.code
    )


class _Emitter:
    """Delivers run events; a failing sink never fails the run."""

    def __init__(self, sink: EventSink | None) -> None:
        self._sink = sink

    async def __call__(self, event: RunEvent) -> None:
        if self._sink is None:
            return
        try:
            pending = self._sink(event)
            if pending is not None:
                await pending
        except asyncio.CancelledError:
            raise
        except Exception:  # a broken listener (e.g. a gone client) must not end the run
            self._sink = None


async def _shielded(awaitable: Awaitable[object]) -> None:
    """Finish a bookkeeping await while the run is being cancelled."""
    try:
        await awaitable
    except asyncio.CancelledError:
        pass
