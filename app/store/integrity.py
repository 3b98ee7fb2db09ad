"""Damaged stored rows (docs/faults.md, "Damaged stored rows"): a checksum written with each
stored message, verified by every read that serves or runs it.

``context_messages.body_sha256`` is the SHA-256 of the message's stored JSON text (UTF-8, as
:class:`~app.store.tables.JSONText` wrote it), in hex: since migration 0015 also the key of that
text in ``message_texts`` (:mod:`app.store.texts`), which every read joins in the same statement
(a reference whose text is missing is damaged too). Every writer of a message row writes it
(:func:`body_sha256`; a fork copies it with the row), and every reader of a context — GET
context, a run's start and a queued run's claim, fork, export, the last batch of a tool answer
— checks each row it read against it before it serves, copies or runs anything: a row whose text
is not what was written is :class:`StoredDataDamaged` (409), naming the conversation and the
message's index, and nothing is served, copied, leased or stored.

Why a hash of the bytes and not a parse: GET context sends the stored texts as they are, joined
by the database, never parsed; hashing them costs ~7 ms per 10 MB (``hashlib`` releases the
GIL for long texts, and a long context is verified in a worker thread), a fifth of a parse.
Why SHA-256 rather than a CRC: the same digest is the content address of a message text once
each text is stored once (the migration series of context versions and content-addressed
messages), so it must not collide; a CRC-32 would catch a flipped byte but could not become
that key. PostgreSQL can compute it too (``sha256()``).

A row without a checksum (``NULL``: written before migration 0013 by a process that did not
know the column, or left unset by the migration because its text did not parse) is verified by
decoding it with the codec, the slow path, only for such rows.

:func:`scan` finds damaged messages across the whole database in batches (``carryover check``).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import LargeBinary, Text, and_, cast, func, select, tuple_, type_coerce
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql.elements import ColumnElement

from app.agent.codec import CodecError, load_message
from app.etag import version_etag

from .db import read_transaction
from .errors import StoredDataDamaged
from .tables import context_messages, conversations, message_texts

_log = logging.getLogger(__name__)

#: rows read per batch by :func:`scan`
SCAN_BATCH = 1000


#: copied for each checksum: ``hashlib.sha256()`` looks the algorithm up in OpenSSL each time
_SHA256 = hashlib.sha256()


#: the checksums of the last short texts checksummed, by text: a run's transaction names each
#: of its texts in several records (context row, run record, transcript entry, event, the
#: version's unchanged system prompt and summary), each then checksummed once
_RECENT: dict[str | bytes, str] = {}
RECENT_DIGESTS = 256
RECENT_DIGEST_CHARS = 4096


def body_sha256(text: str | bytes | memoryview) -> str:
    """The checksum of a stored message text: SHA-256 of its UTF-8 bytes, in hex."""
    short = not isinstance(text, memoryview) and len(text) <= RECENT_DIGEST_CHARS
    if short:
        found = _RECENT.get(text)  # type: ignore[arg-type]
        if found is not None:
            return found
    digest = _SHA256.copy()
    digest.update(text.encode() if isinstance(text, str) else text)
    value = digest.hexdigest()
    if short:
        if len(_RECENT) >= RECENT_DIGESTS:
            _RECENT.clear()
        _RECENT[text] = value  # type: ignore[index]
    return value


#: why a message whose text is not in ``message_texts`` any more is damaged
MISSING = "the text it references is missing"


def damage(text: str | bytes | memoryview | None, digest: str | None) -> str | None:
    """Why ``text`` is not the message that was stored with ``digest``, or None when it is.
    Without a digest (a row from before the checksums), it must decode as a message. No text
    (None): the text the row references is missing."""
    if text is None:
        return MISSING
    if digest is not None:
        if body_sha256(text) == digest:
            return None
        return "its text does not match the checksum written with it"
    raw = bytes(text) if isinstance(text, memoryview) else text
    try:
        load_message(json.loads(raw))
    except (ValueError, CodecError) as exc:  # JSONDecodeError and UnicodeDecodeError included
        return f"it does not decode as a message ({exc})"
    return None


def body_octets(
    dialect: Dialect | str, text: ColumnElement[Any] | None = None
) -> ColumnElement[Any]:
    """The byte length of a message text in SQL, on either engine: ``text`` (the joined text
    of :func:`app.store.texts.text_of`), ``context_messages.body`` by default."""
    body = context_messages.c.body if text is None else text
    name = dialect if isinstance(dialect, str) else dialect.name
    if name == "postgresql":
        return func.octet_length(body)
    return func.length(cast(body, LargeBinary))


def spans_column(dialect: Dialect | str, text: ColumnElement[Any]) -> ColumnElement[str]:
    """Per message row, ``"<bytes>:<checksum>"`` (the checksum empty when NULL; the bytes
    ``-`` when its ``text`` is missing): what the joined read aggregates beside the joined
    texts, so that :func:`verify_joined` can cut them apart and check each one without
    parsing."""
    digest = func.coalesce(context_messages.c.body_sha256, "")
    octets = func.coalesce(cast(body_octets(dialect, text), Text), "-")
    return type_coerce(octets + ":" + digest, Text)


def damaged(conv_id: str, index: int, etag: str, reason: str) -> StoredDataDamaged:
    """The refusal of a read that found a damaged message, logged (an ERROR naming the
    conversation and the message: the operator's signal, the client gets a 409)."""
    _log.error(
        "stored message %d of conversation %r is damaged (%s); its reads and runs are "
        "refused until its context is replaced (carryover check lists every one)",
        index,
        conv_id,
        reason,
    )
    return StoredDataDamaged(conv_id, index, etag, reason)


def verify_rows(
    conv_id: str, etag: str, texts: Sequence[str | None], digests: Sequence[str | None]
) -> None:
    """:class:`StoredDataDamaged` for the first of a context's message texts (in order, from
    its first message) that is not what was stored."""
    for index, (text, digest) in enumerate(zip(texts, digests, strict=True)):
        why = damage(text, digest)
        if why is not None:
            raise damaged(conv_id, index, etag, why)


def verify_joined(conv_id: str, etag: str, joined: bytes, spans: str) -> None:
    """As :func:`verify_rows`, for texts the database joined with commas (``joined``, UTF-8)
    and their ``spans`` (:func:`spans_column`, joined with commas in the same order). The
    texts are hashed in place (slices of one buffer, nothing copied)."""
    view = memoryview(joined)
    items = spans.split(",") if spans else []
    start = 0
    for index, span in enumerate(items):
        octets, _, digest = span.partition(":")
        if octets == "-":  # its text is not in the joined text at all
            raise damaged(conv_id, index, etag, MISSING)
        end = start + int(octets)
        why = damage(view[start:end], digest or None) if end <= len(joined) else "it is cut"
        if why is not None:
            raise damaged(conv_id, index, etag, why)
        start = end + 1
    if (start - 1 if items else 0) != len(joined):  # every text checked, and bytes left over
        raise damaged(conv_id, len(items) - 1, etag, "it is longer than was written")


@dataclass(frozen=True)
class DamagedMessage:
    """A damaged message row found by :func:`scan`."""

    tenant: str
    conversation_id: str
    message_index: int
    position: int
    etag: str
    reason: str


async def scan(engine: AsyncEngine, *, batch: int = SCAN_BATCH) -> AsyncIterator[DamagedMessage]:
    """Every damaged message of the database, in key order: the message rows are read
    ``batch`` at a time (keyset on the primary key, each batch its own short read
    transaction), each checked as a read would check it."""
    m, c, t = context_messages.c, conversations.c, message_texts.c
    key = tuple_(m.tenant, m.conversation_id, m.position)
    text = func.coalesce(type_coerce(m.body, Text), t.body)
    base = (
        select(
            m.tenant,
            m.conversation_id,
            m.position,
            type_coerce(text, Text).label("text"),
            m.body_sha256,
            (c.next_position - c.message_count).label("first"),
            c.incarnation,
            c.version,
        )
        .select_from(
            context_messages.join(
                conversations,
                (c.tenant == m.tenant)
                & (c.id == m.conversation_id)
                # the stored contexts' rows (those below are earlier versions')
                & (m.position >= c.next_position - c.message_count),
            ).outerjoin(message_texts, and_(t.tenant == m.tenant, t.sha256 == m.body_sha256))
        )
        .order_by(m.tenant, m.conversation_id, m.position)
        .limit(batch)
    )
    after: tuple[str, str, int] | None = None
    while True:
        stmt = base if after is None else base.where(key > tuple_(*after))
        async with read_transaction(engine) as conn:
            rows = (await conn.execute(stmt)).all()
        for row in rows:
            why = damage(row.text, row.body_sha256)
            if why is not None:
                yield DamagedMessage(
                    row.tenant,
                    row.conversation_id,
                    row.position - row.first,
                    row.position,
                    version_etag(row.incarnation, row.version),
                    why,
                )
        if len(rows) < batch:
            return
        last = rows[-1]
        after = (last.tenant, last.conversation_id, last.position)


__all__ = [
    "MISSING",
    "SCAN_BATCH",
    "DamagedMessage",
    "StoredDataDamaged",
    "body_octets",
    "body_sha256",
    "damage",
    "damaged",
    "scan",
    "spans_column",
    "verify_joined",
    "verify_rows",
]
