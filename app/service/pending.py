"""Client tools and approvals in the run service (docs/tools.md, contract §7).

The agent decides (:mod:`app.agent.pending`); this module maps its decisions onto a run of the
service:

- :func:`agent_input` builds the agent's Input from a :class:`RunRequest` and the loaded
  context;
- :func:`checker` is the pre-check a run's start calls under the conversation's lease, inside
  the transaction that would record the run: a refusal raises a :class:`CarryoverError` there,
  which rolls the transaction back — no run record, no lease, no idempotency key is left;
- :func:`answered` says, for the transcript, which of a run's results answer pending calls
  (client results, approval decisions);
- :func:`split_prompts` splits a request's ``prompts`` into the leading ``tool_result``
  messages and the user messages;
- a queued run (app/service/queue.py) keeps its request's tool inputs with its row
  (:func:`tool_inputs`, :func:`queued_request`), is pre-checked when it is queued for what does
  not depend on the context (:func:`check_on_arrival`), and with :func:`checker` when its turn
  comes, on the context it would then run on.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, cast

from app.agent.codec import dump_messages, load_messages
from app.agent.mcp import McpServer, McpToolset
from app.agent.messages import AnyMessage, Context, ToolResultMessage, UserMessage
from app.agent.pending import (
    Approval,
    ClientTool,
    InvalidTools,
    Kinds,
    PendingCall,
    ToolResultsRequired,
    UnexpectedAnswer,
)
from app.agent.pending import split_prompts as _split
from app.agent.records import Input, Result, RunSettings
from app.agent.replay import ReplayError, validate_messages
from app.agent.run import Agent
from app.agent.sizes import ContextSize, SizeBounds
from app.agent.tokens import TokenTally
from app.errors import CarryoverError
from app.store.changes import Answered, StoredPending, pending_blocks, stored_kinds
from app.store.stores import Loaded
from app.store.tables import Conversation, Run

from .agents import AgentPool, UnknownAgent
from .errors import UnreplayableContext
from .types import RunRequest


class PendingCallsUnanswered(CarryoverError):
    """409 ``tool-results-required``: the run leaves pending calls unanswered."""

    slug = "tool-results-required"
    status = 409

    def __init__(self, refusal: ToolResultsRequired) -> None:
        ids = ", ".join(c.id for c in refusal.unanswered)
        super().__init__(
            f"the conversation awaits results or approvals for tool call(s) {ids}: answer "
            "every pending call (tool_result messages at the start of prompts, approvals) "
            "before anything else",
            pending_tool_calls=[dump_call(c) for c in refusal.pending],
            unanswered=[c.id for c in refusal.unanswered],
        )


class AnswerNotPending(CarryoverError):
    """422 ``unexpected-tool-answer``: a result or decision that answers no pending call."""

    slug = "unexpected-tool-answer"
    status = 422

    def __init__(self, refusal: UnexpectedAnswer) -> None:
        super().__init__(str(refusal), tool_call_id=refusal.tool_call_id)


class BadClientTools(CarryoverError):
    """422 ``validation-error`` on ``body.tools[i]…`` or ``body.require_approval[i]``."""

    slug = "validation-error"
    status = 422

    def __init__(self, field: str, reason: str) -> None:
        path = f"body.{field}"
        super().__init__(f"{path}: {reason}", errors=[{"path": path, "message": reason}])


def dump_call(call: PendingCall) -> dict[str, Any]:
    return call.model_dump(mode="json")


_TOOL_FIELD = re.compile(r"^(tools|mcp_servers)\[(\d+)\](.*)$")


def request_field(field: str, request: RunRequest | None) -> str:
    """An agent's field (``tools[i]…`` of its client tools, ``mcp_servers[i]…`` of the run's
    MCP servers) as the place in the request's ``tools`` it came from."""
    found = _TOOL_FIELD.match(field)
    if found is None or request is None:
        return field
    kind, index, rest = found.group(1), int(found.group(2)), found.group(3)
    position = request.tool_position(index) if kind == "tools" else request.mcp_position(index)
    return f"tools[{position}]{rest}"


def refusal(exc: Exception, request: RunRequest | None = None) -> CarryoverError | None:
    """The service's refusal for one of the agent's, or None for any other exception."""
    if isinstance(exc, ToolResultsRequired):
        return PendingCallsUnanswered(exc)
    if isinstance(exc, UnexpectedAnswer):
        return AnswerNotPending(exc)
    if isinstance(exc, InvalidTools):
        return BadClientTools(request_field(exc.field, request), exc.reason)
    return None


