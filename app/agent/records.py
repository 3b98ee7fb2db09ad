"""What a run takes and gives back: Input, Result and the compaction record (contract §2).

Only ``Result.context`` is continuation state. ``new_messages``, ``final`` and ``compactions``
are run records, kept for audit and display.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, ConfigDict, Field, Strict

from .mcp import McpServer, McpToolset
from .messages import (
    AssistantMessage,
    AttemptError,
    Context,
    Integer,
    Message,
    ToolResultMessage,
    Usage,
    UserMessage,
    _Value,
    whole_number,
)
from .pending import Approval, ClientTool, PendingKind, RequiredAction
from .sizes import ContextSize, SizeBounds
from .structured import OutputSchema
from .tokens import TokenTally

#: ``requires_action``: the run paused for the application (client calls or approvals pending)
RunStatus = Literal["completed", "failed", "cancelled", "requires_action"]
CompactionReason = Literal["threshold", "overflow", "manual"]


class Compaction(_Value):
    """One compaction: why, what it folded, the summary it produced, and where it happened.

    ``at`` is the number of the run's ``new_messages`` recorded before the compaction: it
    happened right before ``new_messages[at]``, or after the last one when ``at`` equals their
    number. A threshold compaction sits at the first prompt, an overflow compaction right after
    the attempt that overflowed, a manual one after the results that closed an open tool batch.
    Compactions sharing an ``at`` happened in their listed order. ``at`` is null when the record
    does not know it (a record stored before migration 0002); the agent always sets it.
    """

    reason: CompactionReason
    folded: tuple[Message, ...]
    previous_summary: str
    summary: str
    tokens_before: Integer = Field(ge=0)
    tokens_after: Integer = Field(ge=0)
    usage: Usage = Usage()
    at: Annotated[int, Strict(), Field(ge=0), BeforeValidator(whole_number)] | None = Field(
        default=None,
        description="Where in its run it happened: right before new_messages[at] (equal to "
        "the number of new messages: after the last). Null when not known.",
    )


class RunSettings(_Value):
    """What one run sets for itself, over its agent's config (None: the config's): the model,
    the sampling temperature, the answer's token limit, and the JSON Schema its final answer
    must match (:mod:`app.agent.structured`)."""

    model: str | None = None
    temperature: float | None = None
    max_output_tokens: int | None = None
    output_schema: OutputSchema | None = None


class Input(_Value):
    """A run's input. ``tokens``, when given, is the running tally of ``context.messages``
    (:func:`app.agent.tokens.tally_of`, kept with :func:`app.agent.tokens.advance`); the agent
    then never recounts the history to decide whether to compact. Without it the agent counts
    the context once. ``bounds``, when given, are the bounds the run's context must stay
    within (:class:`~app.agent.sizes.SizeBounds`: the agent compacts near them and fails the
    run rather than pass them); ``size`` is then the running size of ``context``
    (:class:`~app.agent.sizes.ContextSize`; counted once when not given). The last four fields
    are for client tools and approvals (docs/tools.md):

    - ``client_tools``: tools the application executes, offered with the server tools;
    - ``require_approval``: server tools whose calls wait for a decision in this run (added to
      the agent's ``approval_required``);
    - ``tool_results``: results for pending client calls, in any order;
    - ``approvals``: decisions for pending approval calls, in any order.

    ``settings``: this run's own model, temperature, token limit and output schema.

    Remote MCP tools (docs/tools.md, "Remote MCP tools"): ``mcp_servers`` are the run's own
    servers (besides the agent's); ``mcp_tools``, when given, is what they and the agent's
    servers list (:meth:`Agent.list_tools`: the run then does not list them again);
    ``pending_kinds`` the kinds stored with the context's pending calls (by call id).
    """

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        json_schema_serialization_defaults_required=True,
        arbitrary_types_allowed=True,
    )

    context: Context
    prompts: tuple[UserMessage, ...] = ()
    client_tools: tuple[ClientTool, ...] = ()
    require_approval: tuple[str, ...] = ()
    tool_results: tuple[ToolResultMessage, ...] = ()
    approvals: tuple[Approval, ...] = ()
    settings: RunSettings = RunSettings()
    mcp_servers: tuple[McpServer, ...] = ()
    mcp_tools: McpToolset | None = None
    pending_kinds: dict[str, PendingKind] | None = None
    tokens: TokenTally | None = None
    bounds: SizeBounds | None = None
    size: ContextSize | None = None


class Result(_Value):
    """The outcome of one run. A failed or cancelled run returns one too (contract §3)."""

    status: RunStatus
    context: Context
    new_messages: tuple[Message, ...] = ()
    final: AssistantMessage | None = None
    compactions: tuple[Compaction, ...] = ()
    usage: Usage = Usage()
    error: AttemptError | None = None
    admitted: bool = False
    #: the pending calls ``context`` ends with, whatever the status (None when there are none)
    required_action: RequiredAction | None = None
