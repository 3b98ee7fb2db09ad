"""Damaged stored rows: a checksum with each stored message, ``context_messages.body_sha256``.

The SHA-256 of the message's stored JSON text (its UTF-8 bytes, exactly as stored), in hex.
Every writer of a message row writes it and every read that serves, copies or runs a context
checks each row against it (``app/store/integrity.py``), so that a row changed behind the
service's back — invalid JSON, or valid JSON that is not what was written — is refused with
``stored-data-damaged`` instead of being served.

This is the first migration of one series (context versions, each message text stored once,
damaged-row detection): the digest is the one a content-addressed store of message texts would
key them by — same hash, same bytes — so a later revision can move the texts into such a table
and keep this column as the reference to it, or check it against the key, without hashing
anything again.

Existing rows are hashed here, in batches of ``BATCH`` rows (keyset on the primary key), each
text first parsed as JSON: a row whose text is not a JSON object with a message ``type`` is
left NULL, and a NULL checksum means "verify by decoding it" to the service, so such a row is
reported damaged by every read and by ``carryover check`` rather than given a checksum that
would vouch for it. (The parse and the hash are repeated here so that the revision does not
import the application.) Rows a process without this column writes during a rolling upgrade
are NULL too and are verified by decoding.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: message rows hashed per batch
BATCH = 1000

#: the message types of ``app.agent.messages``
MESSAGE_TYPES = frozenset({"user", "assistant", "tool_result"})

_messages = sa.table(
    "context_messages",
    sa.column("tenant", sa.String()),
    sa.column("conversation_id", sa.String()),
    sa.column("position", sa.BigInteger()),
    sa.column("body", sa.Text()),
    sa.column("body_sha256", sa.String()),
)


def _digest(text: str) -> str | None:
    """``app.store.integrity.body_sha256`` of a text that parses as a message, else None."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict) or value.get("type") not in MESSAGE_TYPES:
        return None
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _backfill() -> None:
    if context.is_offline_mode():  # `--sql` prints the DDL: there are no rows to read
        return
    conn = op.get_bind()
    m = _messages.c
    key = sa.tuple_(m.tenant, m.conversation_id, m.position)
    write = (
        sa.update(_messages)
        .where(
            m.tenant == sa.bindparam("b_tenant"),
            m.conversation_id == sa.bindparam("b_conv"),
            m.position == sa.bindparam("b_position"),
        )
        .values(body_sha256=sa.bindparam("b_digest"))
    )
    base = (
        sa.select(m.tenant, m.conversation_id, m.position, m.body)
        .order_by(m.tenant, m.conversation_id, m.position)
        .limit(BATCH)
    )
    after: tuple[str, str, int] | None = None
    left = 0
    while True:
        stmt = base if after is None else base.where(key > sa.tuple_(*after))
        rows = conn.execute(stmt).all()
        values = []
        for row in rows:
            digest = _digest(row.body)
            if digest is None:
                left += 1
                continue
            values.append(
                {
                    "b_tenant": row.tenant,
                    "b_conv": row.conversation_id,
                    "b_position": row.position,
                    "b_digest": digest,
                }
            )
        if values:
            conn.execute(write, values)
        if len(rows) < BATCH:
            break
        last = rows[-1]
        after = (last.tenant, last.conversation_id, last.position)
    if left:
        logging.getLogger("alembic.runtime.migration").warning(
            "%d stored message(s) do not decode and were left without a checksum: "
            "`carryover check` lists them",
            left,
        )


def upgrade() -> None:
    op.add_column("context_messages", sa.Column("body_sha256", sa.String(64), nullable=True))
    _backfill()


def downgrade() -> None:
    op.drop_column("context_messages", "body_sha256")
