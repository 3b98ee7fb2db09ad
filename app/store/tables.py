"""The tables (contract §5). The tenant is part of every key.

Message bodies and other JSON values are stored as JSON *text* (``JSONText``), not as a
database JSON type: PostgreSQL's ``jsonb`` would reorder keys and normalise numbers, and the
store promises to give back exactly what it was given. Timestamps are timezone-aware UTC on
both engines (``UTCDateTime``).

Children of a conversation reference it with ``ON DELETE CASCADE``, so deleting the
conversation row deletes its messages, runs (and their audit rows), transcript and
idempotency keys in the same statement. The migration in ``alembic/versions`` spells out
the same schema by hand; ``tests/store/test_migrations.py`` checks that the two agree.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    ForeignKeyConstraint,
    Index,
    Integer,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import configure_mappers
from sqlmodel import Field, SQLModel

from app.etag import parse_version_etag as parse_etag
from app.etag import version_etag
from app.etag import version_etag as make_etag

from .columns import Dumped, JSONText, UTCDateTime, dump_json, utcnow

# re-exported: the ETag lives in app.etag, the column types in app.store.columns
__all__ = ["Dumped", "JSONText", "UTCDateTime", "dump_json", "make_etag", "parse_etag", "utcnow"]

# Key lengths. Conversation ids are at most 128 characters (contract §4).
TENANT_LEN = 128
CONVERSATION_ID_LEN = 128
RUN_ID_LEN = 36
ETAG_LEN = 80
# Column widths of metadata; the configured limits (max_metadata_*) must stay within them.
METADATA_KEY_LEN = 128
METADATA_VALUE_LEN = 1024
#: A 64-bit integer column: BIGINT on PostgreSQL (whose INTEGER is 32-bit), INTEGER on SQLite
#: (64-bit already). A column widened from INTEGER (migration 0019) is altered on PostgreSQL
#: only: no SQLite table is rebuilt.
WIDE_INTEGER = BigInteger().with_variant(Integer(), "sqlite")


def _conversation_fk(name: str) -> ForeignKeyConstraint:
    return ForeignKeyConstraint(
        ["tenant", "conversation_id"],
        ["conversations.tenant", "conversations.id"],
        ondelete="CASCADE",
        name=name,
    )


def _run_fk(name: str) -> ForeignKeyConstraint:
    return ForeignKeyConstraint(
        ["tenant", "conversation_id", "run_id"],
        ["runs.tenant", "runs.conversation_id", "runs.run_id"],
        ondelete="CASCADE",
        name=name,
    )


# --- conversations and their context -------------------------------------------------------


def _text_index(table: str, column: str = "body_sha256", name: str = "text") -> Index:
    """The references to texts, for the garbage collection of :mod:`app.store.texts`."""
    return Index(f"ix_{table}_{name}", "tenant", column)


class Conversation(SQLModel, table=True):
    """One conversation's metadata; its context messages live in ``context_messages``.

    ``incarnation`` is a random value set at creation, so the ETag ``"<incarnation>-<version>"``
    never repeats across delete and re-create. ``next_position`` is where the next appended
    message goes; positions only grow (folded messages leave gaps at the front).
    """

    __tablename__ = "conversations"
    __table_args__ = (
        # listings: newest first, keyset paging on (updated_at, id) (docs/conversations.md)
        Index("ix_conversations_tenant_updated", "tenant", "updated_at", "id"),
        # the retention sweeper: explicit expiry, and the default retention from the last update
        Index("ix_conversations_expires_at", "expires_at"),
        Index("ix_conversations_updated_at", "updated_at"),
        # ``has_pending_action=true`` listings: only the conversations that await calls, in
        # the listing's order (a partial index: rows that await nothing are not in it)
        Index(
            "ix_conversations_tenant_pending",
            "tenant",
            "updated_at",
            "id",
            sqlite_where=text("pending_calls IS NOT NULL"),
            postgresql_where=text("pending_calls IS NOT NULL"),
        ),
    )

    tenant: str = Field(primary_key=True, max_length=TENANT_LEN)
    id: str = Field(primary_key=True, max_length=CONVERSATION_ID_LEN)
    incarnation: str = Field(max_length=32)
    # 64-bit: an imported conversation keeps any version up to 2**53 - 1
    version: int = Field(sa_type=WIDE_INTEGER)
    system_prompt: str = Field(sa_type=Text)
    summary: str = Field(sa_type=Text)
    next_position: int = Field(sa_type=BigInteger)
    message_count: int
    transcript_seq: int = Field(sa_type=BigInteger)
    created_at: datetime = Field(sa_type=UTCDateTime)
    updated_at: datetime = Field(sa_type=UTCDateTime)
    active_run_id: str | None = Field(default=None, max_length=RUN_ID_LEN)
    # ``app.agent.tokens.TokenTally`` of the context's messages (null: not yet counted)
    token_tally: dict[str, Any] | None = Field(default=None, sa_type=JSONText)
    #: the bytes of the context's JSON as GET context answers it (``app.agent.sizes``),
    #: written by every write of the context (null: not yet counted)
    context_bytes: int | None = Field(default=None, sa_type=BigInteger)
    #: when the retention sweeper deletes it (None: the deployment default, if any, applies)
    expires_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    #: the pending calls of the stored context — the unanswered calls of its last batch, each
    #: ``{"id", "name", "arguments"}`` in call order, with ``server_label`` when the call records
    #: one and ``kind`` (client | approval) when a run decided it (migration 0016) — or None
    #: when it awaits nothing; written by every write of the context
    #: (:func:`app.store.changes.stored_pending`). A call without a stored kind (a context
    #: written by PUT or import) is read as the agent infers it (docs/tools.md)
    pending_calls: list[dict[str, str]] | None = Field(default=None, sa_type=JSONText)

    @property
    def etag(self) -> str:
        return version_etag(self.incarnation, self.version)


class ContextMessage(SQLModel, table=True):
    """One message of a conversation's context: a reference to its text, as
    ``app.agent.codec.dump_message`` gives it (``body_sha256``, the SHA-256 of the text, into
    ``message_texts``; ``body`` null, migration 0015), the text its run records and transcript
    entry reference too. A row keeps its own ``body`` only when it was written by a process
    older than migration 0015 during a rolling upgrade, or when migration 0013 found its text
    unparsable (then ``body_sha256`` is null and the row is verified by decoding). Readers
    take either (:mod:`app.store.texts`)."""

    __tablename__ = "context_messages"
    __table_args__ = (
        _conversation_fk("fk_context_messages_conversation"),
        _text_index("context_messages"),
    )

    tenant: str = Field(primary_key=True, max_length=TENANT_LEN)
    conversation_id: str = Field(primary_key=True, max_length=CONVERSATION_ID_LEN)
    position: int = Field(primary_key=True, sa_type=BigInteger)
    body: dict[str, Any] | None = Field(default=None, sa_type=JSONText, nullable=True)
    #: SHA-256 of the message's text (UTF-8), in hex (app/store/integrity.py): the key of
    #: its row in ``message_texts``
    body_sha256: str | None = Field(default=None, max_length=64)


class ContextVersion(SQLModel, table=True):
    """One stored version of a conversation's context (docs/conversations.md, "Versions"):
    the context at ``version`` is its ``system_prompt`` and ``summary`` (references to their
    texts in ``message_texts``, stored once) and the ``context_messages`` rows at positions
    ``next_position - message_count`` … ``next_position - 1``. Positions only grow and a
    write never changes a row, so those rows are exactly that version's messages: a write that
    folds or replaces messages leaves their rows below the new first position, where they stay
    until the version retention sweep deletes the versions that need them
    (:mod:`app.store.versions`). ``cause``: what wrote it (created | run | replaced | forked
    | imported | item_deleted), ``run_id`` the run that did."""

    __tablename__ = "context_versions"
    __table_args__ = (
        _conversation_fk("fk_context_versions_conversation"),
        Index("ix_context_versions_created_at", "created_at"),
        _text_index("context_versions", "system_sha256", "system_text"),
        _text_index("context_versions", "summary_sha256", "summary_text"),
    )

    tenant: str = Field(primary_key=True, max_length=TENANT_LEN)
    conversation_id: str = Field(primary_key=True, max_length=CONVERSATION_ID_LEN)
    version: int = Field(primary_key=True, sa_type=BigInteger)
    next_position: int = Field(sa_type=BigInteger)
    message_count: int
    system_sha256: str = Field(max_length=64)
    summary_sha256: str = Field(max_length=64)
    cause: str = Field(max_length=24)
    run_id: str | None = Field(default=None, max_length=RUN_ID_LEN)
    created_at: datetime = Field(sa_type=UTCDateTime)


class ConversationMetadata(SQLModel, table=True):
    """One ``key: value`` of a conversation's metadata (not part of its Context)."""

    __tablename__ = "conversation_metadata"
    __table_args__ = (
        _conversation_fk("fk_conversation_metadata_conversation"),
        # search by metadata: (tenant, key, value) finds the conversations
        Index("ix_conversation_metadata_lookup", "tenant", "key", "value", "conversation_id"),
    )

    tenant: str = Field(primary_key=True, max_length=TENANT_LEN)
    conversation_id: str = Field(primary_key=True, max_length=CONVERSATION_ID_LEN)
    key: str = Field(primary_key=True, max_length=METADATA_KEY_LEN)
    value: str = Field(max_length=METADATA_VALUE_LEN)


