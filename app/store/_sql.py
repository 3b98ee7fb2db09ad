"""What the store's aggregates share: the base of their classes (an engine and a clock), key
conditions, and the statements more than one of them runs."""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError
from sqlalchemy import ColumnElement, Select, bindparam, func, insert, literal_column, select
from sqlalchemy.dialects.postgresql import aggregate_order_by
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.agent.codec import (
    CodecError,
    dumps_message,
    format_path,
    loads_message_texts,
)
from app.agent.messages import AnyMessage, Context
from app.agent.offload import offload
from app.agent.sizes import ContextSize, frame_bytes, text_bytes
from app.agent.tokens import TokenTally, tally_of
from app.clock import SYSTEM_CLOCK, Clock

from .changes import TranscriptItem, stored_pending
from .direct import prepared
from .errors import LimitExceeded, PreconditionFailed, StoreError, conversation_not_found
from .integrity import body_sha256, spans_column, verify_joined, verify_rows
from .tables import Conversation, Dumped, context_messages, conversations, transcript
from .texts import MESSAGE_KINDS, TextBatch, text_of, with_text


class StoreBase:
    """An aggregate's queries, each in its own transaction, over one AsyncEngine; the time is
    ``clock.now()``."""

    def __init__(self, engine: AsyncEngine, clock: Clock = SYSTEM_CLOCK) -> None:
        self.engine = engine
        self.clock = clock


@dataclass(frozen=True)
class Loaded:
    """A stored context with what is needed to write its successor conditionally."""

    context: Context
    etag: str
    version: int
    incarnation: str
    first_position: int  # position of context.messages[0] (== next_position when empty)
    next_position: int  # position the next appended message gets
    tokens: TokenTally | None = None  # the running tally of context.messages, when known
    size: ContextSize | None = None  # the running size of context (app.agent.sizes), when known
    #: the conversation row's ``pending_calls`` at this version (their kinds, when stored)
    pending_calls: list[dict[str, str]] | None = None


def context_body(system_prompt: str, summary: str, joined: str | bytes) -> bytes:
    """The JSON of a ``Context`` (the wire format, compact, UTF-8) from its message texts
    already joined with commas: byte for byte ``json.dumps(dump_context(context),
    ensure_ascii=False, separators=(",", ":"))``, without dumping a message again."""
    head = json.dumps(
        {"system_prompt": system_prompt, "summary": summary},
        ensure_ascii=False,
        separators=(",", ":"),
    )
    messages = joined.encode() if isinstance(joined, str) else joined
    return b"".join((head[:-1].encode(), b',"messages":[', messages, b"]}"))


