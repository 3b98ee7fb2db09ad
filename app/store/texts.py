"""Each message's text stored once (docs/operations.md, "Storage"): ``message_texts``, keyed
by tenant and the SHA-256 of the text, and the references to it.

The stored context (``context_messages``, migration 0015) references its messages' texts the
same way: a run that appends a prompt and an answer writes each text once, for its context
rows, its records, its transcript entries and its events alike.

Run records (``run_new_messages``, ``run_finals``) and the transcript's message entries keep
``body_sha256``, the key of their text, and a null ``body``; a run that adds a prompt and an
answer stores each text once, however many records name it, and a stateless client that
re-sends its whole history stores no text it stored before (the texts are the same bytes,
so the same keys). The digest is the one ``context_messages.body_sha256`` checks
(:func:`app.store.integrity.body_sha256`).

Writers collect a transaction's texts in a :class:`TextBatch` and write them in one
statement (:meth:`TextBatch.flush`). Readers join the text to the referencing row in the
same statement (:func:`with_text`) and check it against its key before decoding it
(:func:`load`): a text changed or lost behind the service's back is
:class:`~app.store.errors.StoredRecordDamaged`, never served.

Texts are scoped by tenant: two tenants that send the same text store it twice, and one
tenant can never tell by a write's timing or by storage figures what another stored.

Garbage: the texts a conversation referenced and nothing else does are deleted in the
transaction that deletes the conversation (:func:`collect_garbage`, from
``DELETE /conversations/{id}`` and from the retention sweeper), and so are the texts of the
context rows the version sweep deletes (:mod:`app.store.versions`), when nothing else
references them.
On PostgreSQL a writer takes the row lock of each text it references (``ON CONFLICT DO
UPDATE``) and the collector locks its candidates before it looks for references in a later
statement, so a text another transaction is about to reference is either kept or written
again; SQLite has one writer.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from sqlalchemy import (
    JSON,
    ColumnElement,
    FromClause,
    LargeBinary,
    Table,
    Text,
    and_,
    cast,
    delete,
    func,
    literal,
    select,
    tuple_,
    type_coerce,
    union_all,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql import Select

from .changes import TRANSCRIPT_KINDS
from .db import read_transaction
from .direct import prepared
from .errors import StoredRecordDamaged
from .integrity import body_sha256
from .tables import (
    Run,
    TranscriptEntry,
    context_messages,
    context_versions,
    dump_json,
    message_texts,
    run_events,
    run_finals,
    run_new_messages,
    runs,
    transcript,
)

#: the transcript entries that hold one message of a run's ``new_messages`` each (their
#: text is referenced)
MESSAGE_KINDS = ("prompt", "attempt", "tool_result", "client_result")

#: the event whose payload is one whole message (its text is referenced)
MESSAGE_EVENT = "message"

#: the columns that reference texts (their tables are indexed on ``(tenant, column)``; a
#: run's ``prompt_keys`` only ever names texts its own ``new_messages`` reference too:
#: :func:`prompt_keys`)
REFERRERS: tuple[ColumnElement[str], ...] = (
    context_messages.c.body_sha256,
    context_versions.c.system_sha256,
    context_versions.c.summary_sha256,
    run_new_messages.c.body_sha256,
    run_finals.c.body_sha256,
    transcript.c.body_sha256,
    run_events.c.data_sha256,
)

#: texts per statement of :meth:`TextBatch.flush` (SQLAlchemy prepares an executemany's
#: parameters on the event loop: a long context is written a chunk at a time)
FLUSH_CHUNK = 500

#: keys per statement of the garbage collection (bound parameters stay well under limits)
GARBAGE_CHUNK = 500


#: built once per dialect: a run writes its texts with it (app/store/direct.py)
_INSERT_TEXTS_SQLITE = prepared(sqlite_insert(message_texts).on_conflict_do_nothing())
#: a no-op update on PostgreSQL: it takes the row lock :func:`collect_garbage` waits for
_INSERT_TEXTS_PG = prepared(
    pg_insert(message_texts).on_conflict_do_update(
        index_elements=["tenant", "sha256"], set_={"body": message_texts.c.body}
    )
)


class TextBatch:
    """The texts one write transaction references, written with :meth:`flush`."""

    __slots__ = ("tenant", "texts")

    def __init__(self, tenant: str) -> None:
        self.tenant = tenant
        self.texts: dict[str, str] = {}

    def add(self, body: Any) -> str:
        """The key of ``body`` (a JSON value, or its text as :class:`Dumped`), kept to write."""
        text = dump_json(body)
        digest = body_sha256(text)
        self.texts.setdefault(digest, text)
        return digest

    def put(self, text: str, digest: str) -> str:
        """Keep ``text`` (a JSON text already dumped) whose key the caller computed."""
        self.texts.setdefault(digest, str(text))
        return digest

    async def flush(self, conn: AsyncConnection) -> None:
        """Write the texts not stored yet: one statement (none without texts; one per
        ``FLUSH_CHUNK`` texts for a long context), in key order (two transactions writing the
        same texts lock them in the same order)."""
        if not self.texts:
            return
        rows = [
            {"tenant": self.tenant, "sha256": d, "body": self.texts[d]} for d in sorted(self.texts)
        ]
        self.texts = {}
        stmt = _INSERT_TEXTS_PG if conn.dialect.name == "postgresql" else _INSERT_TEXTS_SQLITE
        for start in range(0, len(rows), FLUSH_CHUNK):
            await conn.execute(stmt, rows[start : start + FLUSH_CHUNK])


def with_text(
    table: Table, column: str = "body"
) -> tuple[FromClause, ColumnElement[str], ColumnElement[str]]:
    """``table`` joined to the texts its rows reference, the text of each row (its own
    ``column`` when it keeps one, else the referenced text, as ``<column>_text``) and its key
    (``<column>_sha256``), for one statement."""
    digest = table.c[f"{column}_sha256"]
    joined = table.outerjoin(
        message_texts,
        and_(message_texts.c.tenant == table.c.tenant, message_texts.c.sha256 == digest),
    )
    value = text_of(table, column).label(f"{column}_text")
    return joined, value, digest


def text_of(table: Table, column: str = "body") -> ColumnElement[str]:
    """The text of a row of ``table`` joined as :func:`with_text` joins it: its own
    ``column`` when it keeps one, else the referenced text (NULL when that is missing)."""
    own = type_coerce(table.c[column], Text)
    return type_coerce(func.coalesce(own, message_texts.c.body), Text)


def load(text: str | None, digest: str | None) -> Any:
    """The JSON value of a stored text read with :func:`with_text`, checked against its key:
    :class:`StoredRecordDamaged` when the text is missing, is not what was stored, or does not
    decode."""
    if text is None:
        if digest is None:
            return None
        raise StoredRecordDamaged("a message text it references is missing")
    if digest is not None and body_sha256(text) != digest:
        raise StoredRecordDamaged("a message text does not match its checksum")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise StoredRecordDamaged(f"it is not JSON: {exc}") from None


def select_transcript() -> Select[Any]:
    """``SELECT`` of transcript entries with their texts (one statement; add the ``WHERE``)."""
    joined, text, key = with_text(transcript)
    columns = [c for c in transcript.c if c.name not in ("body", "body_sha256")]
    return select(*columns, text, key).select_from(joined)


def transcript_entry(row: Any) -> TranscriptEntry:
    """A row of :func:`select_transcript` (a mapping) as a transcript entry, its text checked."""
    values = {k: v for k, v in row.items() if k not in ("body_text", "body_sha256")}
    if values.get("kind") not in TRANSCRIPT_KINDS:
        raise StoredRecordDamaged(
            f"a transcript entry has a kind it cannot have: {values.get('kind')!r}"
        )
    values["body"] = load(row["body_text"], row["body_sha256"])
    return TranscriptEntry(**values)


#: the separator of the two halves of :func:`prompts_column` (never in a span)
_HALVES = "\x1e"


def prompts_column(dialect: str) -> ColumnElement[str]:
    """Per run row, its referenced prompts in one value, for :func:`run_of`: the spans
    (``<index>:<bytes>:<key>``, the bytes ``-`` when the text is missing) joined with commas,
    ``\x1e``, then the texts joined with commas in the same order; correlated to ``runs``."""
    t = message_texts.alias("prompt_text")
    keys = type_coerce(runs.c.prompt_keys, Text)
    if dialect == "postgresql":
        j = (
            func.json_array_elements_text(cast(keys, JSON))
            .table_valued("value", with_ordinality="ord")
            .render_derived("prompt_key", with_types=False)
        )
        index: Any = j.c.ord - 1
        octets: Any = func.octet_length(t.c.body)
    else:
        j = func.json_each(keys).table_valued("key", "value").alias("prompt_key")
        index = j.c.key
        octets = func.length(cast(t.c.body, LargeBinary))
    value = type_coerce(j.c.value, Text)
    span = (
        cast(index, Text)
        + literal(":")
        + func.coalesce(cast(octets, Text), literal("-"))
        + literal(":")
        + value
    )
    source = j.outerjoin(t, and_(t.c.tenant == runs.c.tenant, t.c.sha256 == value))
    if dialect == "postgresql":
        spans: Any = func.string_agg(span, literal(","))
        texts: Any = func.string_agg(t.c.body, literal(","))
    else:
        spans = func.group_concat(span, ",")
        texts = func.group_concat(t.c.body, ",")
    whole = func.coalesce(spans, literal("")) + literal(_HALVES) + func.coalesce(texts, literal(""))
    return (
        select(type_coerce(whole, Text))
        .select_from(source)
        .correlate(runs)
        .scalar_subquery()
        .label("prompt_texts")
    )


@cache
def select_runs(dialect: str) -> Select[Any]:
    """``SELECT`` of run rows with their referenced prompts (one statement; add the
    ``WHERE``): rows for :func:`run_of`. Built once per dialect (statements are immutable;
    ``.where`` makes a new one): building its correlated subquery costs more than running it."""
    return select(runs, prompts_column(dialect))


def run_of(row: Any) -> Run:
    """A row of :func:`select_runs` (a mapping) as a run, its prompts read back: its own
    (a run queued or running keeps them in its row), or the texts its ``prompt_keys``
    reference, each checked against its key (:class:`StoredRecordDamaged`)."""
    values = {k: v for k, v in row.items() if k != "prompt_texts"}
    if values.get("prompt_keys") is not None:
        values["prompts"] = _prompts(row["prompt_texts"], values["prompt_keys"])
    return Run.model_construct(**values)


def _prompts(joined: str | None, keys: Sequence[str]) -> list[Any]:
    spans_part, _, texts_part = (joined or _HALVES).partition(_HALVES)
    spans = [s.split(":", 2) for s in spans_part.split(",")] if spans_part else []
    if len(spans) != len(keys):
        raise StoredRecordDamaged("a prompt text it references is missing")
    data = texts_part.encode()
    found: dict[int, Any] = {}
    start = 0
    for index, octets, digest in spans:
        if octets == "-":
            raise StoredRecordDamaged("a prompt text it references is missing")
        end = start + int(octets)
        found[int(index)] = load(data[start:end].decode(), digest)
        start = end + 1
    return [found[i] for i in range(len(keys))]


def prompt_keys(prompts: Sequence[Any], records: Iterable[str]) -> list[str] | None:
    """The keys of a run's prompts (JSON values, as its row keeps them) when its row may
    reference them instead: when each is also the text of one of its ``new_messages``
    (``records``: their keys), so the run's own records keep the texts referenced — the
    garbage collection needs to look at no run's prompts. None: the row keeps its own."""
    keys = [body_sha256(dump_json(p)) for p in prompts]
    return keys if set(keys) <= set(records) else None


