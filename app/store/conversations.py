"""The conversation aggregate: conversations and their stored context (contract §4, §5).

Writes are conditional in the database, never read-then-write: a stored context is replaced by
``UPDATE conversations … WHERE incarnation = … AND version = …`` (the If-Match of
:mod:`app.etag` as SQL) and the rowcount says whether the caller's ETag was still current.

Listing, searching and sweeping conversations are in :mod:`.listing` (a base of
:class:`ConversationStore`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import String, delete, func, insert, literal, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.expression import Exists

from app.agent.codec import load_message
from app.agent.messages import AnyMessage, Context, ToolResultMessage
from app.agent.offload import offload
from app.agent.sizes import ContextSize, SizeBounds, frame_bytes
from app.agent.tokens import TokenTally, tally_of
from app.etag import IfMatch, sql_if_match, version_etag

from ._sql import (
    ContextStats,
    DumpedContext,
    Loaded,
    StoredRows,
    child_key,
    conversation_key,
    conversation_of,
    decode,
    insert_messages,
    insert_transcript,
    missing_or_stale,
    new_conversation,
    read_conversation,
    read_joined,
    read_rows,
    select_conversation,
    stored_too_large,
)
from .changes import TranscriptItem, stored_pending
from .db import read_one, read_transaction, write_transaction
from .errors import (
    ActiveRun,
    AlreadyExists,
    CutPastTheEnd,
    LimitExceeded,
    PreconditionFailed,
    UnsafeCut,
    conversation_not_found,
)
from .integrity import body_octets, damage, damaged
from .listing import ListingStore, Search
from .metadata import write_metadata
from .tables import (
    Conversation,
    Dumped,
    context_messages,
    conversation_metadata,
    conversations,
    runs,
)
from .texts import TextBatch, collect_garbage, referenced, text_of, with_text
from .versions import insert_version, version_conversation, version_row

#: the detail of a refused If-Match on a conversation
STALE = "If-Match does not match the stored context"

CachedBody = Callable[[str, str, str, int], bytes | None]
"""GET context's body cache: ``(tenant, conversation_id, incarnation, version)`` → the stored
message texts joined with commas, encoded, when the caller holds them at exactly that version
(:class:`app.service.cache.BodyCache`)."""


def cached_rows(conv: Conversation, cached: CachedBody) -> StoredRows | None:
    """``conv``'s context with the texts ``cached`` holds at its version (none read), as
    :meth:`ConversationStore.load_context_rows` reads it; None when it holds none."""
    hit = cached(conv.tenant, conv.id, conv.incarnation, conv.version)
    if hit is None:
        return None
    return StoredRows(
        conversation=conv,
        texts=(),
        first_position=conv.next_position - conv.message_count,
        joined=hit,
        cached=True,
    )


async def read_last_batch(
    conn: AsyncConnection,
    tenant: str,
    conv_id: str,
    *,
    below: int | None = None,
    first: int | None = None,
    chunk: int = 32,
) -> tuple[AnyMessage, ...]:
    """The last batch of the stored messages at positions below ``below`` (all of them by
    default): the last message that is not a ``tool_result`` and the results after it, read
    ``chunk`` rows at a time, newest first — O(the last batch) rows, never the history."""
    m = context_messages.c
    c = conversations.c
    # from the stored context's first message on (rows below it are earlier versions'), or
    # from ``first`` (an earlier version's)
    lowest: Any = (
        first
        if first is not None
        else select(c.next_position - c.message_count)
        .where(*conversation_key(tenant, conv_id))
        .scalar_subquery()
    )
    key = [*child_key(context_messages, tenant, conv_id), m.position >= lowest]
    joined, _, _ = with_text(context_messages)
    tail: list[AnyMessage] = []
    conv: Conversation | None = None
    while True:
        stmt = (
            select(m.position, text_of(context_messages), m.body_sha256)
            .select_from(joined)
            .where(*key)
        )
        if below is not None:
            stmt = stmt.where(m.position < below)
        stmt = stmt.order_by(m.position.desc()).limit(chunk)
        rows = (await conn.execute(stmt)).all()
        done = len(rows) < chunk
        for position, text, digest in rows:
            why = damage(text, digest)
            if why is not None:
                conv = conv or await read_conversation(conn, tenant, conv_id)
                assert conv is not None
                start = conv.next_position - conv.message_count
                raise damaged(conv_id, position - start, conv.etag, why)
            assert text is not None  # damage() said so
            message = load_message(json.loads(text))
            tail.append(message)
            if not isinstance(message, ToolResultMessage):
                done = True
                break
        if done or not rows:
            break
        below = rows[-1][0]
    return tuple(reversed(tail))


class ConversationStore(ListingStore):
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
        empty = Context(system_prompt=system_prompt)
        values = new_conversation(
            tenant,
            conv_id,
            empty,
            now=self.clock.now(),
            transcript_seq=0,
            stats=ContextStats.counted(empty),
        )
        values["expires_at"] = expires_at
        async with write_transaction(self.engine) as conn:
            try:
                await conn.execute(insert(conversations).values(values))
            except IntegrityError:
                raise AlreadyExists(f"conversation {conv_id!r} already exists") from None
            await write_metadata(conn, tenant, conv_id, metadata or {})
            texts = TextBatch(tenant)
            await insert_version(
                conn,
                version_row(
                    tenant,
                    conv_id,
                    1,
                    next_position=0,
                    message_count=0,
                    system_prompt=system_prompt,
                    summary="",
                    cause="created",
                    now=values["created_at"],
                    texts=texts,
                ),
            )
            await texts.flush(conn)
        return Conversation(**values)

    async def get_conversation(self, tenant: str, conv_id: str) -> Conversation | None:
        """The conversation's row, in one statement (:func:`app.store.db.read_one`)."""
        rows = await read_one(self.engine, select_conversation(tenant, conv_id))
        return conversation_of(rows[0] if rows else None)

    async def fork_conversation(
        self,
        tenant: str,
        source_id: str,
        new_id: str,
        *,
        messages: int | None = None,
        metadata: Mapping[str, str] | None = None,
        if_match: IfMatch | None = None,
        bounds: SizeBounds | None = None,
        version: int | None = None,
    ) -> Conversation:
        """A new conversation with the source's context (or its first ``messages``), its
        metadata (or ``metadata``), and a transcript that starts with a ``forked`` entry.

        The messages and metadata are copied in SQL (``INSERT … SELECT``), never decoded;
        so is the size of the copied messages summed. Their texts are read once, joined, to
        check them against their checksums first: :class:`StoredDataDamaged` when one is
        damaged (then nothing is written). :class:`UnsafeCut` when the cut
        would separate a tool call from its result; 404, then 412 for a stale ``if_match``;
        :class:`AlreadyExists` when ``new_id`` is taken; :class:`LimitExceeded` when the copy
        would pass ``bounds`` (a source stored before its deployment lowered them).
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
            current = source
            if version is not None and version != source.version:
                # the source as it stood then (app/store/versions.py): 404 / 410
                source = await version_conversation(conn, source, version)
            total = source.message_count
            first = source.next_position - total
            n = total if messages is None else messages
            if n > total:
                raise CutPastTheEnd(n, total)
            if n:  # what is copied (and the message after the cut) must be what was stored
                await read_joined(conn, source, below=first + min(n + 1, total))
            if 0 < n < total:
                joined, after, _ = with_text(context_messages)
                after_text = (
                    await conn.execute(
                        select(after)
                        .select_from(joined)
                        .where(
                            *child_key(context_messages, tenant, source_id),
                            context_messages.c.position == first + n,
                        )
                    )
                ).scalar_one()
                if json.loads(after_text).get("type") == "tool_result":
                    raise UnsafeCut(
                        f"cutting after {n} messages separates a tool call from its result "
                        f"(message {n} is a tool_result)",
                        messages=n,
                    )
            size = ContextSize(
                frame=frame_bytes(source.system_prompt, source.summary),
                messages=await _stored_bytes(conn, tenant, source_id, first, first + n),
                count=n,
            )
            if bounds is not None:
                if n > bounds.max_messages:
                    raise LimitExceeded("max_context_messages", bounds.max_messages, n)
                if size.bytes > bounds.max_bytes:
                    raise stored_too_large(size.bytes, bounds.max_bytes, "the forked context")
            # Its stats. The whole context: the source's. A prefix: the pending calls of its
            # last batch (read alone, O(last batch); a safe cut leaves none of a storable
            # context, but the row says what the copied messages say) and no tally (NULL), so
            # the first read of the fork counts it, as for rows from before migration 0002.
            # (The empty context's tally, once written here, had every run on the fork
            # underestimate its context by the whole copied history.)
            if n == total and source is current:
                tally = (
                    TokenTally.model_validate(source.token_tally)
                    if source.token_tally is not None
                    else None
                )
                stats = ContextStats(tally, size, source.pending_calls)
            elif n:
                tail = await read_last_batch(conn, tenant, source_id, below=first + n, first=first)
                stats = ContextStats(None, size, stored_pending(tail))
            else:
                stats = ContextStats(TokenTally(), size, None)
            values = new_conversation(
                tenant,
                new_id,
                Context(system_prompt=source.system_prompt, summary=source.summary),
                now=now,
                transcript_seq=1,
                stats=stats,
            )
            values.update(next_position=n, message_count=n, expires_at=None)
            try:
                await conn.execute(insert(conversations).values(values))
            except IntegrityError:
                raise AlreadyExists(f"conversation {new_id!r} already exists") from None
            cm = context_messages.c
            await conn.execute(
                insert(context_messages).from_select(
                    ["tenant", "conversation_id", "position", "body", "body_sha256"],
                    select(
                        cm.tenant,
                        literal(new_id, String(128)),
                        cm.position - first,
                        cm.body,
                        cm.body_sha256,
                    ).where(
                        *child_key(context_messages, tenant, source_id),
                        cm.position >= first,
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
            texts = TextBatch(tenant)
            await insert_version(
                conn,
                version_row(
                    tenant,
                    new_id,
                    1,
                    next_position=n,
                    message_count=n,
                    system_prompt=source.system_prompt,
                    summary=source.summary,
                    cause="forked",
                    now=now,
                    texts=texts,
                ),
            )
            await texts.flush(conn)
        return Conversation(**values)

    async def delete_conversation(
        self, tenant: str, conv_id: str, expected_etag: IfMatch | None = None
    ) -> bool:
        """Delete a conversation and all its records (the foreign keys cascade).

        False when it does not exist (a 404 beats a 412); :class:`PreconditionFailed` when
        ``expected_etag`` (an If-Match value, ``*`` allowed) does not match;
        :class:`ActiveRun` while a run holds a live lease on it (cancel it, or let it end,
        first: its end, webhook included, is then recorded). A run whose process died (its
        lease expired) does not hold the conversation.
        """
        c = conversations.c
        live_run = self._live_run(tenant, conv_id)
        stmt = delete(conversations).where(*conversation_key(tenant, conv_id), ~live_run)
        if expected_etag is not None:
            stmt = stmt.where(sql_if_match(expected_etag, c.incarnation, c.version))
        async with write_transaction(self.engine) as conn:
            texts = await referenced(conn, tenant, [conv_id])
            if (await conn.execute(stmt)).rowcount:
                await collect_garbage(conn, tenant, texts)  # its texts nothing else references
                return True
            current = await read_conversation(conn, tenant, conv_id)
            if current is None:
                return False
            if (
                expected_etag is None
                or (
                    await conn.execute(
                        select(c.id).where(
                            *conversation_key(tenant, conv_id),
                            sql_if_match(expected_etag, c.incarnation, c.version),
                        )
                    )
                ).first()
            ):
                raise ActiveRun(current.active_run_id or "")
            raise PreconditionFailed(STALE, current_etag=current.etag)

    def _live_run(self, tenant: str, conv_id: str) -> Exists:
        """A run holds a live lease on the conversation (one whose process died does not)."""
        return (
            select(runs.c.run_id)
            .where(
                *child_key(runs, tenant, conv_id),
                runs.c.run_id == conversations.c.active_run_id,
                runs.c.status == "running",
                runs.c.lease_expires_at > self.clock.now(),
            )
            .exists()
        )

    async def last_batch(
        self, tenant: str, conv_id: str, *, chunk: int = 32
    ) -> tuple[tuple[AnyMessage, ...], str | None]:
        """The stored context's trailing tool batch — its last message that is not a
        ``tool_result`` and the results after it — and the agent profile of the latest run.

        Reads O(the last batch) rows, newest first, never the history. (Listings and GET no
        longer need it: the row keeps the pending calls, ``conversations.pending_calls``.)
        """
        async with read_transaction(self.engine) as conn:
            tail = await read_last_batch(conn, tenant, conv_id, chunk=chunk)
            agent = (
                await conn.execute(
                    select(runs.c.agent)
                    .where(*child_key(runs, tenant, conv_id))
                    .order_by(runs.c.created_at.desc())
                    .limit(1)
                )
            ).scalar()
        return tail, agent

    async def load_context(self, tenant: str, conv_id: str) -> Loaded:
        """The stored context and its ETag, read in one transaction (decoded after it)."""
        return await decode(await self.load_context_rows(tenant, conv_id, joined=False))

    async def load_context_rows(
        self,
        tenant: str,
        conv_id: str,
        *,
        joined: bool = True,
        cached: CachedBody | None = None,
    ) -> StoredRows:
        """The stored context as read, undecoded (its row and message texts), in one read
        transaction: :meth:`StoredRows.context_json` is its wire format as it is. ``joined``:
        the texts joined by the database (GET context sends them so), or by ``cached`` when
        it holds them at the version just read (then no message row is read); otherwise one
        per message (decoded a few hundred at a time)."""
        async with read_transaction(self.engine) as conn:
            conv = await read_conversation(conn, tenant, conv_id)
            if conv is None:
                raise conversation_not_found(conv_id)
            if joined and cached is not None:
                hit = cached_rows(conv, cached)
                if hit is not None:
                    return hit
            return await (read_joined if joined else read_rows)(conn, conv)

    async def replace_context(
        self,
        tenant: str,
        conv_id: str,
        context: Context,
        *,
        if_match: IfMatch | None = None,
        create: bool = False,
        max_bytes: int | None = None,
        dumped: DumpedContext | None = None,
        deleted: Sequence[str] = (),
    ) -> str:
        """Replace (``if_match``) or create (``create``, i.e. If-None-Match: *) the stored
        context, in one transaction; returns the new ETag. ``dumped``: the context's texts, when
        the caller dumped them already (:meth:`DumpedContext.dump`). ``deleted``: the /v1 item
        ids this replacement deletes (``DELETE /v1/conversations/…/items/…``): the transcript's
        ``context_replaced`` entry is then followed by an ``item_deleted`` entry naming them,
        and only a conversation no run holds is replaced (else :class:`ActiveRun`).

        A long context costs the event loop no long stall: its texts are dumped and its tally
        counted in a worker thread, its rows written a chunk at a time, and the transcript's
        ``context_replaced`` entry built from the dumped texts.

        Raises :class:`NotFound` when replacing a conversation that does not exist and
        :class:`PreconditionFailed` when ``if_match`` is stale or ``create`` finds one (then
        without ``current_etag``); :class:`LimitExceeded` before anything is written when the
        stored JSON would be larger than ``max_bytes`` (defaults written out, a context is
        larger stored than it may have been sent).
        """
        if create == (if_match is not None):
            raise ValueError("give exactly one of if_match and create")
        if dumped is None:
            dumped = await DumpedContext.dump(
                context.system_prompt, context.summary, context.messages
            )
        dumped.check(max_bytes)
        n = len(context.messages)
        tally = await offload(n, tally_of, context.messages)
        stats = ContextStats(tally, dumped.size, stored_pending(context.messages))
        body = dumped.body.decode()
        now = self.clock.now()
        async with write_transaction(self.engine) as conn:
            if create:
                # The context_replaced entry below takes transcript seq 1.
                values = new_conversation(
                    tenant, conv_id, context, now=now, transcript_seq=1, stats=stats
                )
                try:
                    await conn.execute(insert(conversations).values(values))
                except IntegrityError:
                    raise PreconditionFailed(f"conversation {conv_id!r} exists") from None
                incarnation, version, first, seq = values["incarnation"], 1, 0, 1
            else:
                assert if_match is not None
                idle = [~self._live_run(tenant, conv_id)] if deleted else []
                notes = 2 if deleted else 1
                row = (
                    await conn.execute(
                        update(conversations)
                        .where(
                            *conversation_key(tenant, conv_id),
                            sql_if_match(
                                if_match, conversations.c.incarnation, conversations.c.version
                            ),
                            *idle,
                        )
                        .values(
                            version=conversations.c.version + 1,
                            system_prompt=context.system_prompt,
                            summary=context.summary,
                            next_position=conversations.c.next_position + n,
                            message_count=n,
                            transcript_seq=conversations.c.transcript_seq + notes,
                            updated_at=now,
                            **stats.columns(),
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
                    if deleted:
                        held = await conn.execute(
                            select(conversations.c.active_run_id).where(
                                *conversation_key(tenant, conv_id),
                                self._live_run(tenant, conv_id),
                            )
                        )
                        if (run_id := held.scalar_one_or_none()) is not None:
                            raise ActiveRun(run_id)
                    raise await missing_or_stale(conn, tenant, conv_id, STALE)
                incarnation, version = row.incarnation, row.version
                seq = row.transcript_seq - notes + 1
                # the replaced messages' rows stay, below the new ones: the versions before
                # this one are made of them (app/store/versions.py)
                first = row.next_position - n
            etag = version_etag(incarnation, version)
            texts = TextBatch(tenant)
            await insert_messages(conn, tenant, conv_id, dumped.rows(first), texts)
            # {"etag": …, "context": dump_context(context)}, from the texts just dumped
            replaced = Dumped(f'{{"etag":{json.dumps(etag)},"context":{body}}}')
            entries = [TranscriptItem("context_replaced", False, replaced)]
            if deleted:
                note = {"etag": etag, "items": list(deleted)}
                entries.append(TranscriptItem("item_deleted", False, note))
            await insert_transcript(conn, tenant, conv_id, None, seq, entries, now)
            await insert_version(
                conn,
                version_row(
                    tenant,
                    conv_id,
                    version,
                    next_position=first + n,
                    message_count=n,
                    system_prompt=context.system_prompt,
                    summary=context.summary,
                    cause="created" if create else "replaced",
                    now=now,
                    texts=texts,
                ),
            )
            await texts.flush(conn)
        return etag


async def _stored_bytes(
    conn: AsyncConnection, tenant: str, conv_id: str, first: int, below: int
) -> int:
    """The bytes of the stored message texts at positions ``first`` … ``below - 1``, summed
    in SQL."""
    joined, _, _ = with_text(context_messages)
    length = body_octets(conn.dialect, text_of(context_messages))
    total = (
        await conn.execute(
            select(func.coalesce(func.sum(length), 0))
            .select_from(joined)
            .where(
                *child_key(context_messages, tenant, conv_id),
                context_messages.c.position >= first,
                context_messages.c.position < below,
            )
        )
    ).scalar_one()
    return int(total)


__all__ = ["STALE", "ConversationStore", "Search"]