@dataclass(frozen=True)
class StoredRows:
    """A stored context as read, not yet decoded: the conversation row and each message's
    stored JSON text (exactly ``dump_message`` of it, compact, as :class:`JSONText` wrote it).
    Reading this is all a transaction needs to do; decoding happens after it (off the event
    loop for long contexts) or not at all (GET context sends the texts as they are)."""

    conversation: Conversation
    texts: tuple[str, ...]
    first_position: int
    #: the texts already joined with commas and encoded (what :func:`read_joined` reads: the
    #: database joins them, one value instead of one row per message; or GET context's body
    #: cache); ``texts`` is then empty
    joined: str | bytes | None = None
    #: ``joined`` came from GET context's body cache (checked when it was first read)
    cached: bool = False

    def context_json(self) -> bytes:
        """The stored context as the JSON of ``Context`` (the wire format), built from the
        stored texts without decoding them."""
        conv = self.conversation
        messages = self.joined if self.joined is not None else ",".join(self.texts)
        return context_body(conv.system_prompt, conv.summary, messages)

    def decode(self) -> Loaded:
        """The stored context as values (what was stored was validated when it came in or was
        built by a run; this is the decoding). The message texts are parsed a few hundred at a
        time (:func:`~app.agent.codec.loads_message_texts`): one pydantic call holds the GIL
        for its whole length, and a long context in one call would stall the event loop even
        from a worker thread. The Context is then built from the parsed values, not
        validated again."""
        conv = self.conversation
        if self.joined is not None:  # one text, as the database joined it: one parse
            body = self.context_json()
            try:
                context = Context.model_validate_json(body)
            except ValidationError as exc:  # only a row written around the service
                err = exc.errors(include_url=False)[0]
                raise CodecError(format_path(list(err["loc"])), err["msg"]) from None
            count, measured = len(context.messages), len(body)
        else:
            messages = tuple(loads_message_texts(self.texts))
            context = Context.model_construct(
                system_prompt=conv.system_prompt, summary=conv.summary, messages=messages
            )
            count = len(messages)
            measured = None
        tokens = (
            TokenTally.model_validate(conv.token_tally)
            if conv.token_tally is not None
            else tally_of(context.messages)
        )
        if conv.context_bytes is not None:
            total = conv.context_bytes
        else:
            total = measured if measured is not None else len(self.context_json())
        size = ContextSize.of_total(total, count, conv.system_prompt, conv.summary)
        return Loaded(
            context=context,
            etag=conv.etag,
            version=conv.version,
            incarnation=conv.incarnation,
            first_position=self.first_position,
            next_position=conv.next_position,
            tokens=tokens,
            size=size,
            pending_calls=conv.pending_calls,
        )


def conversation_key(tenant: str, conv_id: str) -> list[ColumnElement[bool]]:
    return [conversations.c.tenant == tenant, conversations.c.id == conv_id]


def child_key(table: Any, tenant: str, conv_id: str) -> list[ColumnElement[bool]]:
    return [table.c.tenant == tenant, table.c.conversation_id == conv_id]


def bound_conversation_key() -> list[ColumnElement[bool]]:
    """:func:`conversation_key` by the bound parameters ``tenant`` and ``conv_id``: for a
    statement built once (:func:`~app.store.direct.prepared`)."""
    return [
        conversations.c.tenant == bindparam("tenant"),
        conversations.c.id == bindparam("conv_id"),
    ]


def bound_child_key(table: Any) -> list[ColumnElement[bool]]:
    """:func:`child_key` by the bound parameters ``tenant`` and ``conv_id``."""
    return [table.c.tenant == bindparam("tenant"), table.c.conversation_id == bindparam("conv_id")]


@dataclass(frozen=True)
class ContextStats:
    """What every write of a whole stored context keeps on the conversation row beside it,
    written together (:meth:`columns`) by each writer — create, PUT, a run's save, fork,
    import — so that none of them can leave one out: the token tally of its messages (``None``:
    not known, the first read counts it), its stored size (``context_bytes``) and the calls its
    last batch waits on (:func:`~app.store.changes.stored_pending`)."""

    tally: TokenTally | None
    size: ContextSize
    pending: list[dict[str, str]] | None

    @classmethod
    def counted(cls, context: Context) -> ContextStats:
        """The stats of ``context``, counted from its messages (O(n): a short context)."""
        size = ContextSize(frame=frame_bytes(context.system_prompt, context.summary))
        return cls(
            tally_of(context.messages),
            size.extend(context.messages),
            stored_pending(context.messages),
        )

    def columns(self) -> dict[str, Any]:
        """The conversation row's columns for these stats."""
        return {
            "token_tally": None if self.tally is None else self.tally.model_dump(mode="json"),
            "context_bytes": self.size.bytes,
            "pending_calls": self.pending,
        }


