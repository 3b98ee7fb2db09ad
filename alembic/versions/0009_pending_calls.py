"""Pending calls on the conversation row (issue 14): ``conversations.pending_calls`` and the
partial index of the conversations that await calls.

- ``conversations.pending_calls``: JSON text, the unanswered tool calls of the stored
  context's last batch, each ``{"id", "name", "arguments"}`` in call order, or null when it
  awaits nothing. Every write of the context keeps it (``app.store.changes.stored_pending``);
  listings filter on it (``has_pending_action``) and show it without reading any message.
  The kind of a call (client or approval) is not stored: it follows the agent profile when
  read (docs/tools.md).
- ``ix_conversations_tenant_pending``: ``(tenant, updated_at, id)`` of the rows whose
  ``pending_calls`` is not null (partial, on both engines), for ``has_pending_action=true``.

The upgrade backfills the column from ``context_messages``: conversations are taken in
batches in key order, and for each batch one statement reads the last ``TAIL`` messages of
every conversation in it (a range of the messages' primary key each); a conversation whose
last batch is longer than that reads on, ``TAIL`` rows at a time, newest first. Rows whose
context awaits nothing stay null. Like every revision, this one does not import the
application: the rule of ``app.agent.replay.open_batch`` is spelled out below, on the stored
JSON, and the value is written as ``JSONText`` writes it (compact, not ASCII-escaped).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import context, op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: conversations backfilled per batch
BATCH = 500
#: messages read per conversation at first (and per further read of a longer last batch)
TAIL = 16

PENDING = sa.text("pending_calls IS NOT NULL")

conversations = sa.table(
    "conversations",
    sa.column("tenant", sa.String()),
    sa.column("id", sa.String()),
    sa.column("next_position", sa.BigInteger()),
    sa.column("message_count", sa.Integer()),
    sa.column("pending_calls", sa.Text()),
)
messages = sa.table(
    "context_messages",
    sa.column("tenant", sa.String()),
    sa.column("conversation_id", sa.String()),
    sa.column("position", sa.BigInteger()),
    sa.column("body", sa.Text()),
)


# Plain ADD/DROP COLUMN on both engines (as in 0002): batch mode would copy ``conversations``
# and, dropping the old table, cascade-delete its children.


def upgrade() -> None:
    op.add_column("conversations", sa.Column("pending_calls", sa.Text(), nullable=True))
    op.create_index(
        "ix_conversations_tenant_pending",
        "conversations",
        ["tenant", "updated_at", "id"],
        sqlite_where=PENDING,
        postgresql_where=PENDING,
    )
    if not context.is_offline_mode():  # `--sql` prints the DDL: there are no rows to read
        backfill(op.get_bind())


def downgrade() -> None:
    op.drop_index("ix_conversations_tenant_pending", table_name="conversations")
    op.drop_column("conversations", "pending_calls")


def backfill(bind: sa.Connection) -> None:
    c, m = conversations.c, messages.c
    after: tuple[str, str] | None = None
    while True:
        stmt = sa.select(c.tenant, c.id).where(c.message_count > 0)
        if after is not None:
            stmt = stmt.where(sa.tuple_(c.tenant, c.id) > sa.tuple_(*after))
        keys = [tuple(row) for row in bind.execute(stmt.order_by(c.tenant, c.id).limit(BATCH))]
        if not keys:
            return
        first, last = keys[0], keys[-1]
        in_batch = sa.and_(
            c.message_count > 0,
            sa.tuple_(c.tenant, c.id) >= sa.tuple_(*first),
            sa.tuple_(c.tenant, c.id) <= sa.tuple_(*last),
        )
        tails: dict[tuple[str, str], list[tuple[int, Any]]] = {}
        rows = bind.execute(
            sa.select(m.tenant, m.conversation_id, m.position, m.body)
            .select_from(
                messages.join(
                    conversations, sa.and_(c.tenant == m.tenant, c.id == m.conversation_id)
                )
            )
            .where(in_batch, m.position >= c.next_position - TAIL)
            .order_by(m.tenant, m.conversation_id, m.position.desc())
        )
        for tenant, conv_id, position, body in rows:
            tails.setdefault((tenant, conv_id), []).append((position, json.loads(body)))
        updates = []
        for key, newest_first in tails.items():
            pending = _pending(bind, key, newest_first)
            if pending:
                value = json.dumps(pending, ensure_ascii=False, separators=(",", ":"))
                updates.append({"k_tenant": key[0], "k_id": key[1], "value": value})
        if updates:
            bind.execute(
                conversations.update()
                .where(c.tenant == sa.bindparam("k_tenant"), c.id == sa.bindparam("k_id"))
                .values(pending_calls=sa.bindparam("value")),
                updates,
            )
        after = (last[0], last[1])


def _pending(
    bind: sa.Connection, key: tuple[str, str], newest_first: list[tuple[int, Any]]
) -> list[dict[str, str]]:
    """The unanswered calls of the last batch (``open_batch``): the results at the end, then
    the first message that is not one; when that is an assistant message, its calls that
    have no result among them, in call order."""
    answered: set[str] = set()
    rows = newest_first
    while rows:
        for _, body in rows:
            if body.get("type") == "tool_result":
                answered.add(body["tool_call_id"])
                continue
            if body.get("type") != "assistant":
                return []
            calls = [b for b in body.get("content", []) if b.get("type") == "tool_call"]
            return [
                {"id": b["id"], "name": b["name"], "arguments": b["arguments"]}
                for b in calls
                if b["id"] not in answered
            ]
        # every message read is a result: read on below the oldest one
        m = messages.c
        rows = [
            (position, json.loads(body))
            for position, body in bind.execute(
                sa.select(m.position, m.body)
                .where(m.tenant == key[0], m.conversation_id == key[1], m.position < rows[-1][0])
                .order_by(m.position.desc())
                .limit(TAIL)
            )
        ]
    return []
