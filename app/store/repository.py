"""Every query of the store (SPEC §4, §5).

Each public method is one transaction. Writes are conditional in the database, never
read-then-write: a stored context is replaced by ``UPDATE conversations … WHERE incarnation = …
AND version = …`` and the rowcount says whether the caller's ETag was still current.

A conversation's messages are rows keyed by an ever-growing ``position``. Compaction folds a
prefix and a run appends at the end, so storing a run's context deletes the folded prefix with one
range ``DELETE`` and inserts only the appended messages: the statements and rows a run writes do
not depend on how long the conversation is.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import ColumnElement, and_, case, delete, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.agent.codec import dump_context, dump_message, dump_messages, load_context, load_message
from app.agent.messages import AnyMessage, AssistantMessage, Context, UserMessage
from app.agent.records import Compaction, Result

from .changes import ContextWrite, TranscriptItem, plan_context_write, run_transcript
from .db import read_transaction, write_transaction
from .errors import (
    AlreadyExists,
    Conflict,
    IdempotencyInFlight,
    IdempotencyMismatch,
    NotFound,
    PreconditionFailed,
    StoreError,
)
from .tables import (
    Conversation,
    Run,
    TranscriptEntry,
    context_messages,
    conversations,
    idempotency_keys,
    make_etag,
    parse_etag,
    run_compactions,
    run_finals,
    run_new_messages,
    runs,
    transcript,
    utcnow,
)

RunStatus = Literal["running", "completed", "failed", "cancelled", "conflicted", "interrupted"]
OnFailure = Literal["keep", "discard"]


@dataclass(frozen=True)
class Loaded:
    """A stored context with what is needed to write its successor conditionally."""

    context: Context
    etag: str
    version: int
    incarnation: str
    first_position: int  # position of context.messages[0] (== next_position when empty)
    next_position: int  # position the next appended message gets


@dataclass(frozen=True)
class RunOutcome:
    """What :meth:`Repository.finish_run` recorded."""

    status: RunStatus
    stored: bool  # did the run's context become the stored state
    etag: str  # the stored state's ETag after the write (stored or not)
    result_etag: str | None  # the ETag of the run's context, when stored
    finished_at: datetime | None = None


@dataclass(frozen=True)
class IdempotencyClaim:
    """An ``Idempotency-Key`` presented with a run request."""

    key: str
    request_hash: str
    ttl_seconds: int


@dataclass(frozen=True)
class IdempotentReplay:
    """The stored first answer to a request with the same key and body."""

    run_id: str | None
    status_code: int
    response: dict[str, Any]


@dataclass(frozen=True)
class StartedRun:
    """What :meth:`Repository.start_run` did: started the run (``run`` and ``loaded``), found
    the conversation busy (``active_run_id``), or found the answer already given (``replay``)."""

    run: Run | None = None
    loaded: Loaded | None = None
    active_run_id: str | None = None
    replay: IdempotentReplay | None = None
    interrupted: str | None = None  # a run of a dead process whose lease this one took over


@dataclass(frozen=True)
class Renewal:
    """What :meth:`Repository.renew_leases` found."""

    renewed: frozenset[str]  # runs still running under this owner, leases extended
    cancel_requested: frozenset[str]  # of those, the ones another replica asked to cancel


@dataclass(frozen=True)
class RunRecord:
    """A run row with its audit records decoded."""

    run: Run
    new_messages: tuple[AnyMessage, ...]
    final: AssistantMessage | None
    compactions: tuple[Compaction, ...]


IfMatch = str | Sequence[str]
"""An If-Match condition: ``"*"``, one ETag, or a list of ETags (any of them may match)."""


def _match(if_match: IfMatch) -> list[ColumnElement[bool]] | None:
    """WHERE conditions for an If-Match value; None when it can never match.

    ETags this store did not issue (malformed, weak ``W/…``) never match.
    """
    if if_match == "*":
        return []
    tags = [if_match] if isinstance(if_match, str) else list(if_match)
    pairs = [parsed for tag in tags if (parsed := parse_etag(tag)) is not None]
    if not pairs:
        return None
    return [
        or_(
            *(
                and_(conversations.c.incarnation == incarnation, conversations.c.version == version)
                for incarnation, version in pairs
            )
        )
    ]


def _conversation_key(tenant: str, conv_id: str) -> list[ColumnElement[bool]]:
    return [conversations.c.tenant == tenant, conversations.c.id == conv_id]


def _child_key(table: Any, tenant: str, conv_id: str) -> list[ColumnElement[bool]]:
    return [table.c.tenant == tenant, table.c.conversation_id == conv_id]


class Repository:
    """The store's queries, each in its own transaction, over one AsyncEngine."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    # --- conversations ------------------------------------------------------------------------

    async def create_conversation(
        self, tenant: str, conv_id: str, system_prompt: str = ""
    ) -> Conversation:
        """Create an empty conversation; :class:`AlreadyExists` if the id is taken."""
        values = _new_conversation(
            tenant, conv_id, Context(system_prompt=system_prompt), now=utcnow(), transcript_seq=0
        )
        async with write_transaction(self.engine) as conn:
            try:
                await conn.execute(insert(conversations).values(values))
            except IntegrityError:
                raise AlreadyExists(f"conversation {conv_id!r} already exists") from None
        return Conversation(**values)

    async def get_conversation(self, tenant: str, conv_id: str) -> Conversation | None:
        async with read_transaction(self.engine) as conn:
            return await _conversation(conn, tenant, conv_id)

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

    async def delete_conversation(
        self, tenant: str, conv_id: str, expected_etag: IfMatch | None = None
    ) -> bool:
        """Delete a conversation and all its records (the foreign keys cascade).

        False when it does not exist (a 404 beats a 412); :class:`PreconditionFailed` when
        ``expected_etag`` (an If-Match value, ``*`` allowed) does not match.
        """
        conditions = [] if expected_etag is None else _match(expected_etag)
        async with write_transaction(self.engine) as conn:
            if conditions is not None:
                stmt = delete(conversations).where(*_conversation_key(tenant, conv_id), *conditions)
                if (await conn.execute(stmt)).rowcount:
                    return True
            current = await _conversation(conn, tenant, conv_id)
            if current is None:
                return False
            raise PreconditionFailed("the conversation changed", current_etag=current.etag)

    # --- context --------------------------------------------------------------------------------

    async def load_context(self, tenant: str, conv_id: str) -> Loaded:
        """The stored context and its ETag, read in one transaction."""
        async with read_transaction(self.engine) as conn:
            conv = await _conversation(conn, tenant, conv_id)
            if conv is None:
                raise NotFound(f"conversation {conv_id!r} not found")
            return await _read_context(conn, conv)

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
        :class:`PreconditionFailed` when ``if_match`` is stale or ``create`` finds one.
        """
        if create == (if_match is not None):
            raise ValueError("give exactly one of if_match and create")
        now = utcnow()
        n = len(context.messages)
        async with write_transaction(self.engine) as conn:
            if create:
                # The context_replaced entry below takes transcript seq 1.
                values = _new_conversation(tenant, conv_id, context, now=now, transcript_seq=1)
                try:
                    await conn.execute(insert(conversations).values(values))
                except IntegrityError:
                    raise PreconditionFailed(f"conversation {conv_id!r} exists") from None
                incarnation, version, first, seq = values["incarnation"], 1, 0, 1
            else:
                assert if_match is not None
                conditions = _match(if_match)
                row = None
                if conditions is not None:
                    row = (
                        await conn.execute(
                            update(conversations)
                            .where(*_conversation_key(tenant, conv_id), *conditions)
                            .values(
                                version=conversations.c.version + 1,
                                system_prompt=context.system_prompt,
                                summary=context.summary,
                                next_position=conversations.c.next_position + n,
                                message_count=n,
                                transcript_seq=conversations.c.transcript_seq + 1,
                                updated_at=now,
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
                    raise await _missing_or_stale(conn, tenant, conv_id)
                incarnation, version, seq = row.incarnation, row.version, row.transcript_seq
                first = row.next_position - n
                await conn.execute(
                    delete(context_messages).where(
                        *_child_key(context_messages, tenant, conv_id),
                        context_messages.c.position < first,
                    )
                )
            etag = make_etag(incarnation, version)
            await _insert_messages(
                conn, tenant, conv_id, [(first + i, m) for i, m in enumerate(context.messages)]
            )
            replaced = {"etag": etag, "context": dump_context(context)}
            entry = TranscriptItem("context_replaced", False, replaced)
            await _insert_transcript(conn, tenant, conv_id, None, seq, [entry], now)
        return etag

    # --- runs -----------------------------------------------------------------------------------

    async def insert_run(
        self,
        tenant: str,
        conv_id: str,
        *,
        base_etag: str,
        prompts: Sequence[UserMessage],
        agent: str = "default",
        on_failure: OnFailure = "keep",
        run_id: str | None = None,
    ) -> Run:
        """Record a run that starts (status ``running``), without a lease."""
        values = _run_values(
            tenant,
            conv_id,
            run_id or str(uuid.uuid4()),
            base_etag=base_etag,
            prompts=prompts,
            agent=agent,
            on_failure=on_failure,
            now=utcnow(),
        )
        async with write_transaction(self.engine) as conn:
            try:
                await conn.execute(insert(runs).values(values))
            except IntegrityError:
                # The foreign key: the conversation does not exist (run ids are fresh uuids).
                raise NotFound(f"conversation {conv_id!r} not found") from None
        return Run(**values)

    async def start_run(
        self,
        tenant: str,
        conv_id: str,
        *,
        run_id: str,
        if_match: IfMatch | None,
        prompts: Sequence[UserMessage],
        agent: str,
        on_failure: OnFailure,
        owner: str,
        lease_seconds: float,
        idempotency: IdempotencyClaim | None = None,
    ) -> StartedRun:
        """Take the conversation's run lease and load its context, in one write transaction.

        In order: :class:`NotFound`; an idempotency key seen before (the stored answer, or
        :class:`IdempotencyMismatch` / :class:`IdempotencyInFlight`); :class:`PreconditionFailed`
        when ``if_match`` does not hold; busy when another run holds a live lease (a lease that
        expired marks its run ``interrupted`` and is taken over). Then the run row, the lease and
        the idempotency key are written and the context is read under them.
        """
        interrupted: str | None = None
        async with write_transaction(self.engine) as conn:
            stmt = select(conversations).where(*_conversation_key(tenant, conv_id))
            if conn.dialect.name == "postgresql":
                stmt = stmt.with_for_update()
            found = (await conn.execute(stmt)).mappings().first()
            # The time once the locks are held: waiting for them must not eat into the lease.
            now = utcnow()
            if found is None:
                raise NotFound(f"conversation {conv_id!r} not found")
            conv = Conversation(**found)

            if idempotency is not None:
                replay = await _claimed(conn, tenant, conv_id, idempotency, now)
                if replay is not None:
                    return StartedRun(replay=replay)

            if if_match is not None and not _etag_matches(conv, if_match):
                raise PreconditionFailed("the conversation changed", current_etag=conv.etag)

            if conv.active_run_id is not None:
                holder = (
                    await conn.execute(
                        select(runs.c.status, runs.c.lease_expires_at).where(
                            *_child_key(runs, tenant, conv_id), runs.c.run_id == conv.active_run_id
                        )
                    )
                ).first()
                if holder is not None and holder.status == "running":
                    expired = holder.lease_expires_at is None or holder.lease_expires_at <= now
                    # The holder may renew its lease meanwhile: the interrupt is conditional.
                    if not expired or not await _interrupt(
                        conn, tenant, conv_id, conv.active_run_id, now
                    ):
                        return StartedRun(active_run_id=conv.active_run_id)
                    interrupted = conv.active_run_id

            await conn.execute(
                update(conversations)
                .where(*_conversation_key(tenant, conv_id))
                .values(active_run_id=run_id)
            )
            values = _run_values(
                tenant,
                conv_id,
                run_id,
                base_etag=conv.etag,
                prompts=prompts,
                agent=agent,
                on_failure=on_failure,
                now=now,
            )
            values.update(
                lease_owner=owner, lease_expires_at=now + timedelta(seconds=lease_seconds)
            )
            await conn.execute(insert(runs).values(values))
            if idempotency is not None:
                await conn.execute(
                    insert(idempotency_keys).values(
                        tenant=tenant,
                        conversation_id=conv_id,
                        key=idempotency.key,
                        request_hash=idempotency.request_hash,
                        run_id=run_id,
                        status_code=None,
                        response=None,
                        created_at=now,
                        expires_at=now + timedelta(seconds=idempotency.ttl_seconds),
                    )
                )
            loaded = await _read_context(conn, conv)
        return StartedRun(run=Run(**values), loaded=loaded, interrupted=interrupted)

    async def lease_holder(self, tenant: str, conv_id: str) -> str | None:
        """The run holding the conversation under a live lease; None when it is free, the lease
        expired, or the conversation is gone. A read: requests waiting for the conversation
        (``if_busy: wait``) poll it, and only try to take the lease when it looks free."""
        holder = and_(
            runs.c.tenant == conversations.c.tenant,
            runs.c.conversation_id == conversations.c.id,
            runs.c.run_id == conversations.c.active_run_id,
        )
        async with read_transaction(self.engine) as conn:
            row = (
                await conn.execute(
                    select(conversations.c.active_run_id, runs.c.status, runs.c.lease_expires_at)
                    .select_from(conversations.outerjoin(runs, holder))
                    .where(*_conversation_key(tenant, conv_id))
                )
            ).first()
        if row is None or row.active_run_id is None or row.status != "running":
            return None
        if row.lease_expires_at is None or row.lease_expires_at <= utcnow():
            return None
        active: str = row.active_run_id
        return active

    async def renew_leases(
        self, run_ids: Sequence[str], *, owner: str, lease_seconds: float
    ) -> Renewal:
        """Extend the leases of this process's running runs, in one statement for all of them.

        Returns which leases were renewed (a run missing from them is no longer this process's
        to finish: another process found its lease expired and marked it ``interrupted``) and
        which of the renewed runs another replica asked to cancel.
        """
        if not run_ids:
            return Renewal(renewed=frozenset(), cancel_requested=frozenset())
        async with write_transaction(self.engine) as conn:
            rows = (
                await conn.execute(
                    update(runs)
                    .where(
                        runs.c.run_id.in_(list(run_ids)),
                        runs.c.lease_owner == owner,
                        runs.c.status == "running",
                    )
                    .values(lease_expires_at=utcnow() + timedelta(seconds=lease_seconds))
                    .returning(runs.c.run_id, runs.c.cancel_requested)
                )
            ).all()
        return Renewal(
            renewed=frozenset(row.run_id for row in rows),
            cancel_requested=frozenset(row.run_id for row in rows if row.cancel_requested),
        )

    async def interrupt_expired(self, *, alive: Collection[str] = ()) -> int:
        """Mark runs whose lease expired (their process died) ``interrupted``; free their
        conversations. Returns how many runs were marked.

        ``alive``: runs the caller is running itself and knows to be alive (a process never
        interrupts its own runs because its renewals were late; other processes may).
        """
        async with read_transaction(self.engine) as conn:
            expired = (
                await conn.execute(
                    select(runs.c.tenant, runs.c.conversation_id, runs.c.run_id)
                    .where(runs.c.status == "running", runs.c.lease_expires_at < utcnow())
                    .order_by(runs.c.tenant, runs.c.conversation_id, runs.c.run_id)
                )
            ).all()
        expired = [row for row in expired if row.run_id not in alive]
        marked = 0
        # One short transaction each: no transaction holds the locks of several conversations.
        for row in expired:
            async with write_transaction(self.engine) as conn:
                marked += await _interrupt(
                    conn, row.tenant, row.conversation_id, row.run_id, utcnow()
                )
        return marked

    async def request_cancel(self, tenant: str, conv_id: str, run_id: str) -> Run:
        """Flag a running run for cancellation; the process running it stops it.

        :class:`NotFound` for an unknown run, :class:`Conflict` when it is not running.
        """
        key = [*_child_key(runs, tenant, conv_id), runs.c.run_id == run_id]
        async with write_transaction(self.engine) as conn:
            await conn.execute(
                update(runs).where(*key, runs.c.status == "running").values(cancel_requested=True)
            )
            row = (await conn.execute(select(runs).where(*key))).mappings().first()
        if row is None:
            raise NotFound(f"run {run_id!r} not found")
        run = Run(**row)
        if run.status != "running":
            raise Conflict(f"run {run_id!r} is {run.status}, not running")
        return run

    async def purge_idempotency_keys(self) -> int:
        """Delete idempotency keys past their retention (keys of runs still in flight stay until
        their answer is kept; a dead run's key is released when the run is interrupted)."""
        async with write_transaction(self.engine) as conn:
            done = await conn.execute(
                delete(idempotency_keys).where(
                    idempotency_keys.c.expires_at < utcnow(),
                    idempotency_keys.c.response.is_not(None),
                )
            )
        return int(done.rowcount or 0)

    async def finish_run(
        self,
        tenant: str,
        conv_id: str,
        run_id: str,
        *,
        base: Loaded,
        result: Result,
        store: bool,
        respond: Callable[[RunOutcome], tuple[int, dict[str, Any]]] | None = None,
    ) -> RunOutcome:
        """Record a run's outcome in ONE write transaction.

        When ``store`` is true the result's context replaces ``base`` if, and only if, the stored
        state is still ``base`` (same incarnation and version); otherwise nothing of the context
        is written and the run ends ``conflicted``. Either way the run row is finished, its
        new messages, final and compactions go to the audit tables and the transcript gets every
        admitted prompt, attempt, tool result and compaction. The run's lease is released,
        and ``respond`` (given for requests with an Idempotency-Key) says what answer to keep.

        Only a run still ``running`` finishes: one that lost its lease and was marked
        ``interrupted`` meanwhile writes nothing at all, and learns how it was recorded.
        """
        plan = plan_context_write(base.context, base.first_position, base.next_position, result)
        entries = run_transcript(result, len(base.context.messages), plan)
        try:
            return await self._finish_run(
                tenant,
                conv_id,
                run_id,
                base=base,
                result=result,
                store=store,
                respond=respond,
                plan=plan,
                entries=entries,
            )
        except _NotRunning:
            # The lease fences the write: only a run still ``running`` finishes. A run whose
            # lease expired and that another process marked ``interrupted`` (its process was
            # paused or cut off from the database meanwhile) stores nothing (the transaction
            # was rolled back) and stays as it was marked.
            async with read_transaction(self.engine) as conn:
                return await _no_longer_running(conn, tenant, conv_id, run_id)

    async def _finish_run(
        self,
        tenant: str,
        conv_id: str,
        run_id: str,
        *,
        base: Loaded,
        result: Result,
        store: bool,
        respond: Callable[[RunOutcome], tuple[int, dict[str, Any]]] | None,
        plan: ContextWrite,
        entries: Sequence[TranscriptItem],
    ) -> RunOutcome:
        now = utcnow()
        key = _conversation_key(tenant, conv_id)
        same_incarnation = conversations.c.incarnation == base.incarnation
        returning = (conversations.c.version, conversations.c.transcript_seq)
        release = case(
            (conversations.c.active_run_id == run_id, None), else_=conversations.c.active_run_id
        )

        # Lock order, here as everywhere: the conversation row first, then the run row.
        async with write_transaction(self.engine) as conn:
            row = None
            if store:
                row = (
                    await conn.execute(
                        update(conversations)
                        .where(*key, same_incarnation, conversations.c.version == base.version)
                        .values(
                            version=conversations.c.version + 1,
                            system_prompt=result.context.system_prompt,
                            summary=result.context.summary,
                            next_position=plan.next_position,
                            message_count=len(result.context.messages),
                            transcript_seq=conversations.c.transcript_seq + len(entries),
                            updated_at=now,
                            active_run_id=release,
                        )
                        .returning(*returning)
                    )
                ).first()
            stored = row is not None
            if row is None:
                # Not stored (discarded or stale): only allocate the transcript's seqs.
                row = (
                    await conn.execute(
                        update(conversations)
                        .where(*key, same_incarnation)
                        .values(
                            transcript_seq=conversations.c.transcript_seq + len(entries),
                            active_run_id=release,
                        )
                        .returning(*returning)
                    )
                ).first()
                if row is None:
                    raise NotFound(f"conversation {conv_id!r} was deleted during the run")

            if stored:
                if plan.delete_before is not None:
                    await conn.execute(
                        delete(context_messages).where(
                            *_child_key(context_messages, tenant, conv_id),
                            context_messages.c.position < plan.delete_before,
                        )
                    )
                await _insert_messages(conn, tenant, conv_id, plan.inserts)

            status: RunStatus = result.status if stored or not store else "conflicted"
            etag = make_etag(base.incarnation, row.version)
            result_etag = etag if stored else None
            finished = await conn.execute(
                update(runs)
                .where(
                    *_child_key(runs, tenant, conv_id),
                    runs.c.run_id == run_id,
                    runs.c.status == "running",
                )
                .values(
                    status=status,
                    stored=stored,
                    result_etag=result_etag,
                    usage=result.usage.model_dump(mode="json"),
                    error=result.error.model_dump(mode="json") if result.error else None,
                    finished_at=now,
                    lease_expires_at=None,
                )
            )
            if not finished.rowcount:
                raise _NotRunning  # rolls the transaction back

            await _insert_audit(conn, tenant, conv_id, run_id, result)
            first_seq = row.transcript_seq - len(entries) + 1
            await _insert_transcript(conn, tenant, conv_id, run_id, first_seq, entries, now)

            outcome = RunOutcome(
                status=status, stored=stored, etag=etag, result_etag=result_etag, finished_at=now
            )
            if respond is not None:
                status_code, response = respond(outcome)
                await conn.execute(
                    update(idempotency_keys)
                    .where(
                        *_child_key(idempotency_keys, tenant, conv_id),
                        idempotency_keys.c.run_id == run_id,
                    )
                    .values(status_code=status_code, response=response)
                )
        return outcome

    async def get_run(self, tenant: str, conv_id: str, run_id: str) -> RunRecord | None:
        """A run with its new messages, final and compactions."""
        async with read_transaction(self.engine) as conn:
            row = (
                (
                    await conn.execute(
                        select(runs).where(
                            *_child_key(runs, tenant, conv_id), runs.c.run_id == run_id
                        )
                    )
                )
                .mappings()
                .first()
            )
            if row is None:
                return None
            [record] = await _records(conn, tenant, conv_id, [Run(**row)])
        return record

    async def list_run_records(
        self, tenant: str, conv_id: str, *, after: str | None = None, limit: int = 50
    ) -> list[RunRecord]:
        """A page of runs (as :meth:`list_runs`) with their audit records, in four queries."""
        page = await self.list_runs(tenant, conv_id, after=after, limit=limit)
        async with read_transaction(self.engine) as conn:
            return await _records(conn, tenant, conv_id, page)

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

    async def list_runs(
        self, tenant: str, conv_id: str, *, after: str | None = None, limit: int = 50
    ) -> list[Run]:
        """A page of a conversation's runs, oldest first, starting after the run ``after``."""
        stmt = select(runs).where(*_child_key(runs, tenant, conv_id))
        if after is not None:
            cursor = (
                select(runs.c.created_at)
                .where(*_child_key(runs, tenant, conv_id), runs.c.run_id == after)
                .scalar_subquery()
            )
            stmt = stmt.where(
                or_(
                    runs.c.created_at > cursor,
                    and_(runs.c.created_at == cursor, runs.c.run_id > after),
                )
            )
        stmt = stmt.order_by(runs.c.created_at, runs.c.run_id).limit(limit)
        async with read_transaction(self.engine) as conn:
            await _require_conversation(conn, tenant, conv_id)
            rows = (await conn.execute(stmt)).mappings().all()
        return [Run(**row) for row in rows]

    # --- transcript -------------------------------------------------------------------------------

    async def list_transcript(
        self, tenant: str, conv_id: str, *, after_seq: int = 0, limit: int = 100
    ) -> list[TranscriptEntry]:
        """A page of the transcript, by ``seq``, starting after ``after_seq``."""
        stmt = (
            select(transcript)
            .where(*_child_key(transcript, tenant, conv_id), transcript.c.seq > after_seq)
            .order_by(transcript.c.seq)
            .limit(limit)
        )
        async with read_transaction(self.engine) as conn:
            await _require_conversation(conn, tenant, conv_id)
            rows = (await conn.execute(stmt)).mappings().all()
        return [TranscriptEntry(**row) for row in rows]


# --- statements shared by the methods above ----------------------------------------------------


def _new_conversation(
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


def _run_values(
    tenant: str,
    conv_id: str,
    run_id: str,
    *,
    base_etag: str,
    prompts: Sequence[UserMessage],
    agent: str,
    on_failure: OnFailure,
    now: datetime,
) -> dict[str, Any]:
    return {
        "tenant": tenant,
        "conversation_id": conv_id,
        "run_id": run_id,
        "status": "running",
        "stored": False,
        "on_failure": on_failure,
        "agent": agent,
        "base_etag": base_etag,
        "result_etag": None,
        "prompts": dump_messages(prompts),
        "usage": {},
        "error": None,
        "created_at": now,
        "finished_at": None,
        "lease_owner": None,
        "lease_expires_at": None,
        "cancel_requested": False,
    }


def _etag_matches(conv: Conversation, if_match: IfMatch) -> bool:
    """RFC 9110 If-Match against the current row: ``*``, or any listed strong ETag."""
    if if_match == "*":
        return True
    tags = [if_match] if isinstance(if_match, str) else list(if_match)
    return any(parse_etag(tag) == (conv.incarnation, conv.version) for tag in tags)


async def _claimed(
    conn: AsyncConnection, tenant: str, conv_id: str, claim: IdempotencyClaim, now: datetime
) -> IdempotentReplay | None:
    """What a key seen before means: the stored answer, a refusal, or (expired) nothing."""
    key = [*_child_key(idempotency_keys, tenant, conv_id), idempotency_keys.c.key == claim.key]
    row = (await conn.execute(select(idempotency_keys).where(*key))).mappings().first()
    if row is None:
        return None
    if row["expires_at"] <= now and row["response"] is not None:
        await conn.execute(delete(idempotency_keys).where(*key))
        return None
    if row["request_hash"] != claim.request_hash:
        raise IdempotencyMismatch(
            f"Idempotency-Key {claim.key!r} was used with a different request body"
        )
    if row["response"] is None:
        raise IdempotencyInFlight(
            f"the request with Idempotency-Key {claim.key!r} is still running",
            run_id=row["run_id"],
        )
    return IdempotentReplay(
        run_id=row["run_id"], status_code=int(row["status_code"]), response=row["response"]
    )


async def _interrupt(
    conn: AsyncConnection, tenant: str, conv_id: str, run_id: str, now: datetime
) -> bool:
    """A run whose process died: ``interrupted``, nothing stored, conversation freed.

    Conditional on the run still running with its lease expired (PostgreSQL re-checks that on
    the current row when a renewal or the run's own finish committed meanwhile); False when it
    did not hold, and then nothing is changed.
    """
    error = {
        "kind": "internal",
        "message": "the process running this run went away",
        "status": None,
        "code": "interrupted",
    }
    if conn.dialect.name == "postgresql":
        # Lock order: the conversation row first, then the run row (as start_run and
        # finish_run take them), so that an interrupt never deadlocks with either.
        await conn.execute(
            select(conversations.c.id).where(*_conversation_key(tenant, conv_id)).with_for_update()
        )
    marked = await conn.execute(
        update(runs)
        .where(
            *_child_key(runs, tenant, conv_id),
            runs.c.run_id == run_id,
            runs.c.status == "running",
            or_(runs.c.lease_expires_at.is_(None), runs.c.lease_expires_at <= now),
        )
        .values(status="interrupted", finished_at=now, lease_expires_at=None, error=error)
    )
    if not marked.rowcount:
        return False
    await conn.execute(
        update(conversations)
        .where(*_conversation_key(tenant, conv_id), conversations.c.active_run_id == run_id)
        .values(active_run_id=None)
    )
    # An idempotent request whose run died may be sent again: its key is released.
    await conn.execute(
        delete(idempotency_keys).where(
            *_child_key(idempotency_keys, tenant, conv_id),
            idempotency_keys.c.run_id == run_id,
            idempotency_keys.c.response.is_(None),
        )
    )
    return True


class _NotRunning(Exception):
    """The run being finished is no longer ``running`` (or no longer exists)."""


async def _no_longer_running(
    conn: AsyncConnection, tenant: str, conv_id: str, run_id: str
) -> RunOutcome:
    """What a run that may no longer finish learns: how it was recorded (``interrupted``, or
    its own outcome when a first attempt to finish did commit), and the stored ETag."""
    run = (
        await conn.execute(
            select(runs.c.status, runs.c.stored, runs.c.result_etag, runs.c.finished_at).where(
                *_child_key(runs, tenant, conv_id), runs.c.run_id == run_id
            )
        )
    ).first()
    conv = await _conversation(conn, tenant, conv_id)
    if run is None or conv is None:
        raise NotFound(f"run {run_id!r} not found")
    return RunOutcome(
        status=run.status,
        stored=run.stored,
        etag=conv.etag,
        result_etag=run.result_etag,
        finished_at=run.finished_at,
    )


async def _records(
    conn: AsyncConnection, tenant: str, conv_id: str, page: Sequence[Run]
) -> list[RunRecord]:
    """The audit records of a page of runs: one query per audit table."""
    if not page:
        return []
    ids = [run.run_id for run in page]

    def of(table: Any) -> list[ColumnElement[bool]]:
        return [*_child_key(table, tenant, conv_id), table.c.run_id.in_(ids)]

    new_rows = (
        await conn.execute(
            select(run_new_messages.c.run_id, run_new_messages.c.body)
            .where(*of(run_new_messages))
            .order_by(run_new_messages.c.run_id, run_new_messages.c.seq)
        )
    ).all()
    final_rows = (
        await conn.execute(select(run_finals.c.run_id, run_finals.c.body).where(*of(run_finals)))
    ).all()
    compaction_rows = (
        (
            await conn.execute(
                select(run_compactions)
                .where(*of(run_compactions))
                .order_by(run_compactions.c.run_id, run_compactions.c.seq)
            )
        )
        .mappings()
        .all()
    )
    new_messages: dict[str, list[AnyMessage]] = {i: [] for i in ids}
    for row in new_rows:
        new_messages[row.run_id].append(load_message(row.body))
    finals: dict[str, AssistantMessage] = {}
    for row in final_rows:
        final = load_message(row.body)
        assert isinstance(final, AssistantMessage)
        finals[row.run_id] = final
    compactions: dict[str, list[Compaction]] = {i: [] for i in ids}
    for c in compaction_rows:
        compactions[c["run_id"]].append(
            Compaction.model_validate(
                {
                    "reason": c["reason"],
                    "folded": c["folded"],
                    "previous_summary": c["previous_summary"],
                    "summary": c["summary"],
                    "tokens_before": c["tokens_before"],
                    "tokens_after": c["tokens_after"],
                    "usage": c["usage"],
                }
            )
        )
    return [
        RunRecord(
            run=run,
            new_messages=tuple(new_messages[run.run_id]),
            final=finals.get(run.run_id),
            compactions=tuple(compactions[run.run_id]),
        )
        for run in page
    ]


async def _read_context(conn: AsyncConnection, conv: Conversation) -> Loaded:
    """The stored context of ``conv`` (its row already read in this transaction)."""
    rows = (
        await conn.execute(
            select(context_messages.c.position, context_messages.c.body)
            .where(*_child_key(context_messages, conv.tenant, conv.id))
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


async def _conversation(conn: AsyncConnection, tenant: str, conv_id: str) -> Conversation | None:
    row = (
        (await conn.execute(select(conversations).where(*_conversation_key(tenant, conv_id))))
        .mappings()
        .first()
    )
    return Conversation(**row) if row is not None else None


async def _require_conversation(conn: AsyncConnection, tenant: str, conv_id: str) -> None:
    found = await conn.execute(
        select(conversations.c.version).where(*_conversation_key(tenant, conv_id))
    )
    if found.first() is None:
        raise NotFound(f"conversation {conv_id!r} not found")


async def _missing_or_stale(conn: AsyncConnection, tenant: str, conv_id: str) -> StoreError:
    """Why a conditional write matched no row: it does not exist (a 404 beats a 412) or it
    changed."""
    current = await _conversation(conn, tenant, conv_id)
    if current is None:
        return NotFound(f"conversation {conv_id!r} not found")
    return PreconditionFailed("the conversation changed", current_etag=current.etag)


async def _insert_messages(
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


async def _insert_transcript(
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


async def _insert_audit(
    conn: AsyncConnection, tenant: str, conv_id: str, run_id: str, result: Result
) -> None:
    key = {"tenant": tenant, "conversation_id": conv_id, "run_id": run_id}
    if result.new_messages:
        await conn.execute(
            insert(run_new_messages),
            [{**key, "seq": i, "body": dump_message(m)} for i, m in enumerate(result.new_messages)],
        )
    if result.final is not None:
        await conn.execute(insert(run_finals).values(**key, body=dump_message(result.final)))
    if result.compactions:
        await conn.execute(
            insert(run_compactions),
            [
                {
                    **key,
                    "seq": i,
                    "reason": c.reason,
                    "previous_summary": c.previous_summary,
                    "summary": c.summary,
                    "folded": dump_messages(c.folded),
                    "tokens_before": c.tokens_before,
                    "tokens_after": c.tokens_after,
                    "usage": c.usage.model_dump(mode="json"),
                }
                for i, c in enumerate(result.compactions)
            ],
        )


__all__ = [
    "IdempotencyClaim",
    "IdempotentReplay",
    "IfMatch",
    "Loaded",
    "OnFailure",
    "Renewal",
    "Repository",
    "RunOutcome",
    "RunRecord",
    "RunStatus",
    "StartedRun",
]
