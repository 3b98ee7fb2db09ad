"""A run as one unit of work: lease → load → agent → conditional save (SPEC §4 steps 1-5).

:class:`RunManager` is per process. It starts runs as tasks of their own — so a run goes on
when the client that asked for it goes away, unless told otherwise — and keeps their leases.
One loop, every :attr:`RunManager.tick`:

- renews the leases of every run of this process in one statement, and learns from the same
  statement which of them another replica asked to cancel (they are cancelled) and which are no
  longer this process's (another process found the lease expired and marked the run
  ``interrupted``; the run is cancelled, and the store refuses its outcome);
- marks runs of dead processes (their lease expired) ``interrupted``: a read on the
  ``(status, lease_expires_at)`` index, and a short write per run found, so a dead process's
  runs end within about ``lease_seconds + tick`` of its last renewal;
- every ``min(60 s, idempotency_ttl_seconds)`` (at most as often as that), deletes the
  idempotency keys past their retention.

Shutdown: when the process is asked to stop (SIGTERM or SIGINT to a server that handles them,
such as uvicorn), the runs in flight are cancelled at once and recorded ``cancelled`` — their
clients get that answer and their conversations are free at once, instead of the server waiting
for runs that may go on for minutes (or being killed and leaving them to their leases). A run
that is already writing its outcome finishes writing. New runs are refused while stopping.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import signal
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from sqlalchemy.exc import InterfaceError, OperationalError

from app.agent.events import RunEvent
from app.agent.messages import AttemptError, Context, UserMessage
from app.agent.records import Input, Result
from app.agent.run import Agent
from app.api.schemas import RunCreate
from app.config import Settings
from app.observability import RUNS, RUNS_IN_PROGRESS
from app.store.db import make_engine
from app.store.repository import (
    IdempotencyClaim,
    IfMatch,
    Loaded,
    Repository,
    RunOutcome,
    StartedRun,
)

from .agents import AgentPool
from .metrics import observe_result
from .views import RunView, run_view

log = logging.getLogger(__name__)

Disconnected = Callable[[], Awaitable[bool]]

#: the signals after which a server stops: runs in flight are cancelled then
SHUTDOWN_SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: idempotency keys past their retention are deleted at most this often (seconds)
PURGE_EVERY = 60.0
#: tries to record a run's outcome when the database fails transiently (0.2 s, 0.4 s, … apart)
FINISH_ATTEMPTS = 5


class Busy(Exception):
    """Another run holds the conversation (``if_busy: reject``, or waiting timed out)."""

    def __init__(self, active_run_id: str, retry_after: float) -> None:
        super().__init__(f"run {active_run_id} is in progress")
        self.active_run_id = active_run_id
        self.retry_after = retry_after


class ShuttingDown(Exception):
    """The process is stopping: it starts no new run."""


@dataclass
class ActiveRun:
    """A run of this process in flight: its events and, once done, its answer."""

    tenant: str
    conversation_id: str
    run_id: str
    started: StartedRun
    events: asyncio.Queue[RunEvent | None] | None
    done: asyncio.Future[RunView] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    task: asyncio.Task[None] | None = None
    running: bool = False  # the task has begun (a task cancelled before it begins never does)
    stop_requested: bool = False  # asked to stop before the task began
    finishing: bool = False  # the outcome is being written: cancelling now changes nothing


@dataclass(frozen=True)
class Replayed:
    """The stored first answer of an idempotent request (same key, same body)."""

    status_code: int
    body: dict[str, Any]


def request_hash(body: RunCreate) -> str:
    canonical = json.dumps(body.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


class RunManager:
    def __init__(self, repo: Repository, agents: AgentPool, settings: Settings) -> None:
        self.repo = repo
        self.agents = agents
        self.settings = settings
        self.owner = f"{uuid.uuid4().hex[:12]}"
        self.active: dict[str, ActiveRun] = {}
        self.closing = False
        self.lease_repo = repo  # renewals, sweeps, purges: its own connection once keeping
        self._keeper: asyncio.Task[None] | None = None
        self._hooked: dict[int, tuple[Any, Any]] = {}

    # --- lifecycle -----------------------------------------------------------------------------

    async def start_keeper(self) -> None:
        if self._keeper is None:
            self.lease_repo = self._own_connection()
            self._keeper = asyncio.create_task(self._keep_leases(), name="carryover-leases")
            self._hook_signals()

    def _own_connection(self) -> Repository:
        """A repository on a connection of the keeper's own.

        Under load every connection of the shared pool is taken and hundreds of requests queue
        for one; a renewal queued behind them comes too late, and the runs' leases expire while
        the runs are alive. (An in-memory SQLite database is one per connection: shared then.)
        """
        url = self.repo.engine.url
        if url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:"):
            return self.repo
        return Repository(make_engine(url, pool_size=1, max_overflow=0))

    async def aclose(self) -> None:
        """Cancel this process's runs (they are recorded ``cancelled``) and stop the keeper."""
        self.shutdown()
        for active in list(self.active.values()):
            if active.task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await active.task
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
            self._keeper = None
        if self.lease_repo is not self.repo:
            await self.lease_repo.engine.dispose()
            self.lease_repo = self.repo
        self._unhook_signals()

    def shutdown(self) -> None:
        """Stop: refuse new runs and cancel the ones in flight (each is recorded cancelled)."""
        if not self.closing and self.active:
            log.info("stopping: cancelling %d run(s) in flight", len(self.active))
        self.closing = True
        for active in list(self.active.values()):
            self.stop(active)

    def stop(self, active: ActiveRun) -> None:
        """Cancel a run of this process, unless it is already writing its outcome."""
        if active.finishing:
            return
        if active.task is None or not active.running:
            active.stop_requested = True  # the task sees it when it begins
        else:
            active.task.cancel()

    def _hook_signals(self) -> None:
        """Cancel the runs as soon as the server is told to stop.

        Only where a server installed its own handler for the signal (uvicorn does, to stop
        gracefully): that handler still runs. Without one, nothing is changed.
        """
        if threading.current_thread() is not threading.main_thread():
            return
        loop = asyncio.get_running_loop()
        for sig in SHUTDOWN_SIGNALS:
            previous = signal.getsignal(sig)
            if not callable(previous) or previous is signal.default_int_handler:
                continue

            def handler(
                signum: int,
                frame: FrameType | None,
                previous: Callable[[int, FrameType | None], Any] = previous,
            ) -> None:
                loop.call_soon_threadsafe(self.shutdown)
                previous(signum, frame)

            signal.signal(sig, handler)
            self._hooked[sig] = (previous, handler)

    def _unhook_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, (previous, handler) in self._hooked.items():
            if signal.getsignal(sig) is handler:
                signal.signal(sig, previous)
        self._hooked.clear()

    @property
    def tick(self) -> float:
        """How often leases are renewed and cancel requests looked for."""
        return min(1.0, self.settings.lease_seconds / 3)

    async def _keep_leases(self) -> None:
        purged = time.monotonic()
        purge_every = min(PURGE_EVERY, float(self.settings.idempotency_ttl_seconds))
        while True:
            await asyncio.sleep(self.tick)
            try:
                await self._renew()
                interrupted = await self.lease_repo.interrupt_expired(alive=set(self.active))
                if interrupted:
                    log.warning("marked %d run(s) of a dead process interrupted", interrupted)
                    RUNS.labels(status="interrupted").inc(interrupted)
                now = time.monotonic()
                if now - purged >= purge_every:
                    purged = now
                    await self.lease_repo.purge_idempotency_keys()
            except Exception:  # the database may be away for a moment; try again next tick
                log.exception("lease keeping failed")

    async def _renew(self) -> None:
        ids = list(self.active)  # finishing ones too: recording may take a while
        if not ids:
            return
        renewal = await self.lease_repo.renew_leases(
            ids, owner=self.owner, lease_seconds=self.settings.lease_seconds
        )
        for run_id in ids:
            active = self.active.get(run_id)
            if active is None:
                continue
            if run_id not in renewal.renewed:
                if active.finishing:
                    continue  # it finished (or is finishing) meanwhile
                log.warning(
                    "run %s lost its lease (marked interrupted elsewhere); stopping it", run_id
                )
                self.stop(active)
            elif run_id in renewal.cancel_requested:
                self.stop(active)

    def _register(self, active: ActiveRun) -> None:
        self.active[active.run_id] = active
        RUNS_IN_PROGRESS.inc()

    def _unregister(self, run_id: str) -> None:
        if self.active.pop(run_id, None) is not None:
            RUNS_IN_PROGRESS.dec()

    # --- runs --------------------------------------------------------------------------------

    async def start(
        self,
        tenant: str,
        conversation_id: str,
        body: RunCreate,
        *,
        if_match: IfMatch | None,
        idempotency_key: str | None = None,
        minimal: bool = False,
        stream: bool = False,
    ) -> ActiveRun | Replayed:
        """Take the conversation's lease and start the run; 4xx conditions raise before."""
        if self.closing:
            raise ShuttingDown("the server is stopping")
        agent = self.agents.get(body.agent)
        prompts = body.user_messages()
        claim = None
        if idempotency_key is not None:
            claim = IdempotencyClaim(
                key=idempotency_key,
                request_hash=request_hash(body),
                ttl_seconds=self.settings.idempotency_ttl_seconds,
            )
        run_id = str(uuid.uuid4())
        deadline = time.monotonic() + (
            self.settings.busy_wait_seconds if body.if_busy == "wait" else 0.0
        )
        while True:
            started = await self.repo.start_run(
                tenant,
                conversation_id,
                run_id=run_id,
                if_match=if_match,
                prompts=prompts,
                agent=body.agent,
                on_failure=body.on_failure,
                owner=self.owner,
                lease_seconds=self.settings.lease_seconds,
                idempotency=claim,
            )
            if started.replay is not None:
                return Replayed(started.replay.status_code, started.replay.response)
            if started.active_run_id is None:
                break
            await self._wait_until_free(tenant, conversation_id, started.active_run_id, deadline)
        self._took_over(started)

        active = ActiveRun(
            tenant=tenant,
            conversation_id=conversation_id,
            run_id=run_id,
            started=started,
            events=asyncio.Queue() if stream else None,
        )
        self._register(active)
        active.task = asyncio.create_task(
            self._execute(
                active, agent, prompts, body, minimal=minimal, idempotent=claim is not None
            ),
            name=f"carryover-run-{run_id}",
        )
        if self.closing:  # stopping began while the lease was being taken: end it at once
            self.stop(active)
        return active

    async def _wait_until_free(
        self, tenant: str, conversation_id: str, holder: str, deadline: float
    ) -> None:
        """``if_busy: wait``: poll with reads (cheap, and concurrent even on SQLite) until the
        conversation looks free; Busy once the deadline passed."""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise Busy(holder, retry_after=self.settings.lease_seconds)
            await asyncio.sleep(min(self.tick / 4, remaining))
            if self.closing:
                raise ShuttingDown("the server is stopping")
            found = await self.repo.lease_holder(tenant, conversation_id)
            if found is None:
                return  # free (or its holder's lease expired): try to take it
            holder = found

    @staticmethod
    def _took_over(started: StartedRun) -> None:
        if started.interrupted is not None:
            log.warning("run %s of a dead process was marked interrupted", started.interrupted)
            RUNS.labels(status="interrupted").inc()

    async def _execute(
        self,
        active: ActiveRun,
        agent: Agent,
        prompts: tuple[UserMessage, ...],
        body: RunCreate,
        *,
        minimal: bool,
        idempotent: bool,
    ) -> None:
        loaded = active.started.loaded
        assert loaded is not None
        finish: asyncio.Future[RunView] | None = None
        active.running = True
        try:
            try:
                if active.stop_requested:
                    raise asyncio.CancelledError
                result = await self._run_agent(active, agent, loaded.context, prompts)
            except asyncio.CancelledError:  # cancelled before the agent took over
                result = _cancelled(loaded.context)
            except Exception as exc:  # a bug: the run still ends, recorded, lease released
                log.exception("run %s failed unexpectedly", active.run_id)
                result = _internal(loaded.context, exc)
            active.finishing = True
            finish = asyncio.ensure_future(
                self._finish(active, loaded, result, body, minimal=minimal, idempotent=idempotent)
            )
            try:
                view = await asyncio.shield(finish)
            except asyncio.CancelledError:
                # Cancelled while the outcome is being written (the event loop is closing):
                # the write goes on, and its answer is still the run's answer.
                finish.add_done_callback(lambda done: _settle(active.done, done))
                raise
            active.done.set_result(view)
        except BaseException as exc:
            settled_later = finish is not None and isinstance(exc, asyncio.CancelledError)
            if not active.done.done() and not settled_later:
                active.done.set_exception(
                    exc if isinstance(exc, Exception) else RuntimeError("the run was aborted")
                )
            if not isinstance(exc, Exception):
                raise
        finally:
            self._unregister(active.run_id)
            if active.events is not None:
                active.events.put_nowait(None)

    async def _run_agent(
        self, active: ActiveRun, agent: Agent, context: Context, prompts: tuple[UserMessage, ...]
    ) -> Result:
        async def on_event(event: RunEvent) -> None:
            if active.events is not None:
                active.events.put_nowait(event)

        return await agent.run(Input(context=context, prompts=prompts), on_event=on_event)

    async def _finish(
        self,
        active: ActiveRun,
        loaded: Loaded,
        result: Result,
        body: RunCreate,
        *,
        minimal: bool,
        idempotent: bool,
    ) -> RunView:
        # A run only appends and compacts (app/agent/run.py), so this says whether the context
        # changed without comparing every message of a long conversation.
        changed = bool(result.compactions) or (
            len(result.context.messages) != len(loaded.context.messages)
        )
        store = changed and (result.status == "completed" or body.on_failure == "keep")
        run = active.started.run
        assert run is not None

        def respond(outcome: RunOutcome) -> tuple[int, dict[str, Any]]:
            return 201, run_view(run, result, outcome).body(minimal=minimal)

        for attempt in range(FINISH_ATTEMPTS):
            try:
                outcome = await self.repo.finish_run(
                    active.tenant,
                    active.conversation_id,
                    active.run_id,
                    base=loaded,
                    result=result,
                    store=store,
                    respond=respond if idempotent else None,
                )
                break
            except (OperationalError, InterfaceError) as exc:
                # The database was away or (SQLite) locked past its busy timeout: the outcome
                # is one transaction, so try it again rather than lose the run. (Had a first
                # attempt committed after all, the next one reads what it recorded.)
                if attempt + 1 == FINISH_ATTEMPTS:
                    raise
                log.warning(
                    "recording run %s failed (%s); trying again", active.run_id, type(exc).__name__
                )
                await asyncio.sleep(0.2 * 2**attempt)
        if outcome.status == "interrupted":
            # It lost its lease: another process marked it interrupted (and counted it).
            log.warning(
                "run %s finished after its lease was lost; nothing was stored", active.run_id
            )
        else:
            observe_result(outcome.status, result, run.created_at, outcome.finished_at)
        return run_view(run, result, outcome)

    async def wait(
        self, active: ActiveRun, *, on_disconnect: str, disconnected: Disconnected | None
    ) -> RunView:
        """The run's answer; with ``on_disconnect: cancel`` a gone client cancels the run."""
        if on_disconnect != "cancel" or disconnected is None:
            return await asyncio.shield(active.done)
        while True:
            try:
                return await asyncio.wait_for(asyncio.shield(active.done), timeout=self.tick / 2)
            except TimeoutError:
                if await disconnected():
                    self.stop(active)
                    return await asyncio.shield(active.done)

    async def cancel(self, tenant: str, conversation_id: str, run_id: str) -> None:
        """Ask a run to stop, wherever it runs; this process's runs stop at once."""
        await self.repo.request_cancel(tenant, conversation_id, run_id)
        active = self.active.get(run_id)
        if active is not None and active.tenant == tenant:
            self.stop(active)

    async def compact(
        self, tenant: str, conversation_id: str, agent_name: str, if_match: IfMatch | None
    ) -> RunView:
        """Compact now, as a run without prompts: it takes the lease like any run and leaves
        a run record with its compaction."""
        if self.closing:
            raise ShuttingDown("the server is stopping")
        body = RunCreate(prompts=["(compact)"], agent=agent_name)
        agent = self.agents.get(agent_name)
        run_id = str(uuid.uuid4())
        started = await self.repo.start_run(
            tenant,
            conversation_id,
            run_id=run_id,
            if_match=if_match,
            prompts=(),
            agent=agent_name,
            on_failure="keep",
            owner=self.owner,
            lease_seconds=self.settings.lease_seconds,
        )
        if started.active_run_id is not None:
            raise Busy(started.active_run_id, retry_after=self.settings.lease_seconds)
        self._took_over(started)
        assert started.loaded is not None
        active = ActiveRun(tenant, conversation_id, run_id, started, None)
        self._register(active)
        try:
            try:
                result = await agent.compact(started.loaded.context)
            except Exception as exc:
                log.exception("compaction %s failed unexpectedly", run_id)
                result = _internal(started.loaded.context, exc)
            active.finishing = True
            return await asyncio.shield(
                self._finish(active, started.loaded, result, body, minimal=False, idempotent=False)
            )
        finally:
            self._unregister(run_id)


def _settle(target: asyncio.Future[RunView], source: asyncio.Future[RunView]) -> None:
    if target.done():
        return
    if source.cancelled():
        target.set_exception(RuntimeError("the run was aborted"))
    elif (exc := source.exception()) is not None:
        target.set_exception(exc)
    else:
        target.set_result(source.result())


def _cancelled(context: Context) -> Result:
    return Result(
        status="cancelled",
        context=context,
        error=AttemptError(kind="aborted", message="the run was cancelled"),
    )


def _internal(context: Context, exc: Exception) -> Result:
    return Result(
        status="failed",
        context=context,
        error=AttemptError(kind="internal", message=f"internal error: {type(exc).__name__}"),
    )


__all__ = ["ActiveRun", "Busy", "Replayed", "RunManager", "ShuttingDown", "request_hash"]
