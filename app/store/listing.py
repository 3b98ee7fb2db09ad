"""Reading conversations in bulk: a page by id, a search by metadata, activity, pending calls
and ``updated_at`` (``GET /conversations``), run counts, and the sweep of expired
conversations.

Split out of :mod:`app.store.conversations`; :class:`ListingStore` is a base of
:class:`~app.store.conversations.ConversationStore`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import String, and_, delete, exists, func, literal, or_, select, tuple_

from ._sql import StoreBase, bound_conversation_key, conversation_of
from .db import read_one, read_transaction, write_transaction
from .direct import prepared
from .metadata import read_metadata
from .tables import Conversation, UTCDateTime, conversation_metadata, conversations, runs
from .texts import collect_garbage, referenced


@dataclass(frozen=True)
class Search:
    """What a listing selects and how it is ordered (``GET /conversations``)."""

    metadata: Sequence[tuple[str, str]] = ()  # (key, value) pairs: all must match
    updated_after: datetime | None = None
    updated_before: datetime | None = None
    active: bool | None = None  # has a run in flight
    #: the stored context ends with pending calls (``conversations.pending_calls`` is set)
    has_pending_action: bool | None = None
    descending: bool = True  # by (updated_at, id)


@dataclass(frozen=True)
class RunSummary:
    """What a listing item shows of a conversation's runs."""

    count: int
    latest_agent: str | None  # the agent profile of its latest run


#: a conversation's latest run, read beside the conversation (its profile classifies the
#: pending calls stored without a kind); an alias built once: its columns are not made again
#: per statement
_latest = runs.alias("latest")


def _latest_agent(conversation_id: Any, tenant: Any) -> Any:
    """The agent profile of the latest run of ``conversation_id``: a scalar subquery."""
    return (
        select(_latest.c.agent)
        .where(_latest.c.tenant == tenant, _latest.c.conversation_id == conversation_id)
        .order_by(_latest.c.created_at.desc())
        .limit(1)
        .scalar_subquery()
    )


#: one conversation's row with what ``GET /conversations/{id}`` shows beside it: its run count,
#: its latest run's profile and whether it has metadata (read only then), by bound parameters
#: ``tenant`` and ``conv_id``; built once
_CONVERSATION_SUMMARY = prepared(
    select(
        conversations,
        select(func.count())
        .select_from(runs)
        .where(
            runs.c.tenant == conversations.c.tenant, runs.c.conversation_id == conversations.c.id
        )
        .scalar_subquery()
        .label("summary_run_count"),
        _latest_agent(conversations.c.id, conversations.c.tenant).label("summary_latest_agent"),
        exists()
        .where(
            conversation_metadata.c.tenant == conversations.c.tenant,
            conversation_metadata.c.conversation_id == conversations.c.id,
        )
        .label("summary_has_metadata"),
    ).where(*bound_conversation_key())
)
_SUMMARY_COLUMNS = ("summary_run_count", "summary_latest_agent", "summary_has_metadata")


@dataclass(frozen=True)
class Summarized:
    """A conversation with what its view shows beside its row."""

    conversation: Conversation
    runs: RunSummary
    metadata: dict[str, str]


