"""Queued runs, background runs and fair waiting (docs/runs.md): the
:class:`~app.service.runs.RunManager`'s :class:`RunQueue`, on the shared
:class:`~app.service.runstate.RunState`.

Every request that may wait — ``if_busy: "wait"``, ``if_busy: "enqueue"`` — and every
background request (``Prefer: respond-async``) joins the conversation's queue in the database
(:mod:`app.store.queue`); a run leaves it when it is claimed, in arrival order, under the
conversation's lock. A request whose client waits (*held*) is claimed by its own process, which
polls where it stands with reads and is woken at once when a run of this process on that
conversation ends; a background run is claimed by any process: the one whose run ends before it
(at once), or the lease keeper's sweep (every tick) — so a queue goes on when the process that
accepted it died.

A claim admits the run as a direct start is admitted (app/store/queue.py): the tenant's quota,
and the client-tool pre-check of its request (:func:`~app.service.pending.checker`) on the
context it would run on — the request is kept with the queued row, so any process checks and
runs what was asked. A refused run never runs: a request waiting for its run answers the
refusal (429 ``quota-exceeded``, 409 ``tool-results-required``, 422
``unexpected-tool-answer``); a background run ends ``failed`` with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from app import telemetry
from app.agent.messages import Context
from app.agent.run import Agent
from app.etag import IfMatch
from app.observability import observe_quota_refusal
from app.store.changes import StoredPending
from app.store.errors import conversation_not_found
from app.store.quotas import QuotaExceeded
from app.store.stores import IdempotencyClaim, RunRecord, StartedRun, Stores
from app.store.tables import Run

from . import pending, runlog
from .errors import Busy, ShuttingDown
from .runstate import RunState
from .types import ActiveRun, Replayed, RunRequest

Spawn = Callable[[ActiveRun, Agent | None, RunRequest], None]
"""Run a started run as a task of its own (the RunManager's)."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class QueuedRun:
    """A run accepted into the queue, not started (a background request, or a held one whose
    server stops: it stays queued for any replica)."""

    run: Run


@dataclass(frozen=True)
class EndedUnrun:
    """A held queued run that ended without running here (cancelled while queued, or started
    by another process after this one lost its hold): its record."""

    record: RunRecord


@dataclass
class _Waiter:
    tenant: str
    conversation_id: str
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class RunQueue:
    """The conversations' queues as this process takes part in them: its held requests
    (``waiting``), the claims it started when one of its runs ended, and the background runs
    it claims (run with ``spawn``)."""

    def __init__(self, state: RunState, spawn: Spawn) -> None:
        self.state = state
        self.spawn = spawn
        self.waiting: dict[str, _Waiter] = {}  # held queued runs of this process
        self.claims: set[asyncio.Task[None]] = set()  # claims started when a run ended
        self.queues: set[tuple[str, str]] = set()  # conversations where it saw queued runs

    async def start(
        self,
        tenant: str,
        conversation_id: str,
        request: RunRequest,
        *,
        agent: Agent,
        run_id: str,
        if_match: IfMatch | None,
        claim: IdempotencyClaim | None,
        respond_async: bool,
    ) -> StartedRun | Replayed | QueuedRun | EndedUnrun:
        """Join the queue; the started run (this request's) once it is its turn — at once,
        or after waiting (a held request) — or, for a background request, the queued run.
        Refused when it arrives (a spent quota, bad client tools) or when its turn comes (a
        spent quota, the pre-check on the context it would run on): nothing of it stays."""
        wait = request.if_busy == "wait" and not respond_async  # nobody waits in background
        queued = await self.state.stores.queue.enqueue_run(
            tenant,
            conversation_id,
            run_id=run_id,
            if_match=if_match,
            prompts=request.prompts,
            agent=request.agent,
            on_failure=request.on_failure,
            owner=self.state.owner,
            lease_seconds=self.state.settings.lease_seconds,
            held=not respond_async,
            wait_seconds=self.state.settings.busy_wait_seconds if wait else None,
            reject_if_busy=request.if_busy == "reject",
            idempotency=claim,
            respond_async=respond_async,
            tool_inputs=pending.tool_inputs(request),
            arrival_check=lambda: pending.check_on_arrival(agent, request),
            check=self._claim_check,
        )
        if queued.replay is not None:
            return Replayed(queued.replay.status_code, queued.replay.response)
        self.queues.add((tenant, conversation_id))
        if queued.busy is not None:
            raise Busy(
                queued.busy, retry_after=await self.state.busy_retry_after(tenant, conversation_id)
            )
        mine = self._mine(queued.started, run_id)  # raises this run's refusal
        if mine is not None:
            return mine
        assert queued.run is not None
        if respond_async:
            return QueuedRun(queued.run)
        deadline = (
            self.state.clock.monotonic() + self.state.settings.busy_wait_seconds if wait else None
        )
        return await self._wait_until_free(tenant, conversation_id, run_id, deadline)

    def _mine(self, started: StartedRun | None, run_id: str) -> StartedRun | None:
        """The claim's run when it is ``run_id``; another run it started is run here in the
        background (a queue head nobody held). The claim's refusal of ``run_id`` is raised
        (it left the queue: its request answers it as a direct start would)."""
        if started is None:
            return None
        if started.run is None:  # it freed the conversation of a dead process's run, refused
            self.state.took_over(started)
        elif started.run.run_id == run_id:
            self._refused(started)  # background runs before it
            return started
        else:
            self._launch(started)  # the queue went on (after this request's run, refused)
        self._refused(started)
        return None

    def _claim_check(self, run: Run, context: Context, stored: StoredPending) -> None:
        """The pre-check of a queued run when its turn comes (as :func:`pending.checker` on
        a direct start), on the context it would run on and its stored pending calls."""
        agent = self.state.agent_or_none(run.agent)
        if agent is None:
            return  # no such profile here: it starts and fails, saying so (as before)
        pending.checker(agent, pending.queued_request(run))(context, stored)

    def _refused(self, started: StartedRun) -> None:
        """Say what a claim refused: a background run (recorded ``failed``) is logged and
        counted here; the claiming request's own run is raised (its request answers it, and
        :meth:`RunManager.start` logs and counts it)."""
        mine = None
        for refused in started.refused:
            if refused.mine:
                mine = refused.error
                continue
            if isinstance(refused.error, QuotaExceeded):
                observe_quota_refusal(refused.error.limit)
            runlog.run_refused(
                run_id=refused.run_id,
                conversation_id=refused.conversation_id,
                tenant=refused.tenant,
                agent=refused.agent,
                problem=refused.error.slug,
                http_status=refused.error.status,
                detail=refused.error.detail,
                trace_id=telemetry.current_trace_id(),
            )
        if mine is not None:
            raise mine

    async def _wait_until_free(
        self, tenant: str, conversation_id: str, run_id: str, deadline: float | None
    ) -> StartedRun | QueuedRun | EndedUnrun:
        """A held request waits for its queued run's turn: reads where it stands, claims when
        it can start (``deadline``: the ``if_busy: wait`` bound, then 409)."""
        waiter = self.waiting[run_id] = _Waiter(tenant, conversation_id)
        # the last claim left the run queued for the tenant's concurrent_runs: past the bound
        # the request answers that (429), not 409
        deferred: QuotaExceeded | None = None
        try:
            while True:
                remaining = (
                    math.inf if deadline is None else deadline - self.state.clock.monotonic()
                )
                if remaining <= 0 and await self.state.stores.queue.leave_queue(
                    tenant, conversation_id, run_id
                ):
                    if deferred is not None:
                        raise deferred
                    holder = await self.state.stores.leases.lease_holder(tenant, conversation_id)
                    raise Busy(
                        holder or run_id,
                        retry_after=await self.state.busy_retry_after(tenant, conversation_id),
                    )
                # a run waiting for a concurrent_runs place tries a claim (a write) once a tick
                step = self.state.tick if deferred is not None else self.state.tick / 4
                pause = min(step, remaining) if remaining > 0 else step
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(waiter.wake.wait(), pause)
                waiter.wake.clear()
                if self.state.closing:
                    return await self._give_up(tenant, conversation_id, run_id, deadline)
                state = await self.state.stores.queue.queue_state(tenant, conversation_id, run_id)
                if state.status is None:
                    if (
                        await self.state.stores.conversations.get_conversation(
                            tenant, conversation_id
                        )
                        is None
                    ):
                        raise conversation_not_found(conversation_id)  # deleted meanwhile
                    # dropped: its bound passed (seen by another process)
                    raise Busy(
                        run_id,
                        retry_after=await self.state.busy_retry_after(tenant, conversation_id),
                    )
                if state.status == "running":
                    continue  # claimed elsewhere after this process lost its hold: wait for it
                if state.status != "queued":
                    record = await self.state.stores.records.get_run(
                        tenant, conversation_id, run_id
                    )
                    assert record is not None
                    return EndedUnrun(record)
                if not state.claimable:
                    continue
                started = await self.state.stores.queue.claim_next(
                    tenant,
                    conversation_id,
                    owner=self.state.owner,
                    lease_seconds=self.state.settings.lease_seconds,
                    mine=run_id,
                    check=self._claim_check,
                )
                deferred = started.deferred if started is not None else None
                mine = self._mine(started, run_id)
                if mine is not None:
                    return mine
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._give_up(tenant, conversation_id, run_id, deadline))
            raise
        finally:
            self.waiting.pop(run_id, None)

    async def _give_up(
        self, tenant: str, conversation_id: str, run_id: str, deadline: float | None
    ) -> QueuedRun:
        """The server stops (or the request is cancelled) while a held run waits: a waiter
        leaves the queue (503 not-ready, try again); an ``enqueue`` run stays queued for any
        replica, and its request answers 202 with it."""
        if deadline is not None:
            await self.state.stores.queue.leave_queue(tenant, conversation_id, run_id)
            raise ShuttingDown
        await self.state.stores.queue.release_hold(tenant, conversation_id, run_id)
        record = await self.state.stores.records.get_run(tenant, conversation_id, run_id)
        if record is None:  # pragma: no cover - deleted with its conversation
            raise ShuttingDown
        return QueuedRun(record.run)

    def _launch(self, started: StartedRun) -> None:
        """Run a claimed queued run that no request of this process waits for."""
        run = started.run
        assert run is not None and started.loaded is not None
        self.queues.add((run.tenant, run.conversation_id))
        self.state.took_over(started)
        request = pending.queued_request(run)
        active = ActiveRun(run.tenant, run.conversation_id, run.run_id, started, events=None)
        self.spawn(active, self.state.agent_or_none(run.agent), request)

    def conversation_freed(self, tenant: str, conversation_id: str) -> None:
        """A run of this process on the conversation ended: wake its waiters here, and, on a
        conversation where this process saw queued runs, start the next background run at
        once (if it is one's turn; a read first). Queues this process did not see are started
        by the keeper's sweep (any replica's), within a tick."""
        for waiter in self.waiting.values():
            if waiter.tenant == tenant and waiter.conversation_id == conversation_id:
                waiter.wake.set()
        if (tenant, conversation_id) in self.queues and not self.state.closing:
            task = asyncio.create_task(
                self._claim_background(tenant, conversation_id),
                name=f"carryover-claim-{uuid.uuid4().hex[:8]}",
            )
            self.claims.add(task)
            task.add_done_callback(self.claims.discard)
            task.add_done_callback(_log_failure)

    async def _claim_background(
        self, tenant: str, conversation_id: str, stores: Stores | None = None
    ) -> None:
        await self._claim_background_run(tenant, conversation_id, stores)

    async def _claim_background_run(
        self, tenant: str, conversation_id: str, stores: Stores | None = None
    ) -> bool:
        """Claim the conversation's head if it is a background run; True when it waits for
        a ``concurrent_runs`` place of its tenant (nothing started)."""
        queue = (stores or self.state.stores).queue
        if self.state.closing:
            return False
        if not await queue.has_queue(tenant, conversation_id):
            self.queues.discard((tenant, conversation_id))
            return False
        started = await queue.claim_next(
            tenant,
            conversation_id,
            owner=self.state.owner,
            lease_seconds=self.state.settings.lease_seconds,
            mine=None,
            check=self._claim_check,
        )
        if started is not None and started.run is not None:
            self._launch(started)
        elif started is not None:
            self.state.took_over(started)
        if started is not None:
            self._refused(started)  # background runs only: none is this process's request
        return started is not None and started.deferred is not None

    async def sweep(self, stores: Stores, *, claim: bool = True) -> None:
        """The keeper's tick (on the keeper's ``stores``): renew the holds of this process's
        waiting requests, and (with ``claim``) start background runs whose conversation is
        free (their accepting process may have died)."""
        if self.waiting:
            await stores.queue.renew_holds(
                list(self.waiting),
                owner=self.state.owner,
                lease_seconds=self.state.settings.lease_seconds,
            )
        if self.state.closing or not claim:
            return
        waiting: set[str] = set()  # tenants whose concurrent_runs are spent: one claim a tick
        for tenant, conversation_id in await stores.queue.ready_queues():
            if tenant in waiting:
                continue
            if await self._claim_background_run(tenant, conversation_id, stores):
                waiting.add(tenant)

    def wake_all(self) -> None:
        """The process stops: requests waiting in a queue give up now."""
        for waiter in self.waiting.values():
            waiter.wake.set()

    async def drain(self) -> None:
        """Wait for the claims in flight (a run one claims while stopping ends cancelled)."""
        for claim in list(self.claims):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await claim


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.warning("starting the next queued run failed (%s); the sweep retries", exc)


__all__ = ["EndedUnrun", "QueuedRun", "RunQueue", "Spawn"]