async def referenced(conn: AsyncConnection, tenant: str, conv_ids: Sequence[str]) -> set[str]:
    """The keys of the texts these conversations reference (read before deleting them)."""
    if not conv_ids:
        return set()
    parts = [
        select(ref).where(
            ref.table.c.tenant == tenant,
            ref.table.c.conversation_id.in_(list(conv_ids)),
            ref.is_not(None),
        )
        for ref in REFERRERS
    ]
    return set((await conn.execute(union_all(*parts))).scalars().all())


async def collect_garbage(conn: AsyncConnection, tenant: str, candidates: Iterable[str]) -> int:
    """Delete the tenant's texts among ``candidates`` that no row references any more (after
    the rows that referenced them were deleted, in the same transaction); how many."""
    keys = sorted(candidates)
    deleted = 0
    t = message_texts.c
    for start in range(0, len(keys), GARBAGE_CHUNK):
        chunk = keys[start : start + GARBAGE_CHUNK]
        mine = and_(t.tenant == tenant, t.sha256.in_(chunk))
        if conn.dialect.name == "postgresql":  # wait for writers that reference them
            await conn.execute(select(t.sha256).where(mine).order_by(t.sha256).with_for_update())
        unreferenced = [
            ~select(ref).where(ref.table.c.tenant == tenant, ref == t.sha256).exists()
            for ref in REFERRERS
        ]
        result = await conn.execute(delete(message_texts).where(mine, *unreferenced))
        deleted += result.rowcount or 0
    return deleted