def new_conversation(
    tenant: str,
    conv_id: str,
    context: Context,
    *,
    now: datetime,
    transcript_seq: int,
    stats: ContextStats,
) -> dict[str, Any]:
    """The row of a new conversation holding ``context``, whose ``stats`` the caller states
    (a fork's row holds no message of the context it is given: nothing is counted here)."""
    n = len(context.messages)
    return {
        "tenant": tenant,
        "id": conv_id,
        "incarnation": uuid.uuid4().hex,
        "version": 1,
        "system_prompt": context.system_prompt,
        "summary": context.summary,
        "next_position": n,
        "message_count": n,
        "transcript_seq": transcript_seq,
        "created_at": now,
        "updated_at": now,
        "active_run_id": None,
        **stats.columns(),
    }


def select_conversation(tenant: str, conv_id: str) -> Select[Any]:
    """The conversation's row (:func:`conversation_of` reads it)."""
    return select(conversations).where(*conversation_key(tenant, conv_id))


def conversation_of(row: Mapping[Any, Any] | None) -> Conversation | None:
    return Conversation.model_construct(**row) if row is not None else None


async def read_conversation(
    conn: AsyncConnection, tenant: str, conv_id: str
) -> Conversation | None:
    found = await conn.execute(select_conversation(tenant, conv_id))
    return conversation_of(found.mappings().first())


#: whether a conversation exists, by bound parameters ``tenant`` and ``conv_id`` (built once:
#: every page of a conversation's records asks it first)
_CONVERSATION_EXISTS = prepared(select(conversations.c.version).where(*bound_conversation_key()))


async def require_conversation(conn: AsyncConnection, tenant: str, conv_id: str) -> None:
    found = await conn.execute(_CONVERSATION_EXISTS, {"tenant": tenant, "conv_id": conv_id})
    if found.first() is None:
        raise conversation_not_found(conv_id)


async def missing_or_stale(
    conn: AsyncConnection, tenant: str, conv_id: str, detail: str
) -> StoreError:
    """Why a conditional write matched no row: it does not exist (a 404 beats a 412) or it
    changed."""
    current = await read_conversation(conn, tenant, conv_id)
    if current is None:
        return conversation_not_found(conv_id)
    return PreconditionFailed(detail, current_etag=current.etag)


def live_rows(
    conv: Conversation, tenant: str | None = None, conv_id: str | None = None
) -> list[ColumnElement[bool]]:
    """The message rows of ``conv``'s stored context: those at positions from its first one
    on (the rows below it belong to earlier versions, :mod:`app.store.versions`)."""
    first = conv.next_position - conv.message_count
    return [
        *child_key(context_messages, tenant or conv.tenant, conv_id or conv.id),
        context_messages.c.position >= first,
    ]


def _context_texts() -> tuple[Any, ColumnElement[str]]:
    """``context_messages`` joined to the texts its rows reference, and each row's text (its
    own ``body`` when it keeps one, else the referenced text; NULL when that is missing)."""
    joined, _, _ = with_text(context_messages)
    return joined, text_of(context_messages)


async def read_rows(conn: AsyncConnection, conv: Conversation) -> StoredRows:
    """The stored messages of ``conv`` (its row already read in this transaction), as text,
    each joined to it in the same statement and checked against its checksum
    (:class:`~app.store.errors.StoredDataDamaged`)."""
    m = context_messages.c
    joined, text = _context_texts()
    rows = (
        await conn.execute(
            select(m.position, text, m.body_sha256)
            .select_from(joined)
            .where(*live_rows(conv))
            .order_by(m.position)
        )
    ).all()
    texts = tuple(row[1] for row in rows)
    await offload(len(texts), verify_rows, conv.id, conv.etag, texts, [row[2] for row in rows])
    return StoredRows(
        conversation=conv,
        texts=texts,
        first_position=rows[0][0] if rows else conv.next_position,
    )