def split_prompts(
    messages: Sequence[UserMessage | ToolResultMessage],
) -> tuple[tuple[ToolResultMessage, ...], tuple[UserMessage, ...]]:
    """``prompts`` of a request: the leading tool results, then the user messages (422 for a
    tool result after a user message)."""
    try:
        return _split(messages)
    except UnexpectedAnswer as exc:
        raise AnswerNotPending(exc) from None


def agent_input(
    loaded: Loaded,
    request: RunRequest,
    bounds: SizeBounds | None = None,
    toolset: McpToolset | None = None,
) -> Input:
    return run_input(
        loaded.context,
        request,
        bounds,
        tokens=loaded.tokens,
        size=loaded.size,
        toolset=toolset,
        kinds=stored_kinds(loaded.pending_calls),
    )


def run_input(
    context: Context,
    request: RunRequest,
    bounds: SizeBounds | None = None,
    *,
    tokens: TokenTally | None = None,
    size: ContextSize | None = None,
    toolset: McpToolset | None = None,
    kinds: Kinds | None = None,
) -> Input:
    """The agent's Input for a request on ``context`` (stored, or sent whole by a client).
    ``toolset``: its MCP tools when listed already; ``kinds``: those stored with the
    context's pending calls."""
    if request.instructions is not None:  # this run only: the stored one is not changed
        context = context.model_copy(update={"system_prompt": request.instructions})
    return Input(
        context=context,
        tokens=tokens,
        bounds=bounds,
        size=size,
        prompts=request.prompts,
        client_tools=request.client_tools,
        require_approval=request.require_approval,
        tool_results=request.tool_results,
        approvals=request.approvals,
        settings=request.settings,
        mcp_servers=request.mcp_servers,
        mcp_tools=toolset,
        pending_kinds=dict(kinds) if kinds else None,
    )


def checker(
    agent: Agent, request: RunRequest, toolset: McpToolset | None = None
) -> Callable[[Context, StoredPending], None]:
    """The pre-check of a run, on a context that ends like the stored one (the store gives its
    last batch alone; pure, O(last batch)) and its pending calls as the row stores them."""

    def check(context: Context, stored: StoredPending = None) -> None:
        if request.append:
            check_append(context, request.append)
            return
        try:
            plan = agent.check(
                Input(
                    context=context,
                    prompts=request.prompts,
                    client_tools=request.client_tools,
                    require_approval=request.require_approval,
                    tool_results=request.tool_results,
                    approvals=request.approvals,
                    mcp_servers=request.mcp_servers,
                    mcp_tools=toolset,
                    pending_kinds=stored_kinds(stored) or None,
                )
            )
        except (InvalidTools, UnexpectedAnswer, ToolResultsRequired) as exc:
            found = refusal(exc, request)
            assert found is not None
            raise found from None
        if plan.resume is None and not request.prompts:
            raise BadClientTools(
                "prompts", "must not be empty unless it answers pending tool calls"
            )

    return check


def check_append(context: Context, append: Sequence[AnyMessage]) -> None:
    """Messages added without a run keep the context replayable, though it may end with calls
    still pending (``context`` ends like the stored one: its last batch is enough)."""
    tail = context.messages
    try:
        validate_messages((*tail, *append), allow_open_batch=True)
    except ReplayError as exc:
        index = max(exc.index - len(tail), 0)
        raise UnreplayableContext(index, f"items[{index}]: {exc.reason}") from None


def appended_result(loaded: Loaded, append: Sequence[AnyMessage]) -> Result:
    """The outcome of a run that only adds messages: the context with them, no model call."""
    context = loaded.context.model_copy(
        update={"messages": loaded.context.messages + tuple(append)}
    )
    return Result(status="completed", context=context, new_messages=tuple(append), admitted=True)


def check_on_arrival(agent: Agent, request: RunRequest) -> None:
    """What :func:`checker` refuses whatever the context: bad client tools or approval names
    (a queued run is refused so when it arrives; the rest is checked when its turn comes)."""
    try:
        agent.check(
            Input(
                context=Context(),
                client_tools=request.client_tools,
                require_approval=request.require_approval,
                mcp_servers=request.mcp_servers,
            )
        )
    except InvalidTools as exc:
        raise BadClientTools(request_field(exc.field, request), exc.reason) from None


def kept_inputs(request: RunRequest) -> dict[str, Any] | None:
    """What every run keeps of its request in its row (``runs.tool_inputs``): its
    ``instructions`` and what the ``/v1`` surface keeps of a response (None: nothing)."""
    kept: dict[str, Any] = {}
    if request.instructions is not None:
        kept["instructions"] = request.instructions
    settings = request.settings.model_dump(mode="json", exclude_none=True)
    if settings:
        kept["settings"] = settings
    if request.response is not None:
        kept["response"] = request.response
    return kept or None


