"""Every stored version of a context, reconstructible (docs/conversations.md, "Versions").

A write of a context (create, a run's save, PUT, fork, import) records its version in
``context_versions``: its system prompt and summary (references to their texts, stored once)
and the range of positions its messages hold. Positions only grow and a message row never
changes, so the rows in that range are exactly that version's messages: a write that folds
messages (compaction) or replaces them (PUT) leaves their rows where they are, below the new
first position. Reading version N is one statement for its record and one for its rows,
whatever happened since.

Retention (``CARRYOVER_VERSION_RETENTION_SECONDS``): :meth:`VersionStore.sweep_versions`
deletes, in batches, the version records older than it (never a conversation's current
version) and then the rows no retained version holds any more (those below the first position
of the oldest retained version), and the texts that only they referenced. A version past
retention answers 410; one that never existed 404.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, delete, func, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from ._sql import StoreBase, StoredRows, child_key, read_conversation, read_joined
from .db import read_transaction, write_transaction
from .direct import prepared
from .errors import NotFound, StoreError, conversation_not_found
from .integrity import body_sha256
from .tables import (
    Conversation,
    context_messages,
    context_versions,
    conversations,
    dump_json,
    message_texts,
)
from .texts import TextBatch, collect_garbage, load

#: built once (a run's save pays no statement construction)
_INSERT_VERSION = prepared(insert(context_versions))


class VersionNotFound(NotFound):
    """The conversation never had this version (404 ``not-found``)."""

    def __init__(self, conv_id: str, version: int) -> None:
        super().__init__(f"conversation {conv_id!r} has no version {version}")


class VersionExpired(StoreError):
    """The version existed but is past the version retention: it is gone."""

    slug = "version-expired"
    status = 410

    def __init__(self, conv_id: str, version: int, oldest: int) -> None:
        super().__init__(
            f"version {version} of conversation {conv_id!r} is past the version retention "
            f"(CARRYOVER_VERSION_RETENTION_SECONDS); the oldest version kept is {oldest}"
        )


def version_row(
    tenant: str,
    conv_id: str,
    version: int,
    *,
    next_position: int,
    message_count: int,
    system_prompt: str,
    summary: str,
    cause: str,
    now: datetime,
    texts: TextBatch,
    run_id: str | None = None,
    stored: Container[str] = (),
) -> dict[str, Any]:
    """The record of a version; its system prompt and summary go to ``texts`` (for the
    caller to flush with the other texts of its transaction), unless they are among
    ``stored`` (those of the version it follows, whose record keeps them referenced)."""

    def key(value: str) -> str:
        return body_sha256(dump_json(value)) if value in stored else texts.add(value)

    return {
        "tenant": tenant,
        "conversation_id": conv_id,
        "version": version,
        "next_position": next_position,
        "message_count": message_count,
        "system_sha256": key(system_prompt),
        "summary_sha256": key(summary),
        "cause": cause,
        "run_id": run_id,
        "created_at": now,
    }


async def insert_version(conn: AsyncConnection, row: dict[str, Any]) -> None:
    await conn.execute(_INSERT_VERSION, row)


@dataclass(frozen=True)
class VersionInfo:
    """A listed version: its number, what made it, how many messages, when."""

    version: int
    etag: str
    message_count: int
    cause: str
    run_id: str | None
    created_at: datetime


class VersionStore(StoreBase):
    async def list_versions(
        self, tenant: str, conv_id: str, *, before: int | None = None, limit: int = 50
    ) -> list[VersionInfo]:
        """A page of the conversation's kept versions, newest first, before ``before``."""
        v = context_versions.c
        stmt = select(v.version, v.message_count, v.cause, v.run_id, v.created_at).where(
            *child_key(context_versions, tenant, conv_id)
        )
        if before is not None:
            stmt = stmt.where(v.version < before)
        stmt = stmt.order_by(v.version.desc()).limit(limit)
        async with read_transaction(self.engine) as conn:
            conv = await read_conversation(conn, tenant, conv_id)
            if conv is None:
                raise conversation_not_found(conv_id)
            rows = (await conn.execute(stmt)).all()
        return [
            VersionInfo(
                r.version,
                f'"{conv.incarnation}-{r.version}"',
                r.message_count,
                r.cause,
                r.run_id,
                r.created_at,
            )
            for r in rows
        ]

    async def sweep_old_versions(self, *, seconds: int, batch: int) -> int:
        """One batch of :func:`sweep_versions`, in its own write transaction."""
        async with write_transaction(self.engine) as conn:
            return await sweep_versions(conn, now=self.clock.now(), seconds=seconds, batch=batch)

    async def load_version_rows(self, tenant: str, conv_id: str, version: int) -> StoredRows:
        """The context as it stood at ``version``, as read (undecoded, its texts checked):
        :class:`VersionNotFound` for a version it never had, :class:`VersionExpired` for one
        past retention."""
        async with read_transaction(self.engine) as conn:
            conv = await read_conversation(conn, tenant, conv_id)
            if conv is None:
                raise conversation_not_found(conv_id)
            return await read_version(conn, conv, version)


