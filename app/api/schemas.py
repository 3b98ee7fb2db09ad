"""Request and response bodies of the HTTP API (contract §4).

Messages and the Context are the agent's own pydantic models (:mod:`app.agent.messages`), so the
OpenAPI document describes exactly what the codec accepts: a discriminated union on ``type``
for every message and block.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    StrictBool,
    model_validator,
)

from app.agent.messages import (
    MAX_SAFE_INTEGER,
    MAX_TOKEN_COUNT,
    NO_NUL_PATTERN,
    AssistantMessage,
    Context,
    Message,
    ToolResultMessage,
    Usage,
    UserMessage,
    whole_number,
)
from app.agent.pending import Approval, PendingCall, RequiredAction
from app.agent.records import Compaction, RunSettings
from app.agent.structured import OutputSchema, schema_problem
from app.store.changes import TranscriptKind

from .tools import MAX_MCP_SERVERS, McpTool, ToolEntry

CONVERSATION_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"

ConversationId = Annotated[
    str,
    Field(pattern=CONVERSATION_ID_PATTERN, min_length=1, max_length=128, examples=["support-4711"]),
]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


_RFC3339 = re.compile(
    r"\A[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})\Z"
)


def _rfc3339(value: Any) -> Any:
    """Only RFC 3339 text (with an offset) is a time: no Unix numbers, no other layouts."""
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str) or not _RFC3339.match(value):
        raise ValueError(
            "expected an RFC 3339 date-time with an offset (e.g. 2026-01-31T12:00:00Z)"
        )
    return value


def _in_utc_range(value: datetime) -> datetime:
    """A time that is a time in UTC too: its offset must not carry it past year 1 or 9999
    (times are compared and stored in UTC)."""
    try:
        value.astimezone(UTC)
    except OverflowError:
        raise ValueError("the time in UTC falls outside years 1 to 9999") from None
    return value


#: an RFC 3339 time with an offset, as the document's ``format: date-time`` says
Timestamp = Annotated[AwareDatetime, BeforeValidator(_rfc3339), AfterValidator(_in_utc_range)]

METADATA_KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
MetadataKey = Annotated[str, Field(pattern=METADATA_KEY_PATTERN, max_length=128)]
#: no NUL (said here, checked by app.api.metadata.check_metadata on every way in)
MetadataValue = Annotated[
    str, Field(max_length=1024, json_schema_extra={"pattern": NO_NUL_PATTERN})
]
Metadata = Annotated[
    dict[MetadataKey, MetadataValue],
    Field(
        description="Flat string keys and string values, not part of the Context (changing it "
        "leaves the ETag alone). Limits: `max_metadata_keys`, `max_metadata_key_chars`, "
        "`max_metadata_value_chars` (422 `limit-exceeded`)",
        examples=[{"user": "u-17", "topic": "billing"}],
    ),
]
TTL_SECONDS = Annotated[
    Annotated[int, Strict(), Field(ge=1, le=10 * 365 * 86400), BeforeValidator(whole_number)]
    | None,
    Field(description="Expire this many seconds from now"),
]


class _Expiry(_Body):
    # not both: stated in the document as the server checks it
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "not": {
                "required": ["expires_at", "ttl_seconds"],
                "properties": {
                    "expires_at": {"type": "string"},
                    "ttl_seconds": {"type": "integer"},
                },
            }
        },
    )

    expires_at: Timestamp | None = Field(
        default=None,
        description="When the retention sweeper deletes the conversation with every record",
    )
    ttl_seconds: TTL_SECONDS = None

    @model_validator(mode="after")
    def _one_expiry(self) -> _Expiry:
        if self.expires_at is not None and self.ttl_seconds is not None:
            raise ValueError("give expires_at or ttl_seconds, not both")
        return self


class ConversationCreate(_Expiry):
    """Create a conversation. Without ``id`` the server generates one."""

    id: ConversationId | None = None
    system_prompt: str = Field(default="", json_schema_extra={"pattern": NO_NUL_PATTERN})
    metadata: Metadata = Field(default_factory=dict)


class ConversationPatch(_Expiry):
    """An RFC 7396 merge patch of a conversation (`application/merge-patch+json`).

    `metadata`: each key set to a string is set, each key set to `null` is removed, keys left
    out stay. `expires_at: null` clears the expiry (the deployment default applies again);
    `ttl_seconds` sets it from now. Members left out stay as they are."""

    metadata: Annotated[
        dict[MetadataKey, MetadataValue | None] | None,
        Field(
            description="Keys to set (a string) or remove (null); `null` for the whole member "
            "removes every key",
        ),
    ] = None


class ConversationFork(_Body):
    """Fork a conversation: a new one with the source's context (or its first `messages`)."""

    id: ConversationId | None = None
    messages: (
        Annotated[int, Strict(), Field(ge=0, le=MAX_SAFE_INTEGER), BeforeValidator(whole_number)]
        | None
    ) = Field(
        default=None,
        description="Copy only the first N messages; N must not cut between a tool call and "
        "its result (422 `unsafe-cut`)",
    )
    metadata: Metadata | None = Field(
        default=None, description="The fork's metadata; left out, the source's is copied"
    )
    version: (
        Annotated[int, Strict(), Field(ge=1, le=MAX_SAFE_INTEGER), BeforeValidator(whole_number)]
        | None
    ) = Field(
        default=None,
        description="Fork the context as it stood at this version (`GET …/versions`); "
        "404 for a version it never had, 410 `version-expired` past the version retention",
    )


