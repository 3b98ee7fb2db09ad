"""The conversation aggregate: conversations and their stored context (contract §4, §5).

Writes are conditional in the database, never read-then-write: a stored context is replaced by
``UPDATE conversations … WHERE incarnation = … AND version = …`` (the If-Match of
:mod:`app.etag` as SQL) and the rowcount says whether the caller's ETag was still current.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import (
    String,
    and_,
    delete,
    func,
    insert,
    literal,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy.exc import IntegrityError

from app.agent.codec import dump_context, load_message
from app.agent.messages import AnyMessage, Context, ToolResultMessage
from app.agent.tokens import tally_of
from app.etag import IfMatch, sql_if_match, version_etag

from ._sql import (
    Loaded,
    StoreBase,
    StoredRows,
    child_key,
    conversation_key,
    decode,
    insert_messages,
    insert_transcript,
    missing_or_stale,
    new_conversation,
    read_conversation,
    read_rows,
)
from .changes import TranscriptItem
from .db import read_transaction, write_transaction
from .errors import AlreadyExists, PreconditionFailed, UnsafeCut, conversation_not_found
from .metadata import write_metadata
from .tables import (
    Conversation,
    UTCDateTime,
    context_messages,
    conversation_metadata,
    conversations,
    runs,
)

#: the detail of a refused If-Match on a conversation
STALE = "If-Match does not match the stored context"


@dataclass(frozen=True)
class Search:
    """What a listing selects and how it is ordered (``GET /conversations``)."""

    metadata: Sequence[tuple[str, str]] = ()  # (key, value) pairs: all must match
    updated_after: datetime | None = None
    updated_before: datetime | None = None
    active: bool | None = None  # has a run in flight
    descending: bool = True  # by (updated_at, id)


class ConversationStore(StoreBase):
    """Create, read, list and delete conversations; read and replace their context."""

    async def create_conversation(
        self,
        tenant: str,
        conv_id: str,
        system_prompt: str = "",
        *,
        metadata: Mapping[str, str] | None = None,
        expires_at: datetime | None = None,
    ) -> Conversation:
        """Create an empty conversation; :class:`AlreadyExists` if the id is taken."""
        values = new_conversation(
            tenant,
            conv_id,
            Context(system_prompt=system_prompt),
            now=self.clock.now(),
            transcript_seq=0,
        )
        values["expires_at"] = expires_at
        async with write_transaction(self.engine) as conn:
            try:
                await conn.execute(insert(conversations).values(values))
            except IntegrityError:
                raise AlreadyExists(f"conversation {conv_id!r} already exists") from None
            await write_metadata(conn, tenant, conv_id, metadata or {})
        return Conversation(**values)

    async def get_conversation(self, tenant: str, conv_id: str) -> Conversation | None:
        async with read_transaction(self.engine) as conn:
            return await read_conversation(conn, tenant, conv_id)

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
        return [Conversation(**row) for row in rows]

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

        Each metadata filter is an ``EXISTS`` on the ``(tenant, key, value)`` index; the order
        and the keyset run on the ``(tenant, updated_at, id)`` index.
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
        return [Conversation(**row) for row in rows]

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
                result = await conn.execute(
                    delete(conversations).where(c.tenant == tenant, c.id.in_(ids), condition)
                )
                deleted += result.rowcount or 0
        return deleted

    async def fork_conversation(
        self,
        tenant: str,
        source_id: str,
        new_id: str,
        *,
        messages: int | None = None,
        metadata: Mapping[str, str] | None = None,
        if_match: IfMatch | None = None,
    ) -> Conversation:
        """A new conversation with the source's context (or its first ``messages``), its
        metadata (or ``metadata``), and a transcript that starts with a ``forked`` entry.

        The messages and metadata are copied in SQL (``INSERT … SELECT``), never through
        Python. :class:`UnsafeCut` when the cut would separate a tool call from its result;
        404, then 412 for a stale ``if_match``; :class:`AlreadyExists` when ``new_id`` is taken.
        """
        now = self.clock.now()
        c = conversations.c
        async with write_transaction(self.engine) as conn:
            source = await read_conversation(conn, tenant, source_id)
            if source is None:
                raise conversation_not_found(source_id)
            if if_match is not None:
                matched = await conn.execute(
                    select(c.version).where(
                        *conversation_key(tenant, source_id),
                        sql_if_match(if_match, c.incarnation, c.version),
                    )
                )
                if matched.first() is None:
                    raise PreconditionFailed(STALE, current_etag=source.etag)
            total = source.message_count
            first = source.next_position - total
            n = total if messages is None else messages
            if n > total:
                raise UnsafeCut(f"messages is {n} but the context has {total} messages", messages=n)
            if 0 < n < total:
                body = (
                    await conn.execute(
                        select(context_messages.c.body).where(
                            *child_key(context_messages, tenant, source_id),
                            context_messages.c.position == first + n,
                        )
                    )
                ).scalar_one()
                if body.get("type") == "tool_result":
                    raise UnsafeCut(
                        f"cutting after {n} messages separates a tool call from its result "
                        f"(message {n} is a tool_result)",
                        messages=n,
                    )
            values = new_conversation(
                tenant,
                new_id,
                Context(system_prompt=source.system_prompt, summary=source.summary),
                now=now,
                transcript_seq=1,
            )
            values.update(next_position=n, message_count=n, expires_at=None)
            try:
                await conn.execute(insert(conversations).values(values))
            except IntegrityError:
                raise AlreadyExists(f"conversation {new_id!r} already exists") from None
            cm = context_messages.c
            await conn.execute(
                insert(context_messages).from_select(
                    ["tenant", "conversation_id", "position", "body"],
                    select(
                        cm.tenant, literal(new_id, String(128)), cm.position - first, cm.body
                    ).where(
                        *child_key(context_messages, tenant, source_id),
                        cm.position < first + n,
                    ),
                )
            )
            if metadata is not None:
                await write_metadata(conn, tenant, new_id, metadata)
            else:
                m = conversation_metadata.c
                await conn.execute(
                    insert(conversation_metadata).from_select(
                        ["tenant", "conversation_id", "key", "value"],
                        select(m.tenant, literal(new_id, String(128)), m.key, m.value).where(
                            *child_key(conversation_metadata, tenant, source_id)
                        ),
                    )
                )
            forked = {"source_id": source_id, "source_etag": source.etag, "messages": n}
            await insert_transcript(
                conn, tenant, new_id, None, 1, [TranscriptItem("forked", False, forked)], now
            )
        return Conversation(**values)

    async def run_counts(self, tenant: str, conv_ids: Sequence[str]) -> dict[str, int]:
        """How many runs each of these conversations has."""
        if not conv_ids:
            return {}
        stmt = (
            select(runs.c.conversation_id, func.count())
            .where(runs.c.tenant == tenant, runs.c.conversation_id.in_(list(conv_ids)))
            .group_by(runs.c.conversation_id)
        )
        async with read_transaction(self.engine) as conn:
            rows = (await conn.execute(stmt)).all()
        return {row[0]: int(row[1]) for row in rows}

    async def delete_conversation(
        self, tenant: str, conv_id: str, expected_etag: IfMatch | None = None
    ) -> bool:
        """Delete a conversation and all its records (the foreign keys cascade).

        False when it does not exist (a 404 beats a 412); :class:`PreconditionFailed` when
        ``expected_etag`` (an If-Match value, ``*`` allowed) does not match.
        """
        stmt = delete(conversations).where(*conversation_key(tenant, conv_id))
        if expected_etag is not None:
            stmt = stmt.where(
                sql_if_match(expected_etag, conversations.c.incarnation, conversations.c.version)
            )
        async with write_transaction(self.engine) as conn:
            if (await conn.execute(stmt)).rowcount:
                return True
            current = await read_conversation(conn, tenant, conv_id)
            if current is None:
                return False
            raise PreconditionFailed(STALE, current_etag=current.etag)

    async def last_batch(
        self, tenant: str, conv_id: str, *, chunk: int = 32
    ) -> tuple[tuple[AnyMessage, ...], str | None]:
        """The stored context's trailing tool batch — its last message that is not a
        ``tool_result`` and the results after it — and the agent profile of the latest run.

        What the pending calls are computed from (docs/tools.md): reads O(the last batch)
        rows, newest first, never the history.
        """
        key = child_key(context_messages, tenant, conv_id)
        tail: list[AnyMessage] = []
        async with read_transaction(self.engine) as conn:
            below: int | None = None
            while True:
                stmt = select(context_messages.c.position, context_messages.c.body).where(*key)
                if below is not None:
                    stmt = stmt.where(context_messages.c.position < below)
                stmt = stmt.order_by(context_messages.c.position.desc()).limit(chunk)
                rows = (await conn.execute(stmt)).all()
                done = len(rows) < chunk
                for row in rows:
                    message = load_message(row.body)
                    tail.append(message)
                    if not isinstance(message, ToolResultMessage):
                        done = True
                        break
                if done or not rows:
                    break
                below = rows[-1].position
            agent = (
                await conn.execute(
                    select(runs.c.agent)
                    .where(*child_key(runs, tenant, conv_id))
                    .order_by(runs.c.created_at.desc())
                    .limit(1)
                )
            ).scalar()
        return tuple(reversed(tail)), agent

    async def load_context(self, tenant: str, conv_id: str) -> Loaded:
        """The stored context and its ETag, read in one transaction (decoded after it)."""
        return await decode(await self.load_context_rows(tenant, conv_id))

    async def load_context_rows(self, tenant: str, conv_id: str) -> StoredRows:
        """The stored context as read, undecoded (its row and message texts), in one read
        transaction: :meth:`StoredRows.context_json` is its wire format as it is."""
        async with read_transaction(self.engine) as conn:
            conv = await read_conversation(conn, tenant, conv_id)
            if conv is None:
                raise conversation_not_found(conv_id)
            return await read_rows(conn, conv)

    async def replace_context(
        self,
        tenant: str,
        conv_id: str,
        context: Context,
        *,
        if_match: IfMatch | None = None,
        create: bool = False,
    ) -> str:
        """Replace (``if_match``) or create (``create``, i.e. If-None-Match: *) the stored
        context, in one transaction; returns the new ETag.

        Raises :class:`NotFound` when replacing a conversation that does not exist and
        :class:`PreconditionFailed` when ``if_match`` is stale or ``create`` finds one (then
        without ``current_etag``).
        """
        if create == (if_match is not None):
            raise ValueError("give exactly one of if_match and create")
        now = self.clock.now()
        n = len(context.messages)
        async with write_transaction(self.engine) as conn:
            if create:
                # The context_replaced entry below takes transcript seq 1.
                values = new_conversation(tenant, conv_id, context, now=now, transcript_seq=1)
                try:
                    await conn.execute(insert(conversations).values(values))
                except IntegrityError:
                    raise PreconditionFailed(f"conversation {conv_id!r} exists") from None
                incarnation, version, first, seq = values["incarnation"], 1, 0, 1
            else:
                assert if_match is not None
                row = (
                    await conn.execute(
                        update(conversations)
                        .where(
                            *conversation_key(tenant, conv_id),
                            sql_if_match(
                                if_match, conversations.c.incarnation, conversations.c.version
                            ),
                        )
                        .values(
                            version=conversations.c.version + 1,
                            system_prompt=context.system_prompt,
                            summary=context.summary,
                            next_position=conversations.c.next_position + n,
                            message_count=n,
                            transcript_seq=conversations.c.transcript_seq + 1,
                            updated_at=now,
                            token_tally=tally_of(context.messages).model_dump(mode="json"),
                        )
                        .returning(
                            conversations.c.incarnation,
                            conversations.c.version,
                            conversations.c.next_position,
                            conversations.c.transcript_seq,
                        )
                    )
                ).first()
                if row is None:
                    raise await missing_or_stale(conn, tenant, conv_id, STALE)
                incarnation, version, seq = row.incarnation, row.version, row.transcript_seq
                first = row.next_position - n
                await conn.execute(
                    delete(context_messages).where(
                        *child_key(context_messages, tenant, conv_id),
                        context_messages.c.position < first,
                    )
                )
            etag = version_etag(incarnation, version)
            await insert_messages(
                conn, tenant, conv_id, [(first + i, m) for i, m in enumerate(context.messages)]
            )
            replaced = {"etag": etag, "context": dump_context(context)}
            entry = TranscriptItem("context_replaced", False, replaced)
            await insert_transcript(conn, tenant, conv_id, None, seq, [entry], now)
        return etag


__all__ = ["STALE", "ConversationStore", "Search"]
