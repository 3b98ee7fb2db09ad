"""The conversation aggregate: conversations and their stored context (SPEC §4, §5).

Writes are conditional in the database, never read-then-write: a stored context is replaced by
``UPDATE conversations … WHERE incarnation = … AND version = …`` (the If-Match of
:mod:`app.etag` as SQL) and the rowcount says whether the caller's ETag was still current.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from app.agent.codec import dump_context
from app.agent.messages import Context
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
from .errors import AlreadyExists, PreconditionFailed, conversation_not_found
from .tables import Conversation, context_messages, conversations, runs

#: the detail of a refused If-Match on a conversation
STALE = "If-Match does not match the stored context"


class ConversationStore(StoreBase):
    """Create, read, list and delete conversations; read and replace their context."""

    async def create_conversation(
        self, tenant: str, conv_id: str, system_prompt: str = ""
    ) -> Conversation:
        """Create an empty conversation; :class:`AlreadyExists` if the id is taken."""
        values = new_conversation(
            tenant,
            conv_id,
            Context(system_prompt=system_prompt),
            now=self.clock.now(),
            transcript_seq=0,
        )
        async with write_transaction(self.engine) as conn:
            try:
                await conn.execute(insert(conversations).values(values))
            except IntegrityError:
                raise AlreadyExists(f"conversation {conv_id!r} already exists") from None
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


__all__ = ["STALE", "ConversationStore"]