class MessageText(SQLModel, table=True):
    """A message's JSON text, stored once per tenant and keyed by its SHA-256 (hex, of its
    UTF-8 bytes: :func:`app.store.integrity.body_sha256`); run records and the transcript
    reference it by ``body_sha256`` (:mod:`app.store.texts`). Scoped by tenant: a text one
    tenant stored never answers for another, so no tenant can learn by timing or by storage
    whether another sent the same text."""

    __tablename__ = "message_texts"

    tenant: str = Field(primary_key=True, max_length=TENANT_LEN)
    sha256: str = Field(primary_key=True, max_length=64)
    body: str = Field(sa_type=Text)


# --- runs and their audit records -----------------------------------------------------------


class Run(SQLModel, table=True):
    """A run: its request, its outcome and its lease."""

    __tablename__ = "runs"
    __table_args__ = (
        _conversation_fk("fk_runs_conversation"),
        Index("ix_runs_conversation_created", "tenant", "conversation_id", "created_at"),
        # lease renewal and cancel polling look runs up by id; the sweeper by expiry
        Index("ix_runs_run_id", "run_id"),
        Index("ix_runs_status_lease", "status", "lease_expires_at"),
        # a conversation's queue in arrival order (app/store/queue.py)
        Index("ix_runs_queue", "tenant", "conversation_id", "queue_seq"),
        # runs per minute of a tenant: the runs it started (app/store/quotas.py)
        Index("ix_runs_tenant_started", "tenant", "started_at"),
    )

    tenant: str = Field(primary_key=True, max_length=TENANT_LEN)
    conversation_id: str = Field(primary_key=True, max_length=CONVERSATION_ID_LEN)
    run_id: str = Field(primary_key=True, max_length=RUN_ID_LEN)
    # queued | running | completed | failed | cancelled | conflicted | interrupted |
    # requires_action
    status: str = Field(max_length=16)
    stored: bool
    on_failure: str = Field(max_length=16)
    agent: str = Field(max_length=128)
    base_etag: str = Field(max_length=ETAG_LEN)
    result_etag: str | None = Field(default=None, max_length=ETAG_LEN)
    #: the prompts the request gave, in codec form, kept in the row while the run is queued
    #: or running; ``[]`` once it ended with each of them among its ``new_messages``: then
    #: ``prompt_keys`` references their texts (migration 0015; readers take either,
    #: :func:`app.store.texts.run_of`)
    prompts: list[Any] = Field(sa_type=JSONText)
    usage: dict[str, Any] = Field(sa_type=JSONText)
    error: dict[str, Any] | None = Field(default=None, sa_type=JSONText)
    # a run that ended requires_action: what it asked for (docs/tools.md)
    required_action: dict[str, Any] | None = Field(default=None, sa_type=JSONText)
    created_at: datetime = Field(sa_type=UTCDateTime)
    finished_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    lease_owner: str | None = Field(default=None, max_length=128)
    lease_expires_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    cancel_requested: bool = False
    # Queued runs (app/store/queue.py): the arrival order within the conversation (set for
    # every run that went through the queue), and for ``if_busy: wait`` the time its waiter
    # gives up. A queued run whose client holds its request open has ``lease_owner`` and
    # ``lease_expires_at`` set (the holder's process renews them); a background one has none.
    queue_seq: int | None = Field(default=None, sa_type=BigInteger)
    wait_until: datetime | None = Field(default=None, sa_type=UTCDateTime)
    #: the OpenTelemetry trace the run was started in (32 hex digits), when tracing is on
    trace_id: str | None = Field(default=None, max_length=32)
    #: when the run was admitted and took its lease (its ``created_at`` for a direct start, its
    #: claim for a queued run); None while queued and for a run that never started
    started_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    #: a queued run's client tools, gated tool names and answers to pending calls
    #: (``client_tools``, ``require_approval``, ``tool_results``, ``approvals``), so that the
    #: process that claims it runs and checks the request it was given; None without any
    tool_inputs: dict[str, Any] | None = Field(default=None, sa_type=JSONText)
    #: the keys of the prompts' texts in ``message_texts``, in order (a JSON list), when the
    #: row does not keep ``prompts`` itself (null: it does)
    prompt_keys: list[str] | None = Field(default=None, sa_type=JSONText)
    #: when ``DELETE /v1/responses/{id}`` deleted it as a response (migration 0018): ``/v1``
    #: no longer finds it; the run stays in its conversation's audit
    response_deleted_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    #: its final among its ``new_messages``: the ``seq`` of that row (migration 0021), so its
    #: final needs no row of its own; null: its final, if it has one, is its ``run_finals``
    #: row (a run finished before, or an imported one)
    final_seq: int | None = Field(default=None)