async def read_joined(
    conn: AsyncConnection, conv: Conversation, *, below: int | None = None
) -> StoredRows:
    """The stored messages of ``conv`` (its row already read in this transaction; those at
    positions below ``below``, all by default) joined into one text by the database, in
    position order: one value to fetch instead of one row per message (GET context sends it
    as it is), and beside it each row's length and checksum, so that every text is checked
    (:func:`~app.store.integrity.verify_joined`) without parsing it. Each row's text is
    joined from ``message_texts`` in the same statement. PostgreSQL orders the aggregate
    itself; SQLite (before 3.44, no ORDER BY in an aggregate) concatenates its ordered
    subquery, which walks the primary key ``(tenant, conversation_id, position)`` in order.
    The joined text is given back encoded (UTF-8)."""
    m = context_messages.c
    source, body = _context_texts()
    spans = spans_column(conn.dialect, body)
    key = live_rows(conv)
    if below is not None:
        key.append(m.position < below)
    if conn.dialect.name == "postgresql":
        comma: Any = literal_column("','")
        stmt = (
            select(
                func.string_agg(body, aggregate_order_by(comma, m.position)),
                func.min(m.position),
                func.string_agg(spans, aggregate_order_by(comma, m.position)),
            )
            .select_from(source)
            .where(*key)
        )
    else:
        ordered = (
            select(body.label("body"), m.position, spans.label("spans"))
            .select_from(source)
            .where(*key)
            .order_by(m.position)
        )
        sub = ordered.subquery()
        stmt = select(
            func.group_concat(sub.c.body, ","),
            func.min(sub.c.position),
            func.group_concat(sub.c.spans, ","),
        )
    joined, first, joined_spans = (await conn.execute(stmt)).one()
    encoded = (joined or "").encode()
    count = conv.message_count if below is None else below - conv.next_position + conv.message_count
    await offload(count, verify_joined, conv.id, conv.etag, encoded, joined_spans or "")
    return StoredRows(
        conversation=conv,
        texts=(),
        first_position=first if first is not None else conv.next_position,
        joined=encoded,
    )


async def read_context(conn: AsyncConnection, conv: Conversation) -> Loaded:
    """The stored context of ``conv`` (its row already read in this transaction)."""
    return (await read_rows(conn, conv)).decode()


async def decode(rows: StoredRows | None) -> Loaded:
    """Decode stored rows; a long context in a worker thread, so the event loop goes on."""
    assert rows is not None
    return await offload(max(len(rows.texts), rows.conversation.message_count), rows.decode)


@dataclass(frozen=True)
class DumpedContext:
    """A context's message texts, dumped once (as :class:`JSONText` stores them), and its
    size: what a writer of a whole context stores and counts."""

    texts: tuple[Dumped, ...]
    size: ContextSize
    system_prompt: str = ""
    summary: str = ""
    #: the checksum of each text (:func:`~app.store.integrity.body_sha256`), stored with it
    digests: tuple[str, ...] = ()

    @classmethod
    def of(
        cls, system_prompt: str, summary: str, texts: Sequence[str] | Sequence[AnyMessage]
    ) -> DumpedContext:
        dumped = tuple(Dumped(t if isinstance(t, str) else dumps_message(t)) for t in texts)
        size = ContextSize(
            frame=frame_bytes(system_prompt, summary),
            messages=sum(text_bytes(t) for t in dumped),
            count=len(dumped),
        )
        return cls(dumped, size, system_prompt, summary, tuple(body_sha256(t) for t in dumped))

    def rows(self, first: int = 0) -> list[tuple[int, Dumped, str]]:
        """The message rows to insert, from position ``first``: position, text, checksum."""
        return [
            (first + i, t, d) for i, (t, d) in enumerate(zip(self.texts, self.digests, strict=True))
        ]

    @classmethod
    async def dump(
        cls, system_prompt: str, summary: str, texts: Sequence[str] | Sequence[AnyMessage]
    ) -> DumpedContext:
        """:meth:`of`, in a worker thread for a long context: dumping is one small call per
        message, so the event loop gets the GIL back between them."""
        return await offload(len(texts), cls.of, system_prompt, summary, texts)

    @functools.cached_property
    def body(self) -> bytes:
        """The context's JSON as GET context answers it (:func:`context_body`), built once."""
        return context_body(self.system_prompt, self.summary, ",".join(self.texts))

    def check(self, max_bytes: int | None, what: str = "the context") -> None:
        """:class:`LimitExceeded` (``max_body_bytes``) when the stored JSON would be larger
        than ``max_bytes``: a GET of it could not be PUT back."""
        if max_bytes is not None and self.size.bytes > max_bytes:
            raise stored_too_large(self.size.bytes, max_bytes, what)


