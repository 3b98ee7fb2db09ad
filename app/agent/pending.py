"""Client tools and approvals: a run can pause for the application and resume (docs/tools.md).

Pure functions and values; :mod:`app.agent.run` applies them.

- A **client tool** (:class:`ClientTool`) is offered to the model with the server tools for one
  run, but is executed by the application. A server tool may also need a decision before it
  runs (``approval_required`` of the agent, ``require_approval`` of the run).
- When an attempt calls either kind, the other calls of its batch run; the run then ends
  ``requires_action``. The context it returns ends with the assistant message and the results
  of the calls that ran: its unanswered calls are the **pending calls**.
- A pending call's kind is decided by the run that paused: a call to a client tool of that
  run is a **client** call, any other held call (an approval-gated server tool or MCP tool)
  awaits an **approval**. The run service stores the kind with the call; given those kinds
  (``kinds``), they are what counts. Without them (a context written by hand, or stored before
  kinds were), a call that records a ``server_label`` or whose name is a server tool of the
  agent awaits an approval, any other is a client call.
- The next run must answer every pending call before anything else (:func:`plan_resume`):
  a result per client call, a decision per approval call. Anything else is refused before the
  run starts, with :class:`ToolResultsRequired` or :class:`UnexpectedAnswer`.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, StrictBool

from .messages import (
    AnyMessage,
    AssistantMessage,
    Context,
    TextBlock,
    ToolCallBlock,
    ToolResultMessage,
    UserMessage,
    _Value,
)
from .providers.base import ToolSpec
from .replay import open_batch

TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

PendingKind = Literal["client", "approval"]


# --- values -------------------------------------------------------------------------------


class ClientTool(_Value):
    """A tool the application executes. ``parameters`` is a JSON Schema of type object."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(name=self.name, description=self.description, parameters=self.parameters)


class Approval(_Value):
    """A decision on a pending approval call; a denial's ``reason`` is shown to the model."""

    tool_call_id: str = Field(min_length=1)
    approve: StrictBool
    reason: str = ""


class PendingCall(_Value):
    """A tool call of the context's last assistant message that has no result yet.

    ``server_label``: the server that runs the call once approved (an MCP server's label, or
    ``carryover``); absent for a client call."""

    id: str
    name: str
    #: the raw string the model produced, verbatim
    arguments: str
    kind: PendingKind
    server_label: str | None = Field(
        default=None,
        exclude_if=lambda value: value is None,
        description="The server that runs the call once approved (an MCP server's label, or "
        "`carryover` for the agent's own tools); absent for client calls",
    )


class RequiredAction(_Value):
    """What the application must do before the conversation can go on."""

    type: Literal["tool_calls"] = "tool_calls"
    tool_calls: tuple[PendingCall, ...]


# --- refusals -----------------------------------------------------------------------------


class InvalidTools(ValueError):
    """The run's client tools or ``require_approval`` names are unusable (a 422 for the API).

    ``field`` points at the offending input, e.g. ``tools[1].name`` or ``require_approval[0]``.
    """

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class UnexpectedAnswer(ValueError):
    """A tool result or decision for a call that is not pending, or a second answer to one
    (a 422 for the API). ``tool_call_id`` names the call."""

    def __init__(self, tool_call_id: str, reason: str) -> None:
        super().__init__(f"tool call {tool_call_id!r}: {reason}")
        self.tool_call_id = tool_call_id
        self.reason = reason


class ToolResultsRequired(Exception):
    """The run leaves pending calls unanswered (a 409 ``tool-results-required``).

    ``pending`` lists every pending call of the context; ``unanswered`` those this run's input
    did not answer.
    """

    def __init__(self, pending: Sequence[PendingCall], unanswered: Sequence[PendingCall]) -> None:
        ids = ", ".join(repr(c.id) for c in unanswered)
        super().__init__(f"pending tool call(s) {ids} must be answered before the run goes on")
        self.pending = tuple(pending)
        self.unanswered = tuple(unanswered)


# --- validation of a run's tools ----------------------------------------------------------