class RunNewMessage(SQLModel, table=True):
    """``Result.new_messages`` of a run, in order: each a reference to its text
    (``body_sha256`` into ``message_texts``; ``body`` null), or, in a row written by a process
    older than migration 0014 during a rolling upgrade, the text itself (``body_sha256`` null)."""

    __tablename__ = "run_new_messages"
    __table_args__ = (_run_fk("fk_run_new_messages_run"), _text_index("run_new_messages"))

    tenant: str = Field(primary_key=True, max_length=TENANT_LEN)
    conversation_id: str = Field(primary_key=True, max_length=CONVERSATION_ID_LEN)
    run_id: str = Field(primary_key=True, max_length=RUN_ID_LEN)
    seq: int = Field(primary_key=True)
    body: dict[str, Any] | None = Field(default=None, sa_type=JSONText, nullable=True)
    body_sha256: str | None = Field(default=None, max_length=64)


class RunFinal(SQLModel, table=True):
    """``Result.final`` of a run (absent when the run made no attempt), a reference to its
    text as in ``run_new_messages``: of a run finished before migration 0021 or imported; a
    run that finishes now names its final among its new messages (``runs.final_seq``)."""

    __tablename__ = "run_finals"
    __table_args__ = (_run_fk("fk_run_finals_run"), _text_index("run_finals"))

    tenant: str = Field(primary_key=True, max_length=TENANT_LEN)
    conversation_id: str = Field(primary_key=True, max_length=CONVERSATION_ID_LEN)
    run_id: str = Field(primary_key=True, max_length=RUN_ID_LEN)
    body: dict[str, Any] | None = Field(default=None, sa_type=JSONText, nullable=True)
    body_sha256: str | None = Field(default=None, max_length=64)


