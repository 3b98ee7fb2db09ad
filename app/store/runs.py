"""The run aggregate (contract §4 steps 1-5): a run takes the conversation's lease and reads its
context in one transaction, and records its outcome in one transaction.

A conversation's messages are rows keyed by an ever-growing ``position``. Compaction folds a
prefix and a run appends at the end, so storing a run's context deletes the folded prefix with one
range ``DELETE`` and inserts only the appended messages: the statements and rows a run writes do
not depend on how long the conversation is. The outcome's write transaction itself is in
:mod:`.outcomes` (a base of :class:`RunStore`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import Select, bindparam, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from app.agent.codec import dump_messages
from app.agent.messages import Context, UserMessage
from app.agent.records import Result
from app.agent.sizes import ContextSize, result_size, size_of
from app.agent.tokens import advance, tally_of
from app.errors import CarryoverError
from app.etag import IfMatch, if_match_holds

from ._sql import Loaded, StoredRows, bound_conversation_key, child_key, decode, read_rows
from ._turns import cancel_queued, queue_head_by_parameters, take_free
from .changes import Answered, StoredPending, last_batch_of, plan_context_write, run_transcript
from .db import defer_inserts, read_transaction, write_transaction
from .direct import prepared
from .errors import Conflict, PreconditionFailed, conversation_not_found, run_not_found
from .events import EventRow
from .idempotency import IdempotencyClaim, IdempotentReplay, claimed, insert_claim
from .outcomes import FinishingStore, NotRunning, RunOutcome, RunStatus, no_longer_running
from .quotas import QuotaExceeded, admit
from .tables import Conversation, Run, conversations, runs, tenant_quotas
from .texts import run_of, select_runs

OnFailure = Literal["keep", "discard"]

#: the detail of a run refused by its If-Match
STALE_RUN = "If-Match does not match the stored context; nothing ran"

#: built once: constructing an INSERT costs more than executing it (docs/performance.md)
_INSERT_RUN = prepared(insert(runs))

CachedContext = Callable[[str, str, str, int], Loaded | None]
"""A cache of stored contexts: ``(tenant, conversation_id, incarnation, version)`` → the
:class:`Loaded` stored at exactly that version, or ``None``."""


def _conversation_with_queue_head() -> Select[Any]:
    """The conversation's row, its queue's head (``queue_head``) and whether its tenant has a
    quota row (``has_quota``: without one the start reads no quota), by bound parameters
    ``tenant``, ``conv_id`` and ``now``: built once, so a run's start pays no statement
    construction (docs/performance.md)."""
    has_quota = (
        select(tenant_quotas.c.tenant)
        .where(tenant_quotas.c.tenant == conversations.c.tenant)
        .exists()
        .label("has_quota")
    )
    return select(conversations, queue_head_by_parameters(), has_quota).where(
        *bound_conversation_key()
    )


_SELECT_FOR_START = prepared(_conversation_with_queue_head())
_SELECT_FOR_START_LOCKED = prepared(
    _conversation_with_queue_head().with_for_update(of=conversations)
)


#: the conversation's lease taken by a run (b_*: SQLAlchemy reserves column names in an UPDATE)
_TAKE_LEASE = prepared(
    update(conversations)
    .where(
        conversations.c.tenant == bindparam("b_tenant"),
        conversations.c.id == bindparam("b_conv_id"),
    )
    .values(active_run_id=bindparam("b_run_id"))
)


def _locking_select(conn: AsyncConnection) -> Select[Any]:
    """The start's first statement: on PostgreSQL it locks the conversation's row."""
    return _SELECT_FOR_START_LOCKED if conn.dialect.name == "postgresql" else _SELECT_FOR_START


@dataclass(frozen=True)
class Refusal:
    """A queued run refused when its turn came (app/store/queue.py): ``error`` is what a direct
    start would have answered (a spent quota, a client-tool pre-check). ``mine``: the run of
    the claiming request — dropped from the queue, the request answers ``error``; otherwise a
    background run, recorded ``failed`` with it."""

    tenant: str
    conversation_id: str
    run_id: str
    agent: str
    error: CarryoverError
    mine: bool


@dataclass(frozen=True)
class StartedRun:
    """What :meth:`RunStore.start_run` did: started the run (``run`` and ``loaded``), found
    the conversation busy (``active_run_id``), or found the answer already given (``replay``).

    A claim of the queue (app/store/queue.py) also says which queued runs it refused on the
    way (``refused``), and ``deferred``: the head waits for one of the tenant's running runs
    to end (its ``concurrent_runs`` quota is spent), nothing was started."""

    run: Run | None = None
    loaded: Loaded | None = None
    active_run_id: str | None = None
    replay: IdempotentReplay | None = None
    interrupted: str | None = None  # a run of a dead process whose lease this one took over
    refused: tuple[Refusal, ...] = ()
    deferred: QuotaExceeded | None = None


class RunStore(FinishingStore):
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
        values = run_values(
            tenant,
            conv_id,
            run_id or str(uuid.uuid4()),
            base_etag=base_etag,
            prompts=prompts,
            agent=agent,
            on_failure=on_failure,
            now=self.clock.now(),
        )
        values["started_at"] = values["created_at"]
        async with write_transaction(self.engine) as conn:
            try:
                await conn.execute(_INSERT_RUN, values)
            except IntegrityError:
                # The foreign key: the conversation does not exist (run ids are fresh uuids).
                raise conversation_not_found(conv_id) from None
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
        cached: CachedContext | None = None,
        check: Callable[[Context, StoredPending], None] | None = None,
        trace_id: str | None = None,
        tool_inputs: dict[str, Any] | None = None,
    ) -> StartedRun:
        """Take the conversation's run lease and load its context, in one write transaction.
        ``tool_inputs``: what the run keeps of its request in its row.

        ``check`` is called before the transaction commits on a context that ends like the
        stored one — the cached context, or the stored context's last batch alone (decoded
        from its rows: O(last batch)) — and the row's ``pending_calls`` (their stored kinds);
        what it raises rolls everything back (no run row, no lease, no idempotency key) and
        propagates (client tools, docs/tools.md).

        In order: :class:`NotFound`; an idempotency key seen before (the stored answer, or
        :class:`IdempotencyMismatch` / :class:`IdempotencyInFlight`); :class:`PreconditionFailed`
        when ``if_match`` does not hold; busy when another run holds a live lease (a lease that
        expired marks its run ``interrupted`` and is taken over). Then the run row, the lease and
        the idempotency key are written and the context is read under them — unless ``cached``
        holds it at the version read under the lock (then no message row is read). The rows
        read are decoded after the transaction, in a worker thread for long contexts.
        """
        interrupted: str | None = None
        hit: Loaded | None = None
        rows: StoredRows | None = None
        async with write_transaction(self.engine) as conn:
            # With the row: the first queued run that may still run (app/store/queue.py), in
            # the same statement — a new run does not overtake the queue.
            found = (
                (
                    await conn.execute(
                        _locking_select(conn),
                        {"tenant": tenant, "conv_id": conv_id, "now": self.clock.now()},
                    )
                )
                .mappings()
                .first()
            )
            # The time once the locks are held: waiting for them must not eat into the lease.
            now = self.clock.now()
            if found is None:
                raise conversation_not_found(conv_id)
            values_found = dict(found)
            ahead = values_found.pop("queue_head")
            has_quota = bool(values_found.pop("has_quota"))
            conv = Conversation.model_construct(**values_found)

            if idempotency is not None:
                replay = await claimed(conn, tenant, conv_id, idempotency, now)
                if replay is not None:
                    return StartedRun(replay=replay)

            if if_match is not None and not if_match_holds(
                if_match, conv.incarnation, conv.version
            ):
                raise PreconditionFailed(STALE_RUN, current_etag=conv.etag)

            busy, interrupted = await take_free(conn, tenant, conv_id, conv.active_run_id, now)
            if busy is not None:
                return StartedRun(active_run_id=busy)
            if ahead is not None:  # runs queued before this request go first
                return StartedRun(active_run_id=ahead, interrupted=interrupted)

            # from here the inserts are read by no one: on SQLite they ride with the next
            # statement or the COMMIT into the driver's thread (app/store/db.py)
            defer_inserts(conn)
            # the tenant's quota, under the same locks (app/store/quotas.py): refused, nothing
            # of this transaction is written
            await admit(conn, tenant, now, quota=has_quota)
            values = run_values(
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
                lease_owner=owner,
                lease_expires_at=now + timedelta(seconds=lease_seconds),
                trace_id=trace_id,
                started_at=now,
                tool_inputs=tool_inputs,
            )
            await conn.execute(_INSERT_RUN, values)  # as parameters: no per-call coercion
            # after the run row: on PostgreSQL the held inserts ride with this statement
            await conn.execute(
                _TAKE_LEASE, {"b_tenant": tenant, "b_conv_id": conv_id, "b_run_id": run_id}
            )
            if idempotency is not None:
                await insert_claim(conn, tenant, conv_id, run_id, idempotency, now)
            if cached is not None:
                hit = cached(tenant, conv_id, conv.incarnation, conv.version)
            if hit is None:
                rows = await read_rows(conn, conv)
            if check is not None:
                if hit is not None:
                    check(hit.context, conv.pending_calls)
                elif rows is not None:
                    check(last_batch_of(rows.texts), conv.pending_calls)
        loaded = hit if hit is not None else await decode(rows)
        return StartedRun(run=Run.model_construct(**values), loaded=loaded, interrupted=interrupted)

    async def request_cancel(self, tenant: str, conv_id: str, run_id: str) -> Run:
        """Flag a running run for cancellation; the process running it stops it. A queued run
        ends ``cancelled`` at once, without running.

        :class:`NotFound` for an unknown run, :class:`Conflict` when it is neither.
        """
        key = [*child_key(runs, tenant, conv_id), runs.c.run_id == run_id]
        async with write_transaction(self.engine) as conn:
            was_queued = await cancel_queued(conn, tenant, conv_id, run_id, self.clock.now())
            await conn.execute(
                update(runs).where(*key, runs.c.status == "running").values(cancel_requested=True)
            )
            row = (
                (await conn.execute(select_runs(conn.dialect.name).where(*key))).mappings().first()
            )
        if row is None:
            raise run_not_found(conv_id, run_id)
        run = run_of(row)
        if run.status != "running" and not was_queued:
            raise Conflict(f"run {run_id!r} is {run.status}, not running")
        return run

    async def finish_run(
        self,
        tenant: str,
        conv_id: str,
        run_id: str,
        *,
        base: Loaded,
        result: Result,
        store: bool,
        events: Sequence[EventRow] = (),
        paused_events: Sequence[EventRow] | None = None,
        answered: Mapping[str, Answered] | None = None,
        size: ContextSize | None = None,
        prompts: Sequence[Any] | None = None,
    ) -> RunOutcome:
        """Record a run's outcome in ONE write transaction, and return it.

        ``answered``: the pending calls the run's input answered, for the transcript.
        ``size``: the size of ``result.context`` when the caller knows it (it checked it
        against the bounds); otherwise advanced from ``base.size`` here (O(what changed)).

        When ``store`` is true the result's context replaces ``base`` if, and only if, the stored
        state is still ``base`` (same incarnation and version); otherwise nothing of the context
        is written and the run ends ``conflicted``. Either way the run row is finished, its
        new messages, final and compactions go to the audit tables and the transcript gets every
        admitted prompt, attempt, tool result and compaction. The run's lease is released. (The
        answer an idempotent request keeps is rendered from the returned outcome by the caller:
        :meth:`IdempotencyStore.keep_answer`.)

        Only a run still ``running`` finishes: one that lost its lease and was marked
        ``interrupted`` meanwhile writes nothing at all, and learns how it was recorded.

        The same transaction stores the run's last ``events`` (not yet written, with the
        ``run.finished`` marker) and the webhook deliveries its outcome calls for;
        ``paused_events`` instead of ``events`` when given and the run is recorded
        ``requires_action`` (they say ``run.requires_action`` before the marker: a pause whose
        save ends ``conflicted`` is not announced).

        ``prompts``: the run's prompts as its row keeps them (``Run.prompts``); when each is
        among its new messages, the finished row references their texts instead of keeping
        its own copy (docs/operations.md, "Storage").
        """
        plan = plan_context_write(base.context, base.first_position, base.next_position, result)
        entries = run_transcript(result, len(base.context.messages), plan, answered)
        tokens = (
            tally_of(result.context.messages)
            if plan.rewritten or base.tokens is None
            else advance(base.tokens, len(base.context.messages), result)
        )
        if not store:
            size = None  # nothing of the context is written
        elif plan.rewritten:  # every message is written anew: counted from scratch
            ctx = result.context
            size = size_of(ctx.system_prompt, ctx.summary, ctx.messages)
        elif size is None:
            size = result_size(base.size, len(base.context.messages), result)
        try:
            return await self._finish_run(
                tenant,
                conv_id,
                run_id,
                base=base,
                result=result,
                store=store,
                plan=plan,
                entries=entries,
                tokens=tokens,
                size=size,
                events=events,
                paused_events=paused_events,
                prompts=prompts,
            )
        except NotRunning:
            # The lease fences the write: only a run still ``running`` finishes. A run whose
            # lease expired and that another process marked ``interrupted`` (its process was
            # paused or cut off from the database meanwhile) stores nothing (the transaction
            # was rolled back) and stays as it was marked.
            async with read_transaction(self.engine) as conn:
                return await no_longer_running(conn, tenant, conv_id, run_id)


def run_values(
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
        "required_action": None,
        "created_at": now,
        "finished_at": None,
        "lease_owner": None,
        "lease_expires_at": None,
        "cancel_requested": False,
        "queue_seq": None,
        "wait_until": None,
        "started_at": None,
        "tool_inputs": None,
    }


__all__ = [
    "STALE_RUN",
    "CachedContext",
    "OnFailure",
    "Refusal",
    "RunOutcome",
    "RunStatus",
    "RunStore",
    "StartedRun",
]