async def read_version(conn: AsyncConnection, conv: Conversation, version: int) -> StoredRows:
    """:meth:`VersionStore.load_version_rows` in a transaction that read ``conv``."""
    at = await version_conversation(conn, conv, version)
    return await read_joined(conn, at, below=at.next_position)


async def version_conversation(
    conn: AsyncConnection, conv: Conversation, version: int
) -> Conversation:
    """``conv`` as it stood at ``version``: its system prompt, summary, positions and count
    then (no tally, size or pending calls: not recorded per version). :class:`VersionNotFound`
    or :class:`VersionExpired`."""
    v = context_versions.c
    system = message_texts.alias("system_text")
    summary = message_texts.alias("summary_text")
    row = (
        await conn.execute(
            select(
                v.version,
                v.next_position,
                v.message_count,
                v.system_sha256,
                v.summary_sha256,
                system.c.body.label("system_text"),
                summary.c.body.label("summary_text"),
            )
            .select_from(
                context_versions.outerjoin(
                    system, and_(system.c.tenant == v.tenant, system.c.sha256 == v.system_sha256)
                ).outerjoin(
                    summary,
                    and_(summary.c.tenant == v.tenant, summary.c.sha256 == v.summary_sha256),
                )
            )
            .where(*child_key(context_versions, conv.tenant, conv.id), v.version == version)
        )
    ).first()
    if row is None:
        if 1 <= version <= conv.version:
            oldest = (
                await conn.execute(
                    select(func.min(v.version)).where(
                        *child_key(context_versions, conv.tenant, conv.id)
                    )
                )
            ).scalar_one()
            raise VersionExpired(conv.id, version, int(oldest or conv.version))
        raise VersionNotFound(conv.id, version)
    return Conversation.model_construct(
        **{
            **conv.model_dump(),
            "version": version,
            "system_prompt": load(row.system_text, row.system_sha256),
            "summary": load(row.summary_text, row.summary_sha256),
            "next_position": row.next_position,
            "message_count": row.message_count,
            "context_bytes": None,
            "token_tally": None,
            "pending_calls": None,
        }
    )


async def sweep_versions(conn: AsyncConnection, *, now: datetime, seconds: int, batch: int) -> int:
    """Delete up to ``batch`` version records older than ``seconds`` (never a conversation's
    current version), then the message rows no kept version holds any more and the texts only
    they referenced, conversation by conversation; how many records were deleted."""
    v, c, m = context_versions.c, conversations.c, context_messages.c
    cutoff = now - timedelta(seconds=seconds)
    old = (
        await conn.execute(
            select(v.tenant, v.conversation_id, v.version, v.system_sha256, v.summary_sha256)
            .select_from(
                context_versions.join(
                    conversations, and_(c.tenant == v.tenant, c.id == v.conversation_id)
                )
            )
            .where(v.created_at < cutoff, v.version < c.version)
            .order_by(v.created_at)
            .limit(batch)
        )
    ).all()
    touched: dict[tuple[str, str], list[int]] = {}
    frames: dict[tuple[str, str], set[str]] = {}  # the keys of their prompts and summaries
    for row in old:
        touched.setdefault((row.tenant, row.conversation_id), []).append(row.version)
        frames.setdefault((row.tenant, row.conversation_id), set()).update(
            (row.system_sha256, row.summary_sha256)
        )
    for (tenant, conv_id), versions in touched.items():
        await conn.execute(
            delete(context_versions).where(
                *child_key(context_versions, tenant, conv_id), v.version.in_(versions)
            )
        )
        # the first position any kept version (the current one included) still holds
        floor = (
            await conn.execute(
                select(func.min(v.next_position - v.message_count)).where(
                    *child_key(context_versions, tenant, conv_id)
                )
            )
        ).scalar_one()
        current = (
            await conn.execute(
                select(c.next_position - c.message_count).where(c.tenant == tenant, c.id == conv_id)
            )
        ).scalar_one_or_none()
        if current is None:
            await collect_garbage(conn, tenant, frames[(tenant, conv_id)])
            continue
        below = current if floor is None else min(int(floor), int(current))
        gone = await conn.execute(
            delete(context_messages)
            .where(*child_key(context_messages, tenant, conv_id), m.position < below)
            .returning(m.body_sha256)
        )
        keys = {k for k in gone.scalars().all() if k is not None}
        await collect_garbage(conn, tenant, keys | frames[(tenant, conv_id)])
    return len(old)


__all__ = [
    "VersionExpired",
    "VersionInfo",
    "VersionNotFound",
    "VersionStore",
    "insert_version",
    "read_version",
    "sweep_versions",
    "version_conversation",
    "version_row",
]