class RunCompaction(SQLModel, table=True):
    """``Result.compactions`` of a run, in order, with the messages each one folded."""

    __tablename__ = "run_compactions"
    __table_args__ = (_run_fk("fk_run_compactions_run"),)

    tenant: str = Field(primary_key=True, max_length=TENANT_LEN)
    conversation_id: str = Field(primary_key=True, max_length=CONVERSATION_ID_LEN)
    run_id: str = Field(primary_key=True, max_length=RUN_ID_LEN)
    seq: int = Field(primary_key=True)
    reason: str = Field(max_length=16)
    previous_summary: str = Field(sa_type=Text)
    summary: str = Field(sa_type=Text)
    folded: list[Any] = Field(sa_type=JSONText)
    tokens_before: int = Field(sa_type=WIDE_INTEGER)
    tokens_after: int = Field(sa_type=WIDE_INTEGER)
    usage: dict[str, Any] = Field(sa_type=JSONText)
    at: int | None = None  # Compaction.at (null in rows older than migration 0002)


# --- transcript ---------------------------------------------------------------------------------


class TranscriptEntry(SQLModel, table=True):
    """Append-only history of a conversation; compaction never removes entries.

    ``seq`` is allocated from ``conversations.transcript_seq`` in the write that appends.
    ``kind`` is one of prompt | attempt | tool_result | compaction | context_replaced | pause |
    client_result | approval.

    An entry of a kind that holds one message (prompt, attempt, tool_result, client_result)
    references its text (``body_sha256`` into ``message_texts``, ``body`` null); the others
    keep their ``body`` (and so do message entries from before migration 0014's conversion).
    Readers take either (:mod:`app.store.texts`).
    """

    __tablename__ = "transcript"
    __table_args__ = (_conversation_fk("fk_transcript_conversation"), _text_index("transcript"))

    tenant: str = Field(primary_key=True, max_length=TENANT_LEN)
    conversation_id: str = Field(primary_key=True, max_length=CONVERSATION_ID_LEN)
    seq: int = Field(primary_key=True, sa_type=BigInteger)
    run_id: str | None = Field(default=None, max_length=RUN_ID_LEN)
    kind: str = Field(max_length=24)
    failed: bool
    body: dict[str, Any] | None = Field(default=None, sa_type=JSONText, nullable=True)
    created_at: datetime = Field(sa_type=UTCDateTime)
    body_sha256: str | None = Field(default=None, max_length=64)