@dataclass(frozen=True)
class DamagedText:
    """A stored message text that is not what its key says (found by :func:`scan_texts`), and
    the conversations whose records, transcript or events reference it."""

    tenant: str
    sha256: str
    reason: str
    conversations: tuple[str, ...]


async def scan_texts(engine: AsyncEngine, *, batch: int = 1000) -> AsyncIterator[DamagedText]:
    """Every damaged message text, in key order: read ``batch`` at a time (keyset on the
    primary key, each batch its own short read transaction), each hashed against its key."""
    t = message_texts.c
    base = select(t.tenant, t.sha256, t.body).order_by(t.tenant, t.sha256).limit(batch)
    after: tuple[str, str] | None = None
    while True:
        stmt = base if after is None else base.where(tuple_(t.tenant, t.sha256) > tuple_(*after))
        async with read_transaction(engine) as conn:
            rows = (await conn.execute(stmt)).all()
            found = [row for row in rows if body_sha256(row.body) != row.sha256]
            owners = [await _referrers(conn, row.tenant, row.sha256) for row in found]
        for row, conversations in zip(found, owners, strict=True):
            why = "its text does not match the key it is stored under"
            yield DamagedText(row.tenant, row.sha256, why, conversations)
        if len(rows) < batch:
            return
        after = (rows[-1].tenant, rows[-1].sha256)


async def _referrers(conn: AsyncConnection, tenant: str, digest: str) -> tuple[str, ...]:
    """The conversations of ``tenant`` whose rows reference the text ``digest``."""
    parts = [
        select(column.table.c.conversation_id).where(
            column.table.c.tenant == tenant, column == digest
        )
        for column in REFERRERS
    ]
    rows = (await conn.execute(union_all(*parts))).scalars().all()
    return tuple(sorted(set(rows)))


__all__ = [
    "GARBAGE_CHUNK",
    "MESSAGE_EVENT",
    "MESSAGE_KINDS",
    "REFERRERS",
    "DamagedText",
    "TextBatch",
    "collect_garbage",
    "load",
    "prompt_keys",
    "prompts_column",
    "referenced",
    "run_of",
    "scan_texts",
    "select_runs",
    "select_transcript",
    "text_of",
    "transcript_entry",
    "with_text",
]