class ContextVersion(BaseModel):
    """One kept version of a conversation's context."""

    version: int
    etag: str = Field(description="The ETag the context had at this version")
    message_count: int
    cause: Literal["created", "run", "replaced", "forked", "imported", "migrated"] = Field(
        description="What wrote it: the conversation's creation, a run (`run_id`), a PUT of "
        "the context, a fork, an import, or the upgrade that started keeping versions"
    )
    run_id: str | None
    created_at: datetime


class ContextVersionPage(BaseModel):
    items: list[ContextVersion] = Field(description="Newest first")
    next_cursor: str | None


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
    pending_tool_calls: list[PendingCall] = Field(
        default_factory=list,
        description="The tool calls the stored context awaits results or approvals for "
        "(docs/tools.md): the next run must answer every one first",
    )
    created_at: datetime
    updated_at: datetime
    metadata: dict[str, str]
    expires_at: datetime | None = Field(
        description="When it will be deleted (its own expiry; the deployment default "
        "retention, when configured, applies from `updated_at` to those without one)"
    )


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


RunInput = Annotated[
    str | Annotated[UserMessage | ToolResultMessage, Field(discriminator="type")],
    Field(
        description="A user message (a bare string is one with one text block), or, before "
        "any user message, a tool_result answering a pending client tool call"
    ),
]


class OutputSchemaBody(_Body):
    """The JSON Schema the run's final answer must match (docs/runs.md, "Structured
    outputs")."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(
        pattern=r"^[A-Za-z0-9_-]{1,64}$", description="How the provider is told of the schema"
    )
    schema_: dict[str, Any] = Field(
        alias="schema",
        description="A JSON Schema (a schema that is not valid JSON Schema → 422)",
        examples=[{"type": "object", "properties": {"city": {"type": "string"}}}],
    )
    strict: StrictBool = True

    @model_validator(mode="after")
    def _valid_schema(self) -> OutputSchemaBody:
        problem = schema_problem(self.schema_)
        if problem is not None:
            raise ValueError(f"schema: {problem}")
        return self

    def value(self) -> OutputSchema:
        return OutputSchema(self.name, self.schema_, self.strict)


class RunCreate(_Body):
    """Run the agent on new prompts (contract §4), answering any pending tool calls first
    (contract §7, docs/tools.md)."""

    prompts: list[RunInput] = Field(
        default_factory=list,
        description="The tool_result messages for the pending client calls, then the user "
        "messages. Empty only when the run answers pending calls",
    )
    tools: list[ToolEntry] = Field(
        default_factory=list,
        max_length=128,
        description="Client tools (`type` `function`, the default): offered to the model with "
        "the profile's server tools for this run, executed by the application (a call pauses "
        "the run: requires_action); and remote MCP servers (`type` `mcp`, at most 8): their "
        "tools are executed by the server (docs/tools.md)",
    )
    require_approval: list[str] = Field(
        default_factory=list,
        max_length=128,
        description="Server tools whose calls wait for the application's decision in this "
        "run, besides the profile's approval_required",
    )
    approvals: list[Approval] = Field(
        default_factory=list,
        description="Decisions on the pending approval calls: approved calls run in this "
        "run, a denial becomes an is_error result carrying the reason",
    )
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
    output_schema: OutputSchemaBody | None = Field(
        default=None,
        description="The JSON Schema the final answer must match: sent to the provider, "
        "validated by the server (a violation is sent back to the model, then fails the run: "
        "run-output-invalid); the run's `output_parsed` holds the answer",
    )
    model: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="This run's provider model, over the profile's (if the profile allows "
        "`model` in allowed_run_settings, else 422)",
    )
    temperature: float | None = Field(
        default=None,
        ge=0,
        le=2,
        description="Sampling temperature (if the profile allows `temperature`)",
    )
    max_output_tokens: (
        Annotated[int, Strict(), Field(ge=1, le=MAX_TOKEN_COUNT), BeforeValidator(whole_number)]
        | None
    ) = Field(
        default=None,
        description="The answer's token limit (if the profile allows `max_output_tokens`)",
    )
    instructions: str | None = Field(
        default=None,
        pattern=NO_NUL_PATTERN,
        description="A system prompt for this run only, the stored one unchanged (profiles "
        "allow `instructions` unless their allowed_run_settings leave it out)",
    )

    @model_validator(mode="after")
    def _few_servers(self) -> RunCreate:
        servers = sum(1 for t in self.tools if isinstance(t, McpTool))
        if servers > MAX_MCP_SERVERS:
            raise ValueError(f"tools: at most {MAX_MCP_SERVERS} MCP servers per run")
        return self

    def settings(self) -> RunSettings:
        """This run's own settings (the profile decides which it may set)."""
        return RunSettings(
            model=self.model,
            temperature=self.temperature,
            max_output_tokens=self.max_output_tokens,
            output_schema=self.output_schema.value() if self.output_schema else None,
        )

    def messages(self) -> tuple[UserMessage | ToolResultMessage, ...]:
        return tuple(UserMessage.text(p) if isinstance(p, str) else p for p in self.prompts)


