"""The run queue of a conversation (docs/runs.md "Queued runs", "Fair waiting").

A queued run is a row of ``runs`` with status ``queued`` and its arrival number ``queue_seq``,
so an acknowledged queued run survives the process that accepted it. Runs leave the queue in
arrival order: the head is *claimed* — made ``running`` under a lease of the claiming process,
the conversation's ``active_run_id`` set and its context read — in one write transaction under
the conversation's lock, the same one that starts any run, so two replicas never both start it
and no request overtakes the queue.

Two kinds of queued runs:

- *held*: its client holds the request open (``if_busy: wait``, or ``enqueue`` without
  ``Prefer: respond-async``). ``lease_owner``/``lease_expires_at`` name the holder's process,
  which renews them and is the only one to claim it (it streams or answers the run). A
  waiter also has ``wait_until``: past it, or once its holder's process died, it is dropped
  (its client got, or will never read, a 409). A held ``enqueue`` run whose holder died becomes
  a background run: it was acknowledged as queued.
- *background*: no holder (``Prefer: respond-async``). Any process claims it once it is the head
  and the conversation is free.

A claim admits the run as a direct start does, in its transaction: the tenant's quota
(:func:`~app.store.quotas.refusal`, the quota row locked on PostgreSQL, so replicas cannot
overspend together) and the caller's pre-check of the run's request on the context it would
run on (client tools, docs/tools.md). A refused run never becomes ``running``: the claiming
request's own run is dropped from the queue (its request answers the refusal, as a direct
start would), a background run ends ``failed`` with the refusal as its problem, and the claim
goes on with the next run. A spent ``concurrent_runs`` quota is waited out instead: the head
stays queued (``deferred``) until one of the tenant's runs ends — unless the claiming request
asked not to wait (``if_busy: reject``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import Integer, Select, and_, bindparam, case, func, insert, or_, select, update

from app.agent.messages import UserMessage
from app.etag import IfMatch, if_match_holds

from ._sql import StoreBase, child_key, conversation_key
from ._turns import (
    ASYNC_ANSWER_KEY,
    answer_async,
    async_answer,
    drop_queued,
    live,
    next_queue_seq,
    queue_ahead,
    queued,
    take_free,
)
from .claims import ClaimCheck, claim_head, lock_conversation
from .db import read_transaction, write_transaction
from .errors import PreconditionFailed, conversation_not_found
from .idempotency import IdempotencyClaim, IdempotentReplay, claimed, insert_claim
from .quotas import refusal
from .runs import STALE_RUN, OnFailure, StartedRun, run_values
from .tables import Run, conversations, runs

#: how many conversations with queued runs one sweep looks at
READY_BATCH = 100
#: the limits a run is refused for when it is queued (a spent ``concurrent_runs`` is waited out)
ENQUEUE_LIMITS = ("tokens_per_day", "runs_per_minute")


@dataclass(frozen=True)
class Queued:
    """What :meth:`QueueStore.enqueue_run` did.

    ``run``: the request's run as recorded (``queued``, or ``running`` when it was claimed at
    once: then ``started`` is it). ``started`` may also be another run: the head of the queue,
    left by a process that went away, which this process claimed on the way and must run.
    ``busy``: refused (``if_busy: reject``) because of this run. ``replay``: the key's answer.
    ``run`` is None when the claim refused the request's run (``started.refused``): it was
    removed, and the request answers the refusal.
    """

    run: Run | None = None
    started: StartedRun | None = None
    busy: str | None = None
    replay: IdempotentReplay | None = None


@dataclass(frozen=True)
class QueueState:
    """A read of where a queued run stands (a waiter polls it, then tries to claim)."""

    status: str | None  # the run's status; None once it was dropped
    claimable: bool  # the conversation looks free and the head is this run or a background one


def _ready_queues() -> Select[Any]:
    """:meth:`QueueStore.ready_queues`' statement, on bound parameters ``now`` and ``limit``:
    built once (the keeper runs it every tick, a statement this size costs ~1 ms to build)."""
    now = bindparam("now", type_=runs.c.lease_expires_at.type)
    holder = runs.alias("holder")
    free = or_(
        conversations.c.active_run_id.is_(None),
        holder.c.run_id.is_(None),
        holder.c.status != "running",
        holder.c.lease_expires_at <= now,
    )
    unheld = or_(runs.c.lease_owner.is_(None), runs.c.lease_expires_at <= now)
    return (
        select(runs.c.tenant, runs.c.conversation_id)
        .select_from(
            runs.join(
                conversations,
                and_(
                    conversations.c.tenant == runs.c.tenant,
                    conversations.c.id == runs.c.conversation_id,
                ),
            ).outerjoin(
                holder,
                and_(
                    holder.c.tenant == conversations.c.tenant,
                    holder.c.conversation_id == conversations.c.id,
                    holder.c.run_id == conversations.c.active_run_id,
                ),
            )
        )
        .where(runs.c.status == "queued", unheld, free)
        .group_by(runs.c.tenant, runs.c.conversation_id)
        .order_by(runs.c.tenant, runs.c.conversation_id)
        .limit(bindparam("limit", type_=Integer()))
    )


_READY_QUEUES = _ready_queues()


class QueueStore(StoreBase):
    async def enqueue_run(
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
        held: bool,
        wait_seconds: float | None = None,
        reject_if_busy: bool = False,
        idempotency: IdempotencyClaim | None = None,
        respond_async: bool = False,
        tool_inputs: dict[str, Any] | None = None,
        arrival_check: Callable[[], None] | None = None,
        check: ClaimCheck | None = None,
    ) -> Queued:
        """Queue a run at the end of the conversation's queue and, when its turn is now, claim
        it — one write transaction.

        Refusals first, as for any run: :class:`NotFound`, the key's answer (or its refusals),
        :class:`PreconditionFailed` when ``if_match`` does not hold *now* (a queued run then
        runs on whatever context its predecessors leave), busy (``reject_if_busy``), then
        :class:`QuotaExceeded` when the tenant's ``tokens_per_day`` or ``runs_per_minute`` is
        spent *now* (nothing is queued: the client learns at once). ``held``: the request's
        client waits for it (this process claims it); ``wait_seconds``: an ``if_busy: wait``
        bound; ``reject_if_busy``: nothing is queued when the conversation is busy or has a
        queue. ``respond_async``: the key's answer is kept at once (repeats answer the run's
        record). ``arrival_check`` refuses (raises) what is wrong whatever the context, after
        the quota; ``tool_inputs`` are kept with the run; ``check`` is the claim's pre-check.

        A claim that refuses this run (``started.refused`` names it ``mine``) removed it: the
        request answers the refusal, and ``run`` is None.
        """
        async with write_transaction(self.engine) as conn:
            locked = await lock_conversation(conn, tenant, conv_id, self.clock)
            if locked is None:
                raise conversation_not_found(conv_id)
            conv, now = locked
            if idempotency is not None:
                replay = await claimed(conn, tenant, conv_id, idempotency, now)
                if replay is not None:
                    return Queued(replay=replay)
            if if_match is not None and not if_match_holds(
                if_match, conv.incarnation, conv.version
            ):
                raise PreconditionFailed(STALE_RUN, current_etag=conv.etag)
            if reject_if_busy:
                busy, _ = await take_free(conn, tenant, conv_id, conv.active_run_id, now)
                busy = busy or await queue_ahead(conn, tenant, conv_id, now)
                if busy is not None:
                    return Queued(busy=busy)
            spent = await refusal(conn, tenant, now, limits=ENQUEUE_LIMITS, lock=False)
            if spent is not None:
                raise spent
            if arrival_check is not None:
                arrival_check()

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
                status="queued",
                queue_seq=await next_queue_seq(conn, tenant, conv_id),
                wait_until=None if wait_seconds is None else now + timedelta(seconds=wait_seconds),
                tool_inputs=tool_inputs or None,
            )
            if held:
                values.update(
                    lease_owner=owner, lease_expires_at=now + timedelta(seconds=lease_seconds)
                )
            await conn.execute(insert(runs).values(values))
            if idempotency is not None:
                await insert_claim(conn, tenant, conv_id, run_id, idempotency, now)
                if respond_async:
                    await answer_async(conn, tenant, conv_id, run_id)
            started = await claim_head(
                conn,
                conv,
                now,
                owner=owner,
                lease_seconds=lease_seconds,
                mine=run_id,
                check=check,
                reject=reject_if_busy,
            )
        if started is not None and any(r.mine for r in started.refused):
            return Queued(started=started)
        mine = Run(**values)
        if started is not None and started.run is not None and started.run.run_id == run_id:
            mine = started.run
        return Queued(run=mine, started=started)

    async def claim_next(
        self,
        tenant: str,
        conv_id: str,
        *,
        owner: str,
        lease_seconds: float,
        mine: str | None,
        check: ClaimCheck | None = None,
    ) -> StartedRun | None:
        """Claim the head of the conversation's queue when the conversation is free: the run
        ``mine`` (a request of this process that waits for it) or a background run, admitted
        (the tenant's quota, ``check``). None when it is not this process's turn to start
        anything; ``refused`` names the runs refused on the way, ``deferred`` a head that waits
        for the tenant's ``concurrent_runs``."""
        async with write_transaction(self.engine) as conn:
            locked = await lock_conversation(conn, tenant, conv_id, self.clock)
            if locked is None:
                return None
            conv, now = locked
            return await claim_head(
                conn, conv, now, owner=owner, lease_seconds=lease_seconds, mine=mine, check=check
            )

    async def has_queue(self, tenant: str, conv_id: str) -> bool:
        """A read: are runs queued on the conversation (that may still run)?"""
        async with read_transaction(self.engine) as conn:
            return await queue_ahead(conn, tenant, conv_id, self.clock.now()) is not None

    async def queue_state(self, tenant: str, conv_id: str, run_id: str) -> QueueState:
        """A read: the queued run's status, and whether a claim by its holder would start
        something now (the waiter only tries to claim then: waiting costs reads, not writes)."""
        now = self.clock.now()
        async with read_transaction(self.engine) as conn:
            status = (
                await conn.execute(
                    select(runs.c.status).where(
                        *child_key(runs, tenant, conv_id), runs.c.run_id == run_id
                    )
                )
            ).scalar_one_or_none()
            if status != "queued":
                return QueueState(status=status, claimable=False)
            active = (
                await conn.execute(
                    select(conversations.c.active_run_id).where(*conversation_key(tenant, conv_id))
                )
            ).scalar_one_or_none()
            if active is not None:
                holder = (
                    await conn.execute(
                        select(runs.c.status, runs.c.lease_expires_at).where(
                            *child_key(runs, tenant, conv_id), runs.c.run_id == active
                        )
                    )
                ).first()
                if (
                    holder is not None
                    and holder.status == "running"
                    and holder.lease_expires_at is not None
                    and holder.lease_expires_at > now
                ):
                    return QueueState(status=status, claimable=False)
            head = (
                await conn.execute(
                    select(runs.c.run_id, runs.c.lease_owner, runs.c.lease_expires_at)
                    .where(*queued(tenant, conv_id), live(now))
                    .order_by(runs.c.queue_seq)
                    .limit(1)
                )
            ).first()
        claimable = head is not None and (
            head.run_id == run_id
            or head.lease_owner is None
            or head.lease_expires_at is None
            or head.lease_expires_at <= now
        )
        return QueueState(status=status, claimable=claimable)

    async def leave_queue(self, tenant: str, conv_id: str, run_id: str) -> bool:
        """The request of a held queued run gives up (its bound passed, or its server stops):
        the run is removed, as if refused. False when it is no longer queued."""
        async with write_transaction(self.engine) as conn:
            return await drop_queued(conn, tenant, conv_id, run_id)

    async def release_hold(self, tenant: str, conv_id: str, run_id: str) -> bool:
        """The client of a held ``enqueue`` run went away: the run stays queued, as a
        background run any process claims. False when it is no longer queued."""
        async with write_transaction(self.engine) as conn:
            done = await conn.execute(
                update(runs)
                .where(
                    *child_key(runs, tenant, conv_id),
                    runs.c.run_id == run_id,
                    runs.c.status == "queued",
                )
                .values(lease_owner=None, lease_expires_at=None)
            )
            if done.rowcount:
                await answer_async(conn, tenant, conv_id, run_id)
        return bool(done.rowcount)

    async def renew_holds(
        self, run_ids: Sequence[str], *, owner: str, lease_seconds: float
    ) -> frozenset[str]:
        """Extend the holds of this process's waiting requests, in one statement; returns the
        runs still queued and held by it."""
        if not run_ids:
            return frozenset()
        async with write_transaction(self.engine) as conn:
            rows = (
                await conn.execute(
                    update(runs)
                    .where(
                        runs.c.run_id.in_(list(run_ids)),
                        runs.c.lease_owner == owner,
                        runs.c.status == "queued",
                    )
                    .values(lease_expires_at=self.clock.now() + timedelta(seconds=lease_seconds))
                    .returning(runs.c.run_id)
                )
            ).all()
        return frozenset(row.run_id for row in rows)

    async def count_queued(self) -> tuple[int, int]:
        """A read: the runs in status ``queued`` of every tenant, as ``(background,
        waiting)`` — waiting: its client holds the request (a holder whose process died counts
        there until a claim makes it a background run). One statement over the
        ``ix_runs_status_lease`` range of ``queued``: O(queued runs), not O(runs)."""
        waiting = func.sum(case((runs.c.lease_owner.is_not(None), 1), else_=0))
        async with read_transaction(self.engine) as conn:
            row = (
                await conn.execute(select(func.count(), waiting).where(runs.c.status == "queued"))
            ).first()
        total, held = (int(row[0] or 0), int(row[1] or 0)) if row is not None else (0, 0)
        return total - held, held

    async def ready_queues(self, *, limit: int = READY_BATCH) -> list[tuple[str, str]]:
        """Conversations where a claim would likely start a queued run that no client holds
        (a background run, or one whose holder's process died) — a read. The sweep claims their
        heads, so that a queue goes on when the process that accepted it died."""
        async with read_transaction(self.engine) as conn:
            rows = (
                await conn.execute(_READY_QUEUES, {"now": self.clock.now(), "limit": limit})
            ).all()
        return [(row.tenant, row.conversation_id) for row in rows]


__all__ = [
    "ASYNC_ANSWER_KEY",
    "ENQUEUE_LIMITS",
    "READY_BATCH",
    "QueueState",
    "QueueStore",
    "Queued",
    "async_answer",
]
