"""Queued runs, background runs and fair waiting (docs/runs.md), for the
:class:`~app.service.runs.RunManager`.

Every request that may wait — ``if_busy: "wait"``, ``if_busy: "enqueue"`` — and every
background request (``Prefer: respond-async``) joins the conversation's queue in the database
(:mod:`app.store.queue`); a run leaves it when it is claimed, in arrival order, under the
conversation's lock. A request whose client waits (*held*) is claimed by its own process, which
polls where it stands with reads and is woken at once when a run of this process on that
conversation ends; a background run is claimed by any process: the one whose run ends before it
(at once), or the lease keeper's sweep (every tick) — so a queue goes on when the process that
accepted it died.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from app.agent.codec import load_messages
from app.agent.messages import UserMessage
from app.clock import Clock
from app.config import Settings
from app.etag import IfMatch
from app.store.errors import conversation_not_found
from app.store.repository import IdempotencyClaim, Repository, RunRecord, StartedRun
from app.store.tables import Run

from .errors import Busy, ShuttingDown
from .types import ActiveRun, Replayed, RunRequest

if TYPE_CHECKING:
    from app.agent.run import Agent

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


class Queueing:
    """The queue side of the :class:`~app.service.runs.RunManager` (a mixin)."""

    repo: Repository
    settings: Settings
    clock: Clock
    owner: str
    closing: bool
    active: dict[str, ActiveRun]
    lease_repo: Repository
    waiting: dict[str, _Waiter]
    _claims: set[asyncio.Task[None]]  # claims started when a run ended (kept referenced)
    queues: set[tuple[str, str]]  # conversations where this process saw queued runs

    if TYPE_CHECKING:  # provided by the RunManager and its LeaseKeeping

        @property
        def tick(self) -> float: ...
        def _took_over(self, started: StartedRun) -> None: ...
        async def _busy_retry_after(self, tenant: str, conversation_id: str) -> int: ...
        def _agent_or_none(self, name: str) -> Agent | None: ...
        def _spawn(self, active: ActiveRun, agent: Agent | None, request: RunRequest) -> None: ...

    async def _queue_start(
        self,
        tenant: str,
        conversation_id: str,
        request: RunRequest,
        *,
        run_id: str,
        if_match: IfMatch | None,
        claim: IdempotencyClaim | None,
        respond_async: bool,
    ) -> StartedRun | Replayed | QueuedRun | EndedUnrun:
        """Join the queue; the started run (this request's) once it is its turn — at once,
        or after waiting (a held request) — or, for a background request, the queued run."""
        wait = request.if_busy == "wait" and not respond_async  # nobody waits in background
        queued = await self.repo.enqueue_run(
            tenant,
            conversation_id,
            run_id=run_id,
            if_match=if_match,
            prompts=request.prompts,
            agent=request.agent,
            on_failure=request.on_failure,
            owner=self.owner,
            lease_seconds=self.settings.lease_seconds,
            held=not respond_async,
            wait_seconds=self.settings.busy_wait_seconds if wait else None,
            reject_if_busy=request.if_busy == "reject",
            idempotency=claim,
            respond_async=respond_async,
        )
        if queued.replay is not None:
            return Replayed(queued.replay.status_code, queued.replay.response)
        self.queues.add((tenant, conversation_id))
        if queued.busy is not None:
            raise Busy(
                queued.busy, retry_after=await self._busy_retry_after(tenant, conversation_id)
            )
        mine = self._mine(queued.started, run_id)
        if mine is not None:
            return mine
        assert queued.run is not None
        if respond_async:
            return QueuedRun(queued.run)
        deadline = self.clock.monotonic() + self.settings.busy_wait_seconds if wait else None
        return await self._wait_until_free(tenant, conversation_id, run_id, deadline)

    def _mine(self, started: StartedRun | None, run_id: str) -> StartedRun | None:
        """The claim's run when it is ``run_id``; another run it started is run here in the
        background (a queue head nobody held)."""
        if started is None:
            return None
        if started.run is None:  # it only freed the conversation of a dead process's run
            self._took_over(started)
            return None
        if started.run.run_id == run_id:
            return started
        self._launch(started)
        return None

    async def _wait_until_free(
        self, tenant: str, conversation_id: str, run_id: str, deadline: float | None
    ) -> StartedRun | QueuedRun | EndedUnrun:
        """A held request waits for its queued run's turn: reads where it stands, claims when
        it can start (``deadline``: the ``if_busy: wait`` bound, then 409)."""
        waiter = self.waiting[run_id] = _Waiter(tenant, conversation_id)
        try:
            while True:
                remaining = math.inf if deadline is None else deadline - self.clock.monotonic()
                if remaining <= 0 and await self.repo.leave_queue(tenant, conversation_id, run_id):
                    holder = await self.repo.lease_holder(tenant, conversation_id)
                    raise Busy(
                        holder or run_id,
                        retry_after=await self._busy_retry_after(tenant, conversation_id),
                    )
                pause = min(self.tick / 4, remaining) if remaining > 0 else self.tick / 4
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(waiter.wake.wait(), pause)
                waiter.wake.clear()
                if self.closing:
                    return await self._give_up(tenant, conversation_id, run_id, deadline)
                state = await self.repo.queue_state(tenant, conversation_id, run_id)
                if state.status is None:
                    if await self.repo.get_conversation(tenant, conversation_id) is None:
                        raise conversation_not_found(conversation_id)  # deleted meanwhile
                    # dropped: its bound passed (seen by another process)
                    raise Busy(
                        run_id, retry_after=await self._busy_retry_after(tenant, conversation_id)
                    )
                if state.status == "running":
                    continue  # claimed elsewhere after this process lost its hold: wait for it
                if state.status != "queued":
                    record = await self.repo.get_run(tenant, conversation_id, run_id)
                    assert record is not None
                    return EndedUnrun(record)
                if not state.claimable:
                    continue
                started = await self.repo.claim_next(
                    tenant,
                    conversation_id,
                    owner=self.owner,
                    lease_seconds=self.settings.lease_seconds,
                    mine=run_id,
                )
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
            await self.repo.leave_queue(tenant, conversation_id, run_id)
            raise ShuttingDown
        await self.repo.release_hold(tenant, conversation_id, run_id)
        record = await self.repo.get_run(tenant, conversation_id, run_id)
        if record is None:  # pragma: no cover - deleted with its conversation
            raise ShuttingDown
        return QueuedRun(record.run)

    def _launch(self, started: StartedRun) -> None:
        """Run a claimed queued run that no request of this process waits for."""
        run = started.run
        assert run is not None and started.loaded is not None
        self.queues.add((run.tenant, run.conversation_id))
        self._took_over(started)
        request = RunRequest(
            prompts=cast(tuple[UserMessage, ...], load_messages(run.prompts, "prompts")),
            agent=run.agent,
            on_failure="discard" if run.on_failure == "discard" else "keep",
        )
        active = ActiveRun(run.tenant, run.conversation_id, run.run_id, started, events=None)
        self._spawn(active, self._agent_or_none(run.agent), request)

    def _conversation_freed(self, tenant: str, conversation_id: str) -> None:
        """A run of this process on the conversation ended: wake its waiters here, and, on a
        conversation where this process saw queued runs, start the next background run at
        once (if it is one's turn; a read first). Queues this process did not see are started
        by the keeper's sweep (any replica's), within a tick."""
        for waiter in self.waiting.values():
            if waiter.tenant == tenant and waiter.conversation_id == conversation_id:
                waiter.wake.set()
        if (tenant, conversation_id) in self.queues and not self.closing:
            task = asyncio.create_task(
                self._claim_background(tenant, conversation_id),
                name=f"carryover-claim-{uuid.uuid4().hex[:8]}",
            )
            self._claims.add(task)
            task.add_done_callback(self._claims.discard)
            task.add_done_callback(_log_failure)

    async def _claim_background(
        self, tenant: str, conversation_id: str, repo: Repository | None = None
    ) -> None:
        repo = repo or self.repo
        if self.closing:
            return
        if not await repo.has_queue(tenant, conversation_id):
            self.queues.discard((tenant, conversation_id))
            return
        started = await repo.claim_next(
            tenant,
            conversation_id,
            owner=self.owner,
            lease_seconds=self.settings.lease_seconds,
            mine=None,
        )
        if started is not None and started.run is not None:
            self._launch(started)
        elif started is not None:
            self._took_over(started)

    async def _sweep_queues(self, *, claim: bool = True) -> None:
        """The keeper's tick: renew the holds of this process's waiting requests, and (with
        ``claim``) start background runs whose conversation is free (their accepting process
        may have died)."""
        if self.waiting:
            await self.lease_repo.renew_holds(
                list(self.waiting), owner=self.owner, lease_seconds=self.settings.lease_seconds
            )
        if self.closing or not claim:
            return
        for tenant, conversation_id in await self.lease_repo.ready_queues():
            await self._claim_background(tenant, conversation_id, self.lease_repo)


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.warning("starting the next queued run failed (%s); the sweep retries", exc)


__all__ = ["EndedUnrun", "QueuedRun", "Queueing"]