def stored_too_large(actual: int, max_bytes: int, what: str = "the context") -> LimitExceeded:
    return LimitExceeded(
        "max_body_bytes",
        max_bytes,
        actual,
        detail=f"{what} as stored — every field written out, as GET context answers it — "
        f"would be {actual} bytes, more than max_body_bytes ({max_bytes}): a GET of it could "
        "not be PUT back. Send fewer or shorter messages",
    )


#: built once (a run's path pays no statement construction)
_INSERT_MESSAGES = prepared(insert(context_messages))
_INSERT_TRANSCRIPT = prepared(insert(transcript))


#: message rows per INSERT: SQLAlchemy prepares an executemany's parameters on the event loop
#: (~20 µs a row), so a long context is written in statements of this many rows, the loop
#: running other tasks between them
INSERT_CHUNK = 500


async def insert_messages(
    conn: AsyncConnection,
    tenant: str,
    conv_id: str,
    rows: Sequence[tuple[int, AnyMessage | Dumped] | tuple[int, Dumped, str]],
    texts: TextBatch | None = None,
) -> None:
    """Insert message rows, each a message or its :class:`Dumped` text (with its checksum,
    when the caller computed it: :meth:`DumpedContext.rows`): each row references its text by
    its checksum, and the text goes to ``texts`` (for the caller to flush with the other
    texts of its transaction; written here when not given)."""
    batch = texts if texts is not None else TextBatch(tenant)
    for start in range(0, len(rows), INSERT_CHUNK):
        values = []
        for row in rows[start : start + INSERT_CHUNK]:
            m = row[1]
            text = m if isinstance(m, Dumped) else Dumped(dumps_message(m))
            digest = row[2] if len(row) == 3 else body_sha256(text)
            values.append(
                {
                    "tenant": tenant,
                    "conversation_id": conv_id,
                    "position": row[0],
                    "body": None,
                    "body_sha256": batch.put(text, digest),
                }
            )
        await conn.execute(_INSERT_MESSAGES, values)
    if texts is None:
        await batch.flush(conn)


async def insert_transcript(
    conn: AsyncConnection,
    tenant: str,
    conv_id: str,
    run_id: str | None,
    first_seq: int,
    entries: Sequence[TranscriptItem],
    now: datetime,
    texts: TextBatch | None = None,
) -> None:
    """The entries, from ``first_seq`` on; an entry that holds a message references its text
    (in ``texts`` when given, for the caller to flush; else written here)."""
    if not entries:
        return
    batch = texts if texts is not None else TextBatch(tenant)
    rows = []
    for i, e in enumerate(entries):
        row = {
            "tenant": tenant,
            "conversation_id": conv_id,
            "seq": first_seq + i,
            "run_id": run_id,
            "kind": e.kind,
            "failed": e.failed,
            "body": e.body,
            "body_sha256": None,
            "created_at": now,
        }
        if e.kind in MESSAGE_KINDS:
            row["body_sha256"] = batch.add(e.body)
            row["body"] = None
        rows.append(row)
    await conn.execute(_INSERT_TRANSCRIPT, rows)
    if texts is None:
        await batch.flush(conn)


__all__ = [
    "DumpedContext",
    "Loaded",
    "StoreBase",
    "StoredRows",
    "child_key",
    "conversation_key",
    "live_rows",
    "stored_too_large",
]
