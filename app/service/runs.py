"""A run as one unit of work: lease → load → agent → conditional save (SPEC §4 steps 1-5).

:class:`RunManager` is per process. It starts runs as tasks of their own — so a run goes on
when the client that asked for it goes away, unless told otherwise — and keeps their leases:
one loop renews the leases of every run of this process in one statement, learns which of them
another replica asked to cancel, and marks runs of dead processes ``interrupted``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from app.agent.events import RunEvent
from app.agent.messages import AttemptError, Context, UserMessage
from app.agent.records import Input, Result
from app.agent.run import Agent
from app.api.schemas import RunCreate
from app.config import Settings
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


class Busy(Exception):
    """Another run holds the conversation (``if_busy: reject``, or waiting timed out)."""

    def __init__(self, active_run_id: str, retry_after: float) -> None:
        super().__init__(f"run {active_run_id} is in progress")
        self.active_run_id = active_run_id
        self.retry_after = retry_after


@dataclass
class ActiveRun:
    """A run of this process in flight: its events and, once done, its answer."""

    tenant: str
    conversation_id: str
    run_id: str
    started: StartedRun
    events: asyncio.Queue[RunEvent | None] | None
    done: asyncio.Future[RunView] = field(default_factory=lambda: asyncio.get_running_loop()
                                          .create_future())
    task: asyncio.Task[None] | None = None


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
        self._keeper: asyncio.Task[None] | None = None

    # --- lifecycle -----------------------------------------------------------------------------

    async def start_keeper(self) -> None:
        if self._keeper is None:
            self._keeper = asyncio.create_task(self._keep_leases(), name="carryover-leases")

    async def aclose(self) -> None:
        """Cancel this process's runs (they are recorded ``cancelled``) and stop the keeper."""
        for active in list(self.active.values()):
            if active.task is not None:
                active.task.cancel()
        for active in list(self.active.values()):
            if active.task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await active.task
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
            self._keeper = None

    @property
    def tick(self) -> float:
        """How often leases are renewed and cancel requests looked for."""
        return min(1.0, self.settings.lease_seconds / 3)

    async def _keep_leases(self) -> None:
        sweeps = 0
        while True:
            await asyncio.sleep(self.tick)
            try:
                ids = list(self.active)
                if ids:
                    cancelled = await self.repo.renew_leases(
                        ids, owner=self.owner, lease_seconds=self.settings.lease_seconds
                    )
                    for run_id in cancelled:
                        active = self.active.get(run_id)
                        if active is not None and active.task is not None:
                            active.task.cancel()
                sweeps += 1
                if sweeps * self.tick >= self.settings.lease_seconds:
                    sweeps = 0
                    await self.repo.interrupt_expired()
            except Exception:  # the database may be away for a moment; try again next tick
                log.exception("lease keeping failed")

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
        agent = self.agents.get(body.agent)
        prompts = body.user_messages()
        claim = None
        if idempotency_key is not None:
            claim = IdempotencyClaim(
                key=idempotency_key, request_hash=request_hash(body),
                ttl_seconds=self.settings.idempotency_ttl_seconds,
            )
        run_id = str(uuid.uuid4())
        deadline = time.monotonic() + (
            self.settings.busy_wait_seconds if body.if_busy == "wait" else 0.0
        )
        while True:
            started = await self.repo.start_run(
                tenant, conversation_id, run_id=run_id, if_match=if_match, prompts=prompts,
                agent=body.agent, on_failure=body.on_failure, owner=self.owner,
                lease_seconds=self.settings.lease_seconds, idempotency=claim,
            )
            if started.replay is not None:
                return Replayed(started.replay.status_code, started.replay.response)
            if started.active_run_id is None:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise Busy(started.active_run_id, retry_after=self.settings.lease_seconds)
            await asyncio.sleep(min(self.tick / 4, remaining))

        active = ActiveRun(
            tenant=tenant, conversation_id=conversation_id, run_id=run_id, started=started,
            events=asyncio.Queue() if stream else None,
        )
        self.active[run_id] = active
        active.task = asyncio.create_task(
            self._execute(active, agent, prompts, body, minimal=minimal,
                          idempotent=claim is not None),
            name=f"carryover-run-{run_id}",
        )
        return active

    async def _execute(
        self, active: ActiveRun, agent: Agent, prompts: tuple[UserMessage, ...], body: RunCreate,
        *, minimal: bool, idempotent: bool,
    ) -> None:
        loaded = active.started.loaded
        assert loaded is not None
        try:
            try:
                result = await self._run_agent(active, agent, loaded.context, prompts)
            except asyncio.CancelledError:  # cancelled before the agent took over
                result = _cancelled(loaded.context)
            except Exception as exc:  # a bug: the run still ends, recorded, lease released
                log.exception("run %s failed unexpectedly", active.run_id)
                result = _internal(loaded.context, exc)
            view = await asyncio.shield(
                self._finish(active, loaded, result, body, minimal=minimal, idempotent=idempotent)
            )
            active.done.set_result(view)
        except BaseException as exc:
            if not active.done.done():
                active.done.set_exception(
                    exc if isinstance(exc, Exception) else RuntimeError("the run was aborted")
                )
            if not isinstance(exc, Exception):
                raise
        finally:
            self.active.pop(active.run_id, None)
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
        self, active: ActiveRun, loaded: Loaded, result: Result, body: RunCreate, *,
        minimal: bool, idempotent: bool,
    ) -> RunView:
        changed = result.context != loaded.context
        store = changed and (result.status == "completed" or body.on_failure == "keep")
        run = active.started.run
        assert run is not None

        def respond(outcome: RunOutcome) -> tuple[int, dict[str, Any]]:
            return 201, run_view(run, result, outcome).body(minimal=minimal)

        outcome = await self.repo.finish_run(
            active.tenant, active.conversation_id, active.run_id,
            base=loaded, result=result, store=store, respond=respond if idempotent else None,
        )
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
                if await disconnected() and active.task is not None:
                    active.task.cancel()
                    return await asyncio.shield(active.done)

    async def cancel(self, tenant: str, conversation_id: str, run_id: str) -> None:
        """Ask a run to stop, wherever it runs; this process's runs stop at once."""
        await self.repo.request_cancel(tenant, conversation_id, run_id)
        active = self.active.get(run_id)
        if active is not None and active.tenant == tenant and active.task is not None:
            active.task.cancel()

    async def compact(
        self, tenant: str, conversation_id: str, agent_name: str, if_match: IfMatch | None
    ) -> RunView:
        """Compact now, as a run without prompts: it takes the lease like any run and leaves
        a run record with its compaction."""
        body = RunCreate(prompts=["(compact)"], agent=agent_name)
        agent = self.agents.get(agent_name)
        run_id = str(uuid.uuid4())
        started = await self.repo.start_run(
            tenant, conversation_id, run_id=run_id, if_match=if_match, prompts=(),
            agent=agent_name, on_failure="keep", owner=self.owner,
            lease_seconds=self.settings.lease_seconds,
        )
        if started.active_run_id is not None:
            raise Busy(started.active_run_id, retry_after=self.settings.lease_seconds)
        assert started.loaded is not None
        active = ActiveRun(tenant, conversation_id, run_id, started, None)
        self.active[run_id] = active
        try:
            try:
                result = await agent.compact(started.loaded.context)
            except Exception as exc:
                log.exception("compaction %s failed unexpectedly", run_id)
                result = _internal(started.loaded.context, exc)
            return await asyncio.shield(self._finish(
                active, started.loaded, result, body, minimal=False, idempotent=False
            ))
        finally:
            self.active.pop(run_id, None)


def _cancelled(context: Context) -> Result:
    return Result(status="cancelled", context=context,
                  error=AttemptError(kind="aborted", message="the run was cancelled"))


def _internal(context: Context, exc: Exception) -> Result:
    return Result(
        status="failed", context=context,
        error=AttemptError(kind="internal", message=f"internal error: {type(exc).__name__}"),
    )


__all__ = ["ActiveRun", "Busy", "Replayed", "RunManager", "request_hash"]