# --- request bookkeeping -------------------------------------------------


class IdempotencyKey(SQLModel, table=True):
    __tablename__ = "idempotency_keys"
    __table_args__ = (
        _conversation_fk("fk_idempotency_keys_conversation"),
        Index("ix_idempotency_keys_expires_at", "expires_at"),
    )

    tenant: str = Field(primary_key=True, max_length=TENANT_LEN)
    conversation_id: str = Field(primary_key=True, max_length=CONVERSATION_ID_LEN)
    key: str = Field(primary_key=True, max_length=255)
    request_hash: str = Field(max_length=128)
    run_id: str | None = Field(default=None, max_length=RUN_ID_LEN)
    status_code: int | None = None
    response: dict[str, Any] | None = Field(default=None, sa_type=JSONText)
    created_at: datetime = Field(sa_type=UTCDateTime)
    expires_at: datetime = Field(sa_type=UTCDateTime)


class ApiKey(SQLModel, table=True):
    __tablename__ = "api_keys"
    __table_args__ = (
        UniqueConstraint("key_hash", name="uq_api_keys_key_hash"),
        Index("ix_api_keys_tenant", "tenant"),
    )

    id: str = Field(primary_key=True, max_length=36)
    tenant: str = Field(max_length=TENANT_LEN)
    key_hash: str = Field(max_length=128)
    prefix: str = Field(max_length=16)
    created_at: datetime = Field(sa_type=UTCDateTime)
    revoked_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


# --- run events and webhooks ---------------------------------------------------------


class RunEventRow(SQLModel, table=True):
    """One event of a run, in order (``seq`` from 1 per run), as its SSE stream carries it;
    or, with ``first_seq``, the run's events ``first_seq`` … ``seq`` in one row.

    ``data`` is the event's JSON payload (``null`` for ``run.finished``: readers render the
    run record). A ``message`` event, whose payload is a whole message, references its text
    instead (``data_sha256`` into ``message_texts``, ``data`` null), the text its run record
    and transcript entry reference too; deltas keep their pieces. A row of several events
    (``first_seq`` set, ``data`` a JSON array of ``[seq, event, data]``, a message event as
    ``[seq, "message", null, key]``) is what a run writes with its outcome when its records
    reference every message text among them (app/store/events.py). Rows older than the
    retention are purged; the run record stays.
    """

    __tablename__ = "run_events"
    __table_args__ = (
        _run_fk("fk_run_events_run"),
        Index("ix_run_events_created_at", "created_at"),
        _text_index("run_events", "data_sha256"),
    )

    tenant: str = Field(primary_key=True, max_length=TENANT_LEN)
    conversation_id: str = Field(primary_key=True, max_length=CONVERSATION_ID_LEN)
    run_id: str = Field(primary_key=True, max_length=RUN_ID_LEN)
    seq: int = Field(primary_key=True)
    event: str = Field(max_length=32)
    data: Any = Field(default=None, sa_type=JSONText, nullable=True)
    created_at: datetime = Field(sa_type=UTCDateTime)
    data_sha256: str | None = Field(default=None, max_length=64)
    first_seq: int | None = Field(default=None)


