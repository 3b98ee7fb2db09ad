"""The export document of one conversation (docs/conversations.md): what ``GET …/export``
streams and ``POST /conversations/import`` restores."""

from __future__ import annotations

import itertools
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, StrictBool, model_validator

from app.agent.codec import CodecError, load_message
from app.agent.messages import (
    MAX_SAFE_INTEGER,
    NO_NUL_PATTERN,
    AssistantMessage,
    AttemptError,
    Context,
    Integer,
    Message,
    Usage,
    UserMessage,
)
from app.store.changes import TranscriptKind
from app.store.texts import MESSAGE_KINDS

from .schemas import ConversationId, Metadata, Timestamp, _Body

EXPORT_FORMAT = "carryover.conversation"


def _tag_of(value: Any) -> Any:
    """The ``type`` tag is required, as the document says of every message."""
    if isinstance(value, dict) and "type" not in value:
        raise ValueError("a message needs its type")
    return value


TaggedUser = Annotated[UserMessage, BeforeValidator(_tag_of)]
TaggedAssistant = Annotated[AssistantMessage, BeforeValidator(_tag_of)]


def _readable_as(model: Any) -> AfterValidator:
    """A JSON object kept as it was sent (an export of the import repeats it), refused unless
    it reads as ``model``: the reads of what is imported parse it so."""

    def check(value: dict[str, Any]) -> dict[str, Any]:
        model.model_validate(value)
        return value

    return AfterValidator(check)


RunUsage = Annotated[dict[str, Any], _readable_as(Usage)]
RunError = Annotated[dict[str, Any], _readable_as(AttemptError)]


class ExportedConversation(_Body):
    id: ConversationId
    metadata: Metadata = Field(default_factory=dict)
    expires_at: Timestamp | None = None
    created_at: Timestamp
    updated_at: Timestamp = Field(description="On import: replaced by the time of import")
    version: Integer = Field(ge=1, le=MAX_SAFE_INTEGER, description="The version part of the ETag")
    etag: str = Field(max_length=80, description="On import: a new one (new incarnation)")


class ExportedTranscriptEntry(_Body):
    seq: Integer = Field(ge=1, le=MAX_SAFE_INTEGER)
    run_id: str | None = Field(max_length=36, pattern=NO_NUL_PATTERN)
    kind: TranscriptKind
    failed: StrictBool
    body: dict[str, Any]
    created_at: Timestamp

    @model_validator(mode="after")
    def _readable(self) -> ExportedTranscriptEntry:
        """The body of a message entry is a message, that of a deletion lists item ids: the
        transcript's and /v1's reads parse them so."""
        if self.kind in MESSAGE_KINDS:
            try:
                load_message(self.body)
            except CodecError as exc:
                raise ValueError(
                    f"body: an entry of kind {self.kind} holds a message: {exc}"
                ) from None
        elif self.kind == "item_deleted":
            items = self.body.get("items", [])
            if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
                raise ValueError("body.items: an item_deleted entry lists item ids (strings)")
        return self


class ExportedCompaction(_Body):
    reason: Literal["threshold", "overflow", "manual"]
    previous_summary: str = Field(pattern=NO_NUL_PATTERN)
    summary: str = Field(pattern=NO_NUL_PATTERN)
    folded: list[Message]
    tokens_before: Integer = Field(ge=0, le=MAX_SAFE_INTEGER)
    tokens_after: Integer = Field(ge=0, le=MAX_SAFE_INTEGER)
    usage: Usage


class ExportedRun(_Body):
    run_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,35}$")
    status: Literal[
        "completed", "failed", "cancelled", "conflicted", "interrupted", "requires_action"
    ] = Field(description="A finished status (a run in flight is not exported)")
    stored: StrictBool
    on_failure: Literal["keep", "discard"]
    # text columns: no NUL (PostgreSQL's cannot hold one)
    agent: str = Field(max_length=128, pattern=NO_NUL_PATTERN)
    base_etag: str = Field(max_length=80, pattern=NO_NUL_PATTERN)
    result_etag: str | None = Field(max_length=80, pattern=NO_NUL_PATTERN)
    prompts: list[TaggedUser]
    usage: RunUsage
    error: RunError | None
    created_at: Timestamp
    finished_at: Timestamp | None
    cancel_requested: StrictBool
    new_messages: list[Message]
    final: TaggedAssistant | None
    compactions: list[ExportedCompaction]


class ConversationExport(_Body):
    """One conversation whole: what `GET …/export` streams and `POST /conversations/import`
    restores. An export of the import equals the original except `conversation.id` (when
    imported under another id), `conversation.etag` (a new incarnation; the version is kept)
    and `conversation.updated_at` (the time of import)."""

    format: Literal["carryover.conversation"]
    format_version: Literal[1]
    conversation: ExportedConversation
    context: Context
    transcript: list[ExportedTranscriptEntry]
    runs: list[ExportedRun]

    @model_validator(mode="after")
    def _consistent(self) -> ConversationExport:
        seqs = [e.seq for e in self.transcript]
        if any(b <= a for a, b in itertools.pairwise(seqs)):
            raise ValueError("transcript: seq must increase strictly")
        ids = [r.run_id for r in self.runs]
        if len(set(ids)) != len(ids):
            raise ValueError("runs: run_id must be unique")
        return self