def validate_client_tools(
    tools: Sequence[ClientTool],
    server_tools: Collection[str],
    others: Mapping[str, str] | None = None,
) -> tuple[ClientTool, ...]:
    """Check a run's client tools: valid unique names, no clash with a server tool (or with
    ``others``: the run's MCP tools, each name with what offers it), object schemas. Raise
    :class:`InvalidTools` for the first problem."""
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        if not TOOL_NAME.fullmatch(tool.name):
            raise InvalidTools(
                f"tools[{i}].name", f"{tool.name!r} does not match {TOOL_NAME.pattern}"
            )
        if tool.name in server_tools:
            raise InvalidTools(
                f"tools[{i}].name", f"{tool.name!r} is already a server tool of this agent"
            )
        if others is not None and tool.name in others:
            raise InvalidTools(f"tools[{i}].name", f"{tool.name!r} is already {others[tool.name]}")
        if tool.name in seen:
            raise InvalidTools(f"tools[{i}].name", f"two client tools are named {tool.name!r}")
        seen.add(tool.name)
        schema_type = tool.parameters.get("type")
        if schema_type != "object":
            raise InvalidTools(
                f"tools[{i}].parameters",
                f'must be a JSON Schema with "type": "object", not {schema_type!r}',
            )
        properties = tool.parameters.get("properties", {})
        if not isinstance(properties, dict):
            raise InvalidTools(f"tools[{i}].parameters.properties", "must be an object")
    return tuple(tools)


def validate_approval_names(
    names: Iterable[str], server_tools: Collection[str], *, field: str = "require_approval"
) -> frozenset[str]:
    """Names that need approval must be server tools (a typo would silently gate nothing)."""
    for i, name in enumerate(names):
        if name not in server_tools:
            raise InvalidTools(f"{field}[{i}]", f"{name!r} is not a server tool of this agent")
    return frozenset(names)


# --- pending calls ------------------------------------------------------------------------


def open_calls(messages: Sequence[AnyMessage]) -> tuple[ToolCallBlock, ...]:
    """The calls of the last assistant message that have no result, in call order, without
    their kind: what a conversation row keeps of its stored context (``pending_calls``).

    Costs O(size of the last batch), not O(history): ``messages`` may be the last batch alone.
    """
    found = open_batch(messages)
    if found is None:
        return ()
    index, missing = found
    owner = messages[index]
    assert isinstance(owner, AssistantMessage)
    unanswered = set(missing)
    return tuple(call for call in owner.tool_calls if call.id in unanswered)


Kinds = Mapping[str, PendingKind]
"""The kind of each pending call, by call id, as the run that paused decided it."""


def kind_of(call: ToolCallBlock, server_tools: Collection[str], kinds: Kinds | None) -> PendingKind:
    """A pending call's kind: the one stored with it, else approval for a call that records a
    server or names a server tool of the agent, else client."""
    if kinds is not None and call.id in kinds:
        return kinds[call.id]
    if call.server_label is not None or call.name in server_tools:
        return "approval"
    return "client"


def classify(
    calls: Iterable[ToolCallBlock], server_tools: Collection[str], kinds: Kinds | None = None
) -> tuple[PendingCall, ...]:
    """Pending calls with their kind (:func:`kind_of`)."""
    return tuple(
        PendingCall(
            id=call.id,
            name=call.name,
            arguments=call.arguments,
            kind=kind_of(call, server_tools, kinds),
            server_label=call.server_label,
        )
        for call in calls
    )


def pending_calls(
    context: Context, server_tools: Collection[str], kinds: Kinds | None = None
) -> tuple[PendingCall, ...]:
    """The calls of the last assistant message that have no result, in call order, with their
    kind (:func:`kind_of`). Costs O(size of the last batch), not O(history)."""
    return classify(open_calls(context.messages), server_tools, kinds)


def required_action(pending: Sequence[PendingCall]) -> RequiredAction | None:
    return RequiredAction(tool_calls=tuple(pending)) if pending else None


def denied_result(call: PendingCall, reason: str) -> ToolResultMessage:
    """A denial, as the model sees it: an ``is_error`` result carrying the reason."""
    text = f"denied: {reason}" if reason else "denied: the call was not approved"
    return ToolResultMessage(
        tool_call_id=call.id, tool_name=call.name, content=(TextBlock(text=text),), is_error=True
    )