class ListingStore(StoreBase):
    """List, search and sweep conversations (a base of
    :class:`~app.store.conversations.ConversationStore`)."""

    async def list_conversations(
        self, tenant: str, *, after_id: str | None = None, limit: int = 50
    ) -> list[Conversation]:
        """A page of the tenant's conversations ordered by id, starting after ``after_id``."""
        stmt = select(conversations).where(conversations.c.tenant == tenant)
        if after_id is not None:
            stmt = stmt.where(conversations.c.id > after_id)
        stmt = stmt.order_by(conversations.c.id).limit(limit)
        async with read_transaction(self.engine) as conn:
            rows = (await conn.execute(stmt)).mappings().all()
        return [Conversation.model_construct(**row) for row in rows]

    async def search_conversations(
        self,
        tenant: str,
        search: Search,
        *,
        after: tuple[datetime, str] | None = None,
        limit: int = 50,
    ) -> list[Conversation]:
        """A page of the tenant's conversations matching ``search``, ordered by
        ``(updated_at, id)`` (descending unless asked otherwise), after the keyset ``after``.

        Each metadata filter is an ``IN`` on the ``(tenant, key, value)`` index; the order
        and the keyset run on the ``(tenant, updated_at, id)`` index (or, for
        ``has_pending_action`` true, on the partial one of the conversations that await
        calls). ``active`` and ``has_pending_action`` test a column of the row.
        """
        c = conversations.c
        stmt = select(conversations).where(c.tenant == tenant)
        for key, value in search.metadata:
            m = conversation_metadata.c
            # IN (…) rather than EXISTS: the planner may drive from the (tenant, key, value)
            # index when the value is rare, or from the (tenant, updated_at, id) one when not
            stmt = stmt.where(
                c.id.in_(
                    select(m.conversation_id).where(
                        m.tenant == tenant, m.key == key, m.value == value
                    )
                )
            )
        if search.updated_after is not None:
            stmt = stmt.where(c.updated_at > search.updated_after)
        if search.updated_before is not None:
            stmt = stmt.where(c.updated_at < search.updated_before)
        if search.active is not None:
            stmt = stmt.where(
                c.active_run_id.is_not(None) if search.active else c.active_run_id.is_(None)
            )
        if search.has_pending_action is not None:
            # a NULL test on the row; true is served by the partial index
            # ix_conversations_tenant_pending (only the rows that await calls, in this order)
            pending = c.pending_calls
            stmt = stmt.where(
                pending.is_not(None) if search.has_pending_action else pending.is_(None)
            )
        if after is not None:
            at, conv_id = after
            # a row-value comparison: one index range on both engines (an OR is not)
            keyset = tuple_(c.updated_at, c.id)
            bound = tuple_(literal(at, UTCDateTime()), literal(conv_id, String(128)))
            stmt = stmt.where(keyset < bound if search.descending else keyset > bound)
        order = (
            (c.updated_at.desc(), c.id.desc())
            if search.descending
            else (c.updated_at.asc(), c.id.asc())
        )
        stmt = stmt.order_by(*order).limit(limit)
        async with read_transaction(self.engine) as conn:
            rows = (await conn.execute(stmt)).mappings().all()
        return [Conversation.model_construct(**row) for row in rows]

    async def sweep_expired(self, *, default_seconds: int | None, batch: int) -> int:
        """Delete up to ``batch`` expired conversations with every record (the foreign keys
        cascade to all children); how many were deleted.

        Expired: ``expires_at`` has passed, or, without one, ``default_seconds`` have passed
        since ``updated_at`` (when a default is configured). A conversation with a run in flight
        is left for a later sweep. The delete re-checks both conditions, so a conversation
        that was patched or started a run since it was selected stays.
        """
        now = self.clock.now()
        c = conversations.c
        expired = and_(c.expires_at.is_not(None), c.expires_at <= now)
        if default_seconds is not None:
            cutoff = now - timedelta(seconds=default_seconds)
            expired = or_(expired, and_(c.expires_at.is_(None), c.updated_at <= cutoff))
        condition = and_(expired, c.active_run_id.is_(None))
        async with write_transaction(self.engine) as conn:
            found = (await conn.execute(select(c.tenant, c.id).where(condition).limit(batch))).all()
            deleted = 0
            by_tenant: dict[str, list[str]] = {}
            for row in found:
                by_tenant.setdefault(row.tenant, []).append(row.id)
            for tenant, ids in by_tenant.items():
                texts = await referenced(conn, tenant, ids)
                result = await conn.execute(
                    delete(conversations).where(c.tenant == tenant, c.id.in_(ids), condition)
                )
                deleted += result.rowcount or 0
                await collect_garbage(conn, tenant, texts)  # the texts only they referenced
        return deleted

    async def summarize_conversation(self, tenant: str, conv_id: str) -> Summarized | None:
        """The conversation's row, run summary and metadata (None: no such conversation).
        One statement (:func:`app.store.db.read_one`: on PostgreSQL no transaction of its
        own), and a second for the metadata only when it has some."""
        rows = await read_one(
            self.engine, _CONVERSATION_SUMMARY, {"tenant": tenant, "conv_id": conv_id}
        )
        if not rows:
            return None
        row = dict(rows[0])
        count, agent, has_metadata = (row.pop(name) for name in _SUMMARY_COLUMNS)
        conv = conversation_of(row)
        assert conv is not None
        metadata: dict[str, str] = {}
        if has_metadata:
            async with read_transaction(self.engine) as conn:
                metadata = (await read_metadata(conn, tenant, [conv_id])).get(conv_id, {})
        return Summarized(conv, RunSummary(int(count or 0), agent), metadata)

    async def run_summaries(self, tenant: str, conv_ids: Sequence[str]) -> dict[str, RunSummary]:
        """How many runs each of these conversations has, and the agent profile of its latest
        run: one statement for any number of conversations (those without runs are left
        out). The latest run's profile is what the kind of a pending call follows."""
        if not conv_ids:
            return {}
        r = runs.c
        stmt = (
            select(r.conversation_id, func.count(), _latest_agent(r.conversation_id, tenant))
            .where(r.tenant == tenant, r.conversation_id.in_(list(conv_ids)))
            .group_by(r.conversation_id)
        )
        async with read_transaction(self.engine) as conn:
            rows = (await conn.execute(stmt)).all()
        return {row[0]: RunSummary(int(row[1]), row[2]) for row in rows}


__all__ = ["ListingStore", "RunSummary", "Search", "Summarized"]