class Webhook(SQLModel, table=True):
    """An endpoint an operator registered for a tenant's run outcomes (``carryover webhooks``)."""

    __tablename__ = "webhooks"
    __table_args__ = (Index("ix_webhooks_tenant", "tenant"),)

    id: str = Field(primary_key=True, max_length=36)
    tenant: str = Field(max_length=TENANT_LEN)
    url: str = Field(sa_type=Text)
    secret: str = Field(max_length=128)
    events: list[Any] = Field(sa_type=JSONText)
    created_at: datetime = Field(sa_type=UTCDateTime)
    #: added with ``--allow-private``: its address is not checked (app/addresses.py)
    allow_private: bool = Field(default=False)


class WebhookDelivery(SQLModel, table=True):
    """The outbox: one message to one endpoint, written with the run's outcome.

    ``status``: pending | delivered | failed. A worker claims a pending row with a lease
    (``lease_owner``, ``lease_expires_at``) before sending it.
    """

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        ForeignKeyConstraint(
            ["webhook_id"], ["webhooks.id"], ondelete="CASCADE", name="fk_deliveries_webhook"
        ),
        Index("ix_webhook_deliveries_due", "status", "next_attempt_at"),
        Index("ix_webhook_deliveries_webhook", "webhook_id", "created_at"),
    )

    id: str = Field(primary_key=True, max_length=80)  # msg_<run id>_<endpoint id>
    webhook_id: str = Field(max_length=36)
    tenant: str = Field(max_length=TENANT_LEN)
    conversation_id: str = Field(max_length=CONVERSATION_ID_LEN)
    run_id: str = Field(max_length=RUN_ID_LEN)
    event: str = Field(max_length=32)
    status: str = Field(max_length=16)
    attempts: int = 0
    next_attempt_at: datetime = Field(sa_type=UTCDateTime)
    lease_owner: str | None = Field(default=None, max_length=128)
    lease_expires_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    last_error: str | None = Field(default=None, sa_type=Text)
    created_at: datetime = Field(sa_type=UTCDateTime)
    finished_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class TenantQuota(SQLModel, table=True):
    """A tenant's quotas (``carryover quotas set``); a limit left null does not apply."""

    __tablename__ = "tenant_quotas"

    tenant: str = Field(primary_key=True, max_length=TENANT_LEN)
    tokens_per_day: int | None = Field(default=None, sa_type=WIDE_INTEGER)
    runs_per_minute: int | None = None
    concurrent_runs: int | None = None
    updated_at: datetime = Field(sa_type=UTCDateTime)


class TenantUsage(SQLModel, table=True):
    """A tenant's totals of one UTC day: runs started, tokens settled when runs ended."""

    __tablename__ = "tenant_usage"

    tenant: str = Field(primary_key=True, max_length=TENANT_LEN)
    day: str = Field(primary_key=True, max_length=10)  # YYYY-MM-DD, UTC
    runs: int = 0
    # a busy tenant's day passes 2**31 tokens (PostgreSQL's INTEGER) with long contexts
    input_tokens: int = Field(default=0, sa_type=WIDE_INTEGER)
    output_tokens: int = Field(default=0, sa_type=WIDE_INTEGER)
    cached_tokens: int = Field(default=0, sa_type=WIDE_INTEGER)


metadata = SQLModel.metadata


def _table(name: str) -> Table:
    return metadata.tables[name]


# Core handles on the tables, for the stores' statements.
conversations = _table("conversations")
context_messages = _table("context_messages")
context_versions = _table("context_versions")
conversation_metadata = _table("conversation_metadata")
message_texts = _table("message_texts")
runs = _table("runs")
run_new_messages = _table("run_new_messages")
run_finals = _table("run_finals")
run_compactions = _table("run_compactions")
transcript = _table("transcript")
idempotency_keys = _table("idempotency_keys")
api_keys = _table("api_keys")
run_events = _table("run_events")
webhooks = _table("webhooks")
webhook_deliveries = _table("webhook_deliveries")
tenant_quotas = _table("tenant_quotas")
tenant_usage = _table("tenant_usage")

# Rows read from the database become models with ``Model.model_construct(**row)`` (~20 µs)
# rather than ``Model(**row)`` (~180 µs: SQLModel's instrumented ``__init__``): the values are
# the database's, already typed by the column types. Reading a constructed model's attributes
# needs the mappers configured, which an ``__init__`` would have done on the way.
configure_mappers()
