"""Request and response bodies of the HTTP API (SPEC §4).

Messages and the Context are the agent's own pydantic models (:mod:`app.agent.messages`), so the
OpenAPI document describes exactly what the codec accepts: a discriminated union on ``type``
for every message and block.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.agent.messages import AssistantMessage, Context, Message, Usage, UserMessage
from app.agent.records import Compaction

CONVERSATION_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"

ConversationId = Annotated[
    str,
    Field(pattern=CONVERSATION_ID_PATTERN, min_length=1, max_length=128, examples=["support-4711"]),
]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ConversationCreate(_Body):
    """Create a conversation. Without ``id`` the server generates one."""

    id: ConversationId | None = None
    system_prompt: str = ""


class Conversation(BaseModel):
    """Conversation metadata: cheap to read, never the whole context."""

    id: str
    etag: str = Field(description="Strong ETag of the stored context (as in the ETag header)")
    system_prompt: str
    has_summary: bool
    message_count: int
    run_count: int
    transcript_count: int
    active_run_id: str | None
    created_at: datetime
    updated_at: datetime


class ConversationPage(BaseModel):
    items: list[Conversation]
    next_cursor: str | None = Field(
        description="Pass as `cursor` to get the next page; null on the last page"
    )


Prompt = Annotated[
    str | UserMessage,
    Field(
        description="A user message, or a bare string meaning one user message with one text block"
    ),
]


class RunCreate(_Body):
    """Run the agent on new prompts (SPEC §4)."""

    prompts: list[Prompt] = Field(min_length=1)
    agent: str = Field(
        default="default",
        min_length=1,
        max_length=64,
        description="Name of the agent profile to run",
    )
    on_failure: Literal["keep", "discard"] = Field(
        default="keep",
        description="keep: store a failed run's returned context (no tool is re-run); "
        "discard: the stored state stays as before the run",
    )
    if_busy: Literal["reject", "wait", "enqueue"] = Field(
        default="reject",
        description="When another run holds the conversation: reject (409 run-in-progress), "
        "wait (in arrival order, at most CARRYOVER_BUSY_WAIT_SECONDS, then 409), or enqueue "
        "(queued behind it, durably, and run in arrival order; see docs/runs.md)",
    )
    on_disconnect: Literal["continue", "cancel"] = "continue"
    stream: bool = False

    def user_messages(self) -> tuple[UserMessage, ...]:
        return tuple(UserMessage.text(p) if isinstance(p, str) else p for p in self.prompts)


RunStatus = Literal[
    "queued", "running", "completed", "failed", "cancelled", "conflicted", "interrupted"
]


class RunProblem(BaseModel):
    """Why a run did not complete, as an RFC 9457 problem object."""

    model_config = ConfigDict(extra="allow", json_schema_serialization_defaults_required=True)

    type: str
    title: str
    detail: str
    kind: str | None = Field(default=None, description="overflow, retryable, fatal, aborted, ...")
    provider_status: int | None = None
    code: str | None = None


class Run(BaseModel):
    """A run record, and the answer to ``POST …/runs``."""

    run_id: str
    conversation_id: str
    agent: str
    status: RunStatus
    stored: bool = Field(description="Did this run's context become the stored state?")
    etag: str | None = Field(
        description="In the answer to a run: the ETag of the stored state after it (also in "
        "the ETag header). In a run record: the ETag its context was stored under, "
        "null when it was not stored"
    )
    base_etag: str
    on_failure: Literal["keep", "discard"]
    prompts: list[UserMessage]
    context: Context | None = Field(
        default=None,
        description="The context this run returned; left out with "
        "`Prefer: return=minimal` and in run listings",
    )
    new_messages: list[Message]
    final: AssistantMessage | None
    compactions: list[Compaction]
    usage: Usage
    error: RunProblem | None
    created_at: datetime
    finished_at: datetime | None
    duration_ms: int | None
    trace_id: str | None = Field(
        default=None,
        description="The OpenTelemetry trace the run was started in (32 hex digits; an "
        "incoming traceparent's trace), null when tracing is off (docs/operations.md)",
    )


class RunPage(BaseModel):
    items: list[Run]
    next_cursor: str | None


class TranscriptEntry(BaseModel):
    seq: int
    run_id: str | None
    kind: Literal["prompt", "attempt", "tool_result", "compaction", "context_replaced"]
    failed: bool = Field(description="A failed or aborted assistant attempt")
    body: dict[str, Any] = Field(
        description="The message (prompt, attempt, tool_result), the compaction record, or "
        "the replacing context"
    )
    created_at: datetime


class TranscriptPage(BaseModel):
    items: list[TranscriptEntry]
    next_cursor: str | None


class Health(BaseModel):
    status: Literal["ok"]


class Readiness(BaseModel):
    status: Literal["ready", "not_ready"]
    database: bool
    schema_revision: str | None
    expected_revision: str
    unready_profiles: dict[str, str] = Field(
        default_factory=dict,
        description="Agent profiles that cannot run, each with why (e.g. its key's variable "
        "is unset); any makes the service not ready.",
    )