RunStatus = Literal[
    "queued",
    "running",
    "completed",
    "failed",
    "cancelled",
    "conflicted",
    "interrupted",
    "requires_action",
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
    output_parsed: Any = Field(
        default=None,
        description="With an `output_schema`: the final answer as JSON, once it matched the "
        "schema (null otherwise: nothing that does not match is ever given here)",
    )
    required_action: RequiredAction | None = Field(
        default=None,
        description="A run that ended requires_action: the client calls and approval calls "
        "the next run must answer",
    )
    created_at: datetime = Field(description="When the run was requested (a queued run: queued)")
    started_at: datetime | None = Field(
        default=None,
        description="When it started running (a queued run: when its turn came); null while "
        "queued and for a run that never started",
    )
    finished_at: datetime | None
    duration_ms: int | None = Field(
        description="From `started_at` to `finished_at` (time in the queue is not counted); "
        "null until it has ended, or when it never started"
    )
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
    kind: TranscriptKind
    failed: bool = Field(description="A failed or aborted assistant attempt")
    body: dict[str, Any] = Field(
        description="The message (prompt, attempt, tool_result, client_result), the "
        "compaction record, the replacing context, the required_action of a pause, an "
        "approval decision (tool_call_id, tool_name, approve, reason), or the ids of the "
        "items a deletion removed (item_deleted: etag, items)"
    )
    created_at: datetime


class TranscriptPage(BaseModel):
    items: list[TranscriptEntry]
    next_cursor: str | None


class Health(BaseModel):
    status: Literal["ok"]


class McpServerReadiness(BaseModel):
    reachable: bool
    reason: str | None = Field(
        default=None, description="Why its tools could not be listed (null when they were)"
    )


class ProfileReadiness(BaseModel):
    ready: bool
    reason: str | None = Field(
        default=None, description="Why the profile cannot run (null when it can)"
    )
    mcp_servers: dict[str, McpServerReadiness] = Field(
        default_factory=dict,
        exclude_if=lambda servers: not servers,
        description="The profile's MCP servers by label (left out when it has none): whether "
        "each lists its tools now (the "
        "listing a run kept counts). Reported, not part of `ready`: a run whose server "
        "cannot be listed fails on its own, naming it",
    )


class Readiness(BaseModel):
    """Ready (200) when the database answers, its schema is at the head revision and at least
    one agent profile can run; each profile is reported on its own (docs/operations.md)."""

    status: Literal["ready", "not_ready"]
    database: bool
    schema_revision: str | None
    expected_revision: str
    profiles: dict[str, ProfileReadiness] = Field(
        default_factory=dict,
        description="Every agent profile, whether it can run and why not: a run of an unready "
        "profile answers 503 `not-ready`, the others run",
    )
    unready_profiles: dict[str, str] = Field(
        default_factory=dict,
        description="The profiles that cannot run, each with why (e.g. its key's variable is "
        "unset). They do not make the service not ready while another profile can run.",
    )