def tool_inputs(request: RunRequest) -> dict[str, Any] | None:
    """What a queued run keeps of its request besides its prompts (None: nothing): the
    :func:`kept_inputs` of every run, and its client tools, approvals and answers."""
    kept = kept_inputs(request) or {}
    if not (
        request.client_tools
        or request.require_approval
        or request.tool_results
        or request.approvals
        or request.mcp_servers
    ):
        return kept or None
    assert not request.mcp_headers  # refused before (app/service/mcp.py): never stored
    return {
        **kept,
        "client_tools": [t.model_dump(mode="json") for t in request.client_tools],
        "require_approval": list(request.require_approval),
        "tool_results": dump_messages(request.tool_results),
        "approvals": [a.model_dump(mode="json") for a in request.approvals],
        "mcp_servers": [
            s.model_dump(mode="json", exclude={"headers"}) for s in request.mcp_servers
        ],
        "tool_positions": list(request.tool_positions),
        "mcp_positions": list(request.mcp_positions),
    }


def queued_request(run: Run) -> RunRequest:
    """The request of a queued run, from its row (its prompts and :func:`tool_inputs`)."""
    inputs = run.tool_inputs or {}
    return RunRequest(
        prompts=cast(tuple[UserMessage, ...], load_messages(run.prompts, "prompts")),
        agent=run.agent,
        on_failure="discard" if run.on_failure == "discard" else "keep",
        client_tools=tuple(ClientTool.model_validate(t) for t in inputs.get("client_tools", ())),
        require_approval=tuple(inputs.get("require_approval", ())),
        tool_results=cast(
            tuple[ToolResultMessage, ...],
            load_messages(inputs.get("tool_results", []), "tool_results"),
        ),
        approvals=tuple(Approval.model_validate(a) for a in inputs.get("approvals", ())),
        instructions=inputs.get("instructions"),
        settings=RunSettings.model_validate(inputs.get("settings") or {}),
        response=inputs.get("response"),
        mcp_servers=tuple(McpServer.model_validate(m) for m in inputs.get("mcp_servers", ())),
        tool_positions=tuple(inputs.get("tool_positions", ())),
        mcp_positions=tuple(inputs.get("mcp_positions", ())),
    )


def output_schema_of(run: Run) -> dict[str, Any] | None:
    """The JSON Schema a run's answer had to match (None: it asked for none)."""
    schema = ((run.tool_inputs or {}).get("settings") or {}).get("output_schema")
    return schema.get("schema") if isinstance(schema, dict) else None


def stored_pending_calls(
    agents: AgentPool, conv: Conversation, agent_name: str | None
) -> tuple[PendingCall, ...]:
    """The pending calls of a stored context, from its row alone (``pending_calls``, written by
    every write of the context), each with the kind stored with it. A call stored without one
    (a context written by PUT or import, or before kinds were stored) is classified by the
    agent profile ``agent_name`` of the conversation's latest run (``default`` without one, or
    when that profile is gone) as it is configured now."""
    if not conv.pending_calls:
        return ()
    try:
        agent = agents.get(agent_name or "default")
    except UnknownAgent:
        agent = agents.get("default")
    return agent.classify(pending_blocks(conv.pending_calls), stored_kinds(conv.pending_calls))


def required_action(result: Result) -> dict[str, Any] | None:
    """What a run that paused asks for, as its ``run.requires_action`` event says it — right
    before ``run.finished``, and only once the pause is stored
    (:meth:`EventRecorder.close_paused`); None for a run that did not pause."""
    if result.status == "requires_action" and result.required_action is not None:
        dumped: dict[str, Any] = result.required_action.model_dump(mode="json")
        return dumped
    return None


def answered(request: RunRequest) -> dict[str, Answered]:
    """What the transcript records of a resuming run's answers, by tool call id."""
    out = {r.tool_call_id: Answered(kind="client") for r in request.tool_results}
    for decision in request.approvals:
        out[decision.tool_call_id] = Answered(
            kind="approval", approve=decision.approve, reason=decision.reason
        )
    return out


__all__ = [
    "AnswerNotPending",
    "BadClientTools",
    "PendingCallsUnanswered",
    "agent_input",
    "answered",
    "check_on_arrival",
    "checker",
    "dump_call",
    "kept_inputs",
    "output_schema_of",
    "queued_request",
    "refusal",
    "required_action",
    "split_prompts",
    "stored_pending_calls",
    "tool_inputs",
]