@dataclass(frozen=True)
class Resume:
    """How one run answers the pending calls of its context, in call order.

    ``answers`` maps every pending call id either to its result (client results, denials) or
    to the call itself (an approved call, which the run executes).
    """

    pending: tuple[PendingCall, ...]
    answers: dict[str, ToolResultMessage | ToolCallBlock]

    @property
    def approved(self) -> tuple[ToolCallBlock, ...]:
        return tuple(a for a in self.answers.values() if isinstance(a, ToolCallBlock))

    @property
    def results(self) -> tuple[ToolResultMessage, ...]:
        """The answers that are results already (client results and denials)."""
        return tuple(a for a in self.answers.values() if isinstance(a, ToolResultMessage))


def plan_resume(
    context: Context,
    tool_results: Sequence[ToolResultMessage],
    approvals: Sequence[Approval],
    server_tools: Collection[str],
    kinds: Kinds | None = None,
) -> Resume | None:
    """Match a run's answers to the context's pending calls; ``None`` when nothing is pending.

    Refusals, checked in this order: an answer that does not fit (not pending, the wrong kind,
    a second answer, a result naming another tool, any answer when nothing is pending) raises
    :class:`UnexpectedAnswer`; then a pending call left unanswered raises
    :class:`ToolResultsRequired`. Answers may come in any order.
    """
    pending = pending_calls(context, server_tools, kinds)
    by_id = {c.id: c for c in pending}
    answers: dict[str, ToolResultMessage | ToolCallBlock] = {}

    def claim(call_id: str, wanted: PendingKind) -> PendingCall:
        call = by_id.get(call_id)
        if call is None:
            reason = "is not pending" if pending else "is not pending: nothing is pending"
            raise UnexpectedAnswer(call_id, reason)
        if call_id in answers:
            raise UnexpectedAnswer(call_id, "is answered twice")
        if call.kind != wanted:
            need = "an approval decision" if call.kind == "approval" else "a tool_result"
            raise UnexpectedAnswer(call_id, f"is a pending {call.kind} call: it needs {need}")
        return call

    for result in tool_results:
        call = claim(result.tool_call_id, "client")
        if result.tool_name != call.name:
            raise UnexpectedAnswer(
                call.id,
                f"the tool_result names tool {result.tool_name!r}, "
                f"but the call was to {call.name!r}",
            )
        answers[call.id] = result
    calls = _calls_of(context)
    for decision in approvals:
        call = claim(decision.tool_call_id, "approval")
        answers[call.id] = (
            calls[call.id] if decision.approve else denied_result(call, decision.reason)
        )
    if not pending:
        return None
    unanswered = [c for c in pending if c.id not in answers]
    if unanswered:
        raise ToolResultsRequired(pending, unanswered)
    return Resume(pending=pending, answers={c.id: answers[c.id] for c in pending})


def _calls_of(context: Context) -> dict[str, ToolCallBlock]:
    found = open_batch(context.messages)
    if found is None:
        return {}
    owner = context.messages[found[0]]
    assert isinstance(owner, AssistantMessage)
    return {c.id: c for c in owner.tool_calls}


def split_prompts(
    messages: Sequence[UserMessage | ToolResultMessage],
) -> tuple[tuple[ToolResultMessage, ...], tuple[UserMessage, ...]]:
    """Split a request's ``prompts`` into the leading ``tool_result`` messages and the rest.

    For the HTTP layer, whose ``prompts`` begin with the client results (contract §7). A
    ``tool_result`` after a user message raises :class:`UnexpectedAnswer` (results come first).
    """
    results: list[ToolResultMessage] = []
    prompts: list[UserMessage] = []
    for message in messages:
        if isinstance(message, UserMessage):
            prompts.append(message)
        elif prompts:
            raise UnexpectedAnswer(
                message.tool_call_id, "tool_result messages must come before the prompts"
            )
        else:
            results.append(message)
    return tuple(results), tuple(prompts)
