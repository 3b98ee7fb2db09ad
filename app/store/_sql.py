"""What the store's aggregates share: the base of their classes (an engine and a clock), key
conditions, and the statements more than one of them runs."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.agent.codec import dump_message, load_context
from app.agent.messages import AnyMessage, Context
from app.clock import SYSTEM_CLOCK, Clock

from .changes import TranscriptItem
from .errors import PreconditionFailed, StoreError, conversation_not_found
from .tables import Conversation, context_messages, conversations, transcript


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


def conversation_key(tenant: str, conv_id: str) -> list[ColumnElement[bool]]:
    return [conversations.c.tenant == tenant, conversations.c.id == conv_id]


def child_key(table: Any, tenant: str, conv_id: str) -> list[ColumnElement[bool]]:
    return [table.c.tenant == tenant, table.c.conversation_id == conv_id]


def new_conversation(
    tenant: str, conv_id: str, context: Context, *, now: datetime, transcript_seq: int
) -> dict[str, Any]:
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
    }


async def read_conversation(
    conn: AsyncConnection, tenant: str, conv_id: str
) -> Conversation | None:
    row = (
        (await conn.execute(select(conversations).where(*conversation_key(tenant, conv_id))))
        .mappings()
        .first()
    )
    return Conversation(**row) if row is not None else None


async def require_conversation(conn: AsyncConnection, tenant: str, conv_id: str) -> None:
    found = await conn.execute(
        select(conversations.c.version).where(*conversation_key(tenant, conv_id))
    )
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


async def read_context(conn: AsyncConnection, conv: Conversation) -> Loaded:
    """The stored context of ``conv`` (its row already read in this transaction)."""
    rows = (
        await conn.execute(
            select(context_messages.c.position, context_messages.c.body)
            .where(*child_key(context_messages, conv.tenant, conv.id))
            .order_by(context_messages.c.position)
        )
    ).all()
    context = load_context(
        {
            "system_prompt": conv.system_prompt,
            "summary": conv.summary,
            "messages": [row.body for row in rows],
        }
    )
    return Loaded(
        context=context,
        etag=conv.etag,
        version=conv.version,
        incarnation=conv.incarnation,
        first_position=rows[0].position if rows else conv.next_position,
        next_position=conv.next_position,
    )


async def insert_messages(
    conn: AsyncConnection, tenant: str, conv_id: str, rows: Sequence[tuple[int, AnyMessage]]
) -> None:
    if rows:
        await conn.execute(
            insert(context_messages),
            [
                {
                    "tenant": tenant,
                    "conversation_id": conv_id,
                    "position": p,
                    "body": dump_message(m),
                }
                for p, m in rows
            ],
        )


async def insert_transcript(
    conn: AsyncConnection,
    tenant: str,
    conv_id: str,
    run_id: str | None,
    first_seq: int,
    entries: Sequence[TranscriptItem],
    now: datetime,
) -> None:
    if entries:
        await conn.execute(
            insert(transcript),
            [
                {
                    "tenant": tenant,
                    "conversation_id": conv_id,
                    "seq": first_seq + i,
                    "run_id": run_id,
                    "kind": e.kind,
                    "failed": e.failed,
                    "body": e.body,
                    "created_at": now,
                }
                for i, e in enumerate(entries)
            ],
        )


__all__ = ["Loaded", "StoreBase", "child_key", "conversation_key"]
