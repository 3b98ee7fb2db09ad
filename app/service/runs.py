"""A run as one unit of work: lease → load → agent → conditional save (contract §4 steps 1-5).

:class:`RunManager` is per process. It starts runs as tasks of their own — so a run goes on
when the client that asked for it goes away, unless told otherwise — and keeps their leases
(:mod:`app.service.leases`). It takes a :class:`RunRequest` (not an HTTP body) and gives back
plain results: a :class:`FinishedRun` (the run row, the agent's Result and what the store
recorded), run records, or a :class:`Replayed` first answer. Rendering them is the API's.

It runs the run itself; its collaborators share one :class:`~app.service.runstate.RunState`
(the store, settings, clock, owner, runs in flight, caches):

- :class:`~app.service.finishing.Finisher`: how a run ends (outcome stored, answer kept);
- :class:`~app.service.queue.RunQueue`: queued runs, background runs, fair waiting;
- :class:`~app.service.leases.LeaseKeeper`: the lease keeper loop, sweeps, stopping;
- :class:`~app.service.compaction.Compactor`: compacting now.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from app import telemetry
from app.agent.pending import InvalidTools
from app.agent.records import Result
from app.agent.run import Agent
from app.clock import SYSTEM_CLOCK, Clock
from app.config import Settings
from app.errors import CarryoverError
from app.etag import IfMatch
from app.observability import observe_quota_refusal
from app.store.errors import run_not_found
from app.store.quotas import QuotaExceeded
from app.store.stores import IdempotencyClaim, Loaded, RunRecord, StartedRun, Stores

from . import pending, runlog
from .agents import AgentPool
from .bounds import RunDeadline, size_bounds
from .cache import BodyCache, ContextCache
from .compaction import Compactor
from .errors import Busy, ShuttingDown
from .faults import OutcomeNotStored
from .finishing import Finisher, cancelled_result, internal_result, refused_result, settle
from .leases import LeaseKeeper
from .live import LiveStream
from .pages import Page
from .queue import EndedUnrun, QueuedRun, RunQueue
from .runstate import ProblemSlug, RunState, no_problem
from .types import ActiveRun, FinishedRun, Idempotency, Replayed, RunRequest

log = logging.getLogger(__name__)

Disconnected = Callable[[], Awaitable[bool]]


class RunManager:
    """Runs of this process, with its collaborators (``finisher``, ``queue``, ``keeper``,
    ``compactor``) on one shared ``state``."""

    def __init__(
        self,
        stores: Stores,
        agents: AgentPool,
        settings: Settings,
        clock: Clock = SYSTEM_CLOCK,
        *,
        problem_slug: ProblemSlug = no_problem,
    ) -> None:
        self.state = RunState(stores, agents, settings, clock, problem_slug)
        self.finisher = Finisher(self.state)
        self.queue = RunQueue(self.state, spawn=self._spawn)
        self.keeper = LeaseKeeper(self.state, self.queue)
        self.compactor = Compactor(self.state, self.finisher, self.queue)

    # --- the shared state, as callers read it ----------------------------------------------

    @property
    def settings(self) -> Settings:
        return self.state.settings

    @property
    def clock(self) -> Clock:
        return self.state.clock

    @property
    def agents(self) -> AgentPool:
        return self.state.agents

    @property
    def active(self) -> dict[str, ActiveRun]:
        """This process's runs in flight, by run id."""
        return self.state.active

    @property
    def contexts(self) -> ContextCache:
        return self.state.contexts

    @property
    def bodies(self) -> BodyCache:
        return self.state.bodies

    # --- lifetime ----------------------------------------------------------------------------

    async def start_keeper(self) -> None:
        """Begin keeping leases (and sweeping, purging) until :meth:`aclose`."""
        await self.keeper.start()

    async def aclose(self) -> None:
        """Cancel this process's runs (they are recorded ``cancelled``) and stop the keeper."""
        await self.keeper.aclose()

    def stop(self, active: ActiveRun) -> None:
        """Cancel a run of this process, unless it is already writing its outcome."""
        self.state.stop(active)

    # --- runs --------------------------------------------------------------------------------

    async def start(
        self,
        tenant: str,
        conversation_id: str,
        request: RunRequest,
        *,
        if_match: IfMatch | None,
        idempotency: Idempotency | None = None,
        stream: bool = False,
        respond_async: bool = False,
    ) -> ActiveRun | Replayed | QueuedRun | EndedUnrun:
        """Take the conversation's lease and start the run; refusals raise before (each one
        logged).

        ``if_busy: wait|enqueue`` and ``respond_async`` go through the conversation's queue
        (:mod:`app.service.queue`): a background request may answer :class:`QueuedRun`, a
        held one that was cancelled while queued :class:`EndedUnrun`."""
        try:
            return await self._start(
                tenant,
                conversation_id,
                request,
                if_match=if_match,
                idempotency=idempotency,
                stream=stream,
                respond_async=respond_async,
            )
        except CarryoverError as exc:
            if isinstance(exc, QuotaExceeded):
                observe_quota_refusal(exc.limit)
            runlog.run_refused(
                conversation_id=conversation_id,
                tenant=tenant,
                agent=request.agent,
                problem=exc.slug,
                http_status=exc.status,
                detail=exc.detail,
                trace_id=telemetry.current_trace_id(),
            )
            raise

    async def _start(
        self,
        tenant: str,
        conversation_id: str,
        request: RunRequest,
        *,
        if_match: IfMatch | None,
        idempotency: Idempotency | None,
        stream: bool,
        respond_async: bool,
    ) -> ActiveRun | Replayed | QueuedRun | EndedUnrun:
        if self.state.closing:
            raise ShuttingDown
        agent = self.state.agents.for_run(request)
        queued = request.if_busy != "reject" or respond_async
        # the request's own MCP servers (no connection), then every server's listing: a tool
        # name found twice is refused here, before anything is stored (app/service/mcp.py)
        request = await self.state.mcp.admit(request, queued=queued)
        toolset = await self.state.mcp.prelist(agent, request)
        claim = None
        if idempotency is not None:
            claim = IdempotencyClaim(
                key=idempotency.key,
                request_hash=idempotency.request_hash,
                legacy_hash=idempotency.legacy_hash,
                ttl_seconds=self.state.settings.idempotency_ttl_seconds,
            )
        run_id = str(uuid.uuid4())
        if queued:
            # Queued runs, background runs and fair waiting: app/service/queue.py
            turn = await self.queue.start(
                tenant,
                conversation_id,
                request,
                agent=agent,
                run_id=run_id,
                if_match=if_match,
                claim=claim,
                respond_async=respond_async,
            )
            if not isinstance(turn, StartedRun):
                return turn
            started = turn
        else:
            started = await self.state.stores.runs.start_run(
                tenant,
                conversation_id,
                run_id=run_id,
                if_match=if_match,
                prompts=request.prompts,
                agent=request.agent,
                on_failure=request.on_failure,
                owner=self.state.owner,
                lease_seconds=self.state.settings.lease_seconds,
                idempotency=claim,
                cached=self.state.contexts.lookup,
                check=pending.checker(agent, request, toolset),
                trace_id=telemetry.current_trace_id(),
                tool_inputs=pending.kept_inputs(request),
            )
            if started.replay is not None:
                return Replayed(started.replay.status_code, started.replay.response)
            if started.active_run_id is not None:
                raise Busy(
                    started.active_run_id,
                    retry_after=await self.state.busy_retry_after(tenant, conversation_id),
                )
        self.state.took_over(started)

        active = ActiveRun(
            tenant=tenant,
            conversation_id=conversation_id,
            run_id=run_id,
            started=started,
            events=(
                LiveStream(self.settings.stream_buffer_bytes)
                if stream and not respond_async
                else None
            ),
            toolset=toolset,
        )
        self._spawn(active, agent, request, idempotency)
        return active

    def _spawn(
        self,
        active: ActiveRun,
        agent: Agent | None,
        request: RunRequest,
        idempotency: Idempotency | None = None,
    ) -> None:
        """Run a started run as a task of its own (``agent`` None: its profile is unknown
        here, and it fails)."""
        self.state.register(active)
        active.recorder = self.state.start_recorder(active)
        active.task = asyncio.create_task(
            self._execute(active, agent, request, idempotency),
            name=f"carryover-run-{active.run_id}",
        )
        if self.state.closing:  # stopping began while the lease was being taken: end it at once
            self.stop(active)

    async def _execute(
        self,
        active: ActiveRun,
        agent: Agent | None,
        request: RunRequest,
        idempotency: Idempotency | None,
    ) -> None:
        # the run's span: the agent's spans and the writes of its outcome nest in it
        with telemetry.agent_span(request.agent, active.conversation_id, active.run_id) as span:
            await self._execute_in(active, agent, request, idempotency, span)

    async def _execute_in(
        self,
        active: ActiveRun,
        agent: Agent | None,
        request: RunRequest,
        idempotency: Idempotency | None,
        run_span: Any,
    ) -> None:
        loaded = active.started.loaded
        assert loaded is not None
        finish: asyncio.Future[FinishedRun] | None = None
        active.running = True
        try:
            try:
                if active.stop_requested:
                    raise asyncio.CancelledError
                if agent is None:
                    raise LookupError(f"no agent profile {request.agent!r} on this server")
                if request.append:  # items added without a model call (the /v1 surface)
                    result = pending.appended_result(loaded, request.append)
                else:
                    result = await self._run_agent(active, agent, loaded, request)
            except asyncio.CancelledError:  # cancelled before the agent took over
                result = cancelled_result(loaded.context)
            except Exception as exc:  # a bug: the run still ends, recorded, lease released
                log.exception("run %s failed unexpectedly", active.run_id)
                result = internal_result(loaded.context, exc)
            active.finishing = True
            telemetry.record_run(run_span, result.status, result.usage)
            finish = asyncio.ensure_future(
                self.finisher.finish(
                    active, loaded, result, request.on_failure, idempotency, request=request
                )
            )
            try:
                finished = await asyncio.shield(finish)
            except OutcomeNotStored as lost:
                # The client learns now; the record ends truthfully once the database is back.
                active.done.set_exception(lost)
                if active.events is not None:
                    active.events.put_nowait(None)  # a stream ends now, with the problem
                await self.finisher.record_unstored(active, lost)
                return
            except asyncio.CancelledError:
                # Cancelled while the outcome is being written (the event loop is closing):
                # the write goes on, and its answer is still the run's answer.
                finish.add_done_callback(lambda done: settle(active.done, done))
                raise
            active.done.set_result(finished)
        except BaseException as exc:
            settled_later = finish is not None and isinstance(exc, asyncio.CancelledError)
            if not active.done.done() and not settled_later:
                active.done.set_exception(
                    exc if isinstance(exc, Exception) else RuntimeError("the run was aborted")
                )
            if not isinstance(exc, Exception):
                raise
        finally:
            self.state.unregister(active.run_id)
            if active.recorder is not None:
                active.recorder.abandon()
            if active.events is not None:
                active.events.put_nowait(None)
            self.queue.conversation_freed(active.tenant, active.conversation_id)

    async def _run_agent(
        self, active: ActiveRun, agent: Agent, loaded: Loaded, request: RunRequest
    ) -> Result:
        # numbered, stored, and streamed live
        on_event = active.recorder.record if active.recorder is not None else None
        agent_input = pending.agent_input(
            loaded, request, size_bounds(self.state.settings), active.toolset
        )
        with RunDeadline(
            self.state.settings.run_deadline_seconds, lambda: self.stop(active)
        ) as deadline:
            try:
                result = await agent.run(agent_input, on_event=on_event)
            except InvalidTools as exc:  # listed when its turn came (a queued run): a clash
                result = refused_result(loaded.context, pending.refusal(exc, request) or exc)
        result = deadline.settle(result)
        if request.instructions is not None:  # they were for this run only
            stored = loaded.context.system_prompt
            result = result.model_copy(
                update={"context": result.context.model_copy(update={"system_prompt": stored})}
            )
        return result

    async def wait(
        self, active: ActiveRun, *, on_disconnect: str, disconnected: Disconnected | None
    ) -> FinishedRun:
        """The run's outcome; with ``on_disconnect: cancel`` a gone client cancels the run."""
        if on_disconnect != "cancel" or disconnected is None:
            return await asyncio.shield(active.done)
        while True:
            try:
                return await asyncio.wait_for(
                    asyncio.shield(active.done), timeout=self.state.tick / 2
                )
            except TimeoutError:
                if await disconnected():
                    self.stop(active)
                    return await asyncio.shield(active.done)

    async def cancel(self, tenant: str, conversation_id: str, run_id: str) -> RunRecord:
        """Ask a run to stop, wherever it runs; this process's runs stop at once. Returns the
        run's record as it is now (still ``running``, typically)."""
        await self.state.stores.runs.request_cancel(tenant, conversation_id, run_id)
        active = self.active.get(run_id)
        here = active is not None and active.tenant == tenant
        runlog.run_cancel_requested(
            run_id=run_id,
            conversation_id=conversation_id,
            tenant=tenant,
            here=here,
            trace_id=telemetry.current_trace_id(),
        )
        if active is not None and here:
            self.stop(active)
        return await self.record(tenant, conversation_id, run_id)

    async def record(self, tenant: str, conversation_id: str, run_id: str) -> RunRecord:
        """One run record; :class:`~app.store.errors.NotFound` when there is none."""
        record = await self.state.stores.records.get_run(tenant, conversation_id, run_id)
        if record is None:
            raise run_not_found(conversation_id, run_id)
        return record

    async def records(
        self, tenant: str, conversation_id: str, *, after: str | None = None, limit: int = 50
    ) -> Page[RunRecord]:
        """A page of the conversation's run records, oldest first, after the run ``after``."""
        fetched = await self.state.stores.records.list_run_records(
            tenant, conversation_id, after=after, limit=limit + 1
        )
        return Page.of(fetched, limit)


__all__ = [
    "ActiveRun",
    "Busy",
    "EndedUnrun",
    "FinishedRun",
    "Idempotency",
    "QueuedRun",
    "Replayed",
    "RunManager",
    "RunRequest",
    "ShuttingDown",
]
