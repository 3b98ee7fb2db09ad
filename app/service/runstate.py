"""What the run machinery's collaborators share: one :class:`RunState` per process.

The :class:`~app.service.runs.RunManager` builds it and hands it to each of its collaborators —
the :class:`~app.service.finishing.Finisher`, the :class:`~app.service.queue.RunQueue`, the
:class:`~app.service.leases.LeaseKeeper` and the :class:`~app.service.compaction.Compactor` —
so each of them reads the same settings, clock, owner, runs in flight and caches, and none
re-declares them.
"""

from __future__ import annotations

import statistics
import uuid
from collections.abc import Callable

from app import telemetry
from app.agent.messages import AttemptError
from app.agent.run import Agent
from app.clock import SYSTEM_CLOCK, Clock
from app.config import Settings
from app.observability import RUNS_IN_PROGRESS, observe_interrupted
from app.store.faults import classify
from app.store.stores import StartedRun, Stores

from . import runlog
from .agents import AgentPool
from .cache import BodyCache, ContextCache
from .events import EventRecorder
from .mcp import McpService
from .types import ActiveRun

#: recent finished runs whose durations give a busy conversation's Retry-After
RECENT_RUNS = 5
#: the Retry-After of a busy conversation without any finished run yet (seconds)
DEFAULT_BUSY_RETRY_AFTER = 1

ProblemSlug = Callable[[AttemptError | None, str], str | None]
"""The problem slug of a run that ended with ``error`` / ``status`` (the API gives it: the
problem registry is the API's), for the run's log line."""


def no_problem(error: AttemptError | None, status: str) -> str | None:
    return None if error is None and status in ("completed", "requires_action") else status


class RunState:
    """The process's run state: the stores, the agents, settings and clock, this process's
    lease owner, its runs in flight (``active``), whether it is stopping (``closing``), and the
    context caches."""

    def __init__(
        self,
        stores: Stores,
        agents: AgentPool,
        settings: Settings,
        clock: Clock = SYSTEM_CLOCK,
        problem_slug: ProblemSlug = no_problem,
    ) -> None:
        self.stores = stores
        self.agents = agents
        self.settings = settings
        self.clock = clock
        self.owner = f"{uuid.uuid4().hex[:12]}"
        self.active: dict[str, ActiveRun] = {}
        self.closing = False
        self.contexts = ContextCache(settings.context_cache_messages, settings.context_cache_bytes)
        self.bodies = BodyCache(settings.context_body_cache_bytes)
        self.problem_slug = problem_slug
        #: the request's own MCP servers checked, the run's tools listed (app/service/mcp.py)
        self.mcp = McpService(settings, agents.mcp)

    @property
    def tick(self) -> float:
        """How often leases are renewed and cancel requests looked for."""
        return min(1.0, self.settings.lease_seconds / 3)

    def register(self, active: ActiveRun) -> None:
        self.active[active.run_id] = active
        RUNS_IN_PROGRESS.inc()

    def unregister(self, run_id: str) -> None:
        if self.active.pop(run_id, None) is not None:
            RUNS_IN_PROGRESS.dec()

    def stop(self, active: ActiveRun) -> None:
        """Cancel a run of this process, unless it is already writing its outcome."""
        if active.finishing:
            return
        if active.task is None or not active.running:
            active.stop_requested = True  # the task sees it when it begins
        else:
            active.task.cancel()

    def agent_or_none(self, name: str) -> Agent | None:
        try:
            return self.agents.get(name)
        except Exception:
            return None

    def took_over(self, started: StartedRun) -> None:
        """A run started (its context cached); one it took over from a dead process is
        logged and counted."""
        if started.loaded is not None and started.run is not None:
            self.contexts.keep(started.run.tenant, started.run.conversation_id, started.loaded)
        if started.interrupted is not None:
            run = started.run
            runlog.run_taken_over(
                interrupted_run_id=started.interrupted,
                run_id=run.run_id if run is not None else "",
                conversation_id=run.conversation_id if run is not None else "",
                tenant=run.tenant if run is not None else "",
                trace_id=telemetry.current_trace_id(),
            )
            observe_interrupted()

    def start_recorder(self, active: ActiveRun) -> EventRecorder:
        """The event recorder of a run that just took its lease: ``run.started`` is its first
        event."""
        run = active.started.run
        recorder = EventRecorder(
            self.stores.events,
            self.clock,
            active.tenant,
            active.conversation_id,
            active.run_id,
            active.events,
        )
        recorder.start(
            {
                "run_id": active.run_id,
                "conversation_id": active.conversation_id,
                "base_etag": run.base_etag if run is not None else None,
            }
        )
        return recorder

    async def busy_retry_after(self, tenant: str, conversation_id: str) -> int:
        """Seconds a client refused with ``409 run-in-progress`` should wait: the median
        duration of the conversation's last :data:`RECENT_RUNS` finished runs, clamped to
        ``[1, lease_seconds]``; :data:`DEFAULT_BUSY_RETRY_AFTER` when none finished yet or the
        database cannot say."""
        try:
            durations = await self.stores.records.recent_run_durations(
                tenant, conversation_id, limit=RECENT_RUNS
            )
        except Exception as exc:
            if classify(exc) is None:
                raise
            return DEFAULT_BUSY_RETRY_AFTER
        if not durations:
            return DEFAULT_BUSY_RETRY_AFTER
        median = statistics.median(durations)
        upper = max(1, int(self.settings.lease_seconds + 0.999))
        return min(upper, max(1, round(median + 0.499)))


__all__ = ["DEFAULT_BUSY_RETRY_AFTER", "RECENT_RUNS", "ProblemSlug", "RunState", "no_problem"]
