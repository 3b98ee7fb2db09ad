"""Compacting a conversation now (``POST …/compact``): a run without prompts, with the lease
and the run record of any run.

Split out of :mod:`app.service.runs`; :class:`Compacting` is a mixin of
:class:`~app.service.runs.RunManager`.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import TYPE_CHECKING

from app import telemetry
from app.agent.events import CompactionCompleted
from app.agent.records import Result
from app.clock import Clock
from app.config import Settings
from app.etag import IfMatch
from app.store.repository import Loaded, OnFailure, Repository, StartedRun

from .agents import AgentPool
from .bounds import RunDeadline, size_bounds
from .cache import ContextCache
from .errors import Busy, ShuttingDown
from .events import start_recorder
from .finishing import _internal
from .types import ActiveRun, FinishedRun, Idempotency, RunRequest

# the run service's logger: its records keep the name they had before this module was split out
log = logging.getLogger("app.service.runs")


class Compacting:
    """``compact`` of the :class:`~app.service.runs.RunManager` (a mixin)."""

    repo: Repository
    agents: AgentPool
    settings: Settings
    clock: Clock
    owner: str
    closing: bool
    contexts: ContextCache

    if TYPE_CHECKING:  # provided by the RunManager and its other mixins

        async def _busy_retry_after(self, tenant: str, conversation_id: str) -> int: ...
        def _took_over(self, started: StartedRun) -> None: ...
        def _register(self, active: ActiveRun) -> None: ...
        def _unregister(self, run_id: str) -> None: ...
        def _conversation_freed(self, tenant: str, conversation_id: str) -> None: ...
        async def _finish(
            self,
            active: ActiveRun,
            loaded: Loaded,
            result: Result,
            on_failure: OnFailure,
            idempotency: Idempotency | None,
            *,
            request: RunRequest | None = None,
        ) -> FinishedRun: ...

    async def compact(
        self, tenant: str, conversation_id: str, agent_name: str, if_match: IfMatch | None
    ) -> FinishedRun:
        """Compact now, as a run without prompts: it takes the lease like any run and leaves
        a run record with its compaction."""
        if self.closing:
            raise ShuttingDown
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
            cached=self.contexts.lookup,
            trace_id=telemetry.current_trace_id(),
        )
        if started.active_run_id is not None:
            retry_after = await self._busy_retry_after(tenant, conversation_id)
            raise Busy(started.active_run_id, retry_after=retry_after)
        self._took_over(started)
        assert started.loaded is not None
        active = ActiveRun(tenant, conversation_id, run_id, started, None)
        self._register(active)
        active.recorder = start_recorder(self.repo, self.clock, active)
        loaded = started.loaded
        # Under the run deadline: past it the compaction is stopped where it is (its summary
        # request, typically) as a cancel stops a run, and ends failed, storing nothing.
        task = asyncio.current_task()
        assert task is not None
        try:
            try:
                with telemetry.agent_span(agent_name, conversation_id, run_id) as span:
                    with RunDeadline(
                        self.settings.run_deadline_seconds,
                        task.cancel,
                        "compaction",
                    ) as deadline:
                        result = await agent.compact(
                            loaded.context,
                            tokens=loaded.tokens,
                            bounds=size_bounds(self.settings),
                            size=loaded.size,
                        )
                    result = deadline.settle(result)
                    telemetry.record_run(span, result.status, result.usage)
            except Exception as exc:
                log.exception("compaction %s failed unexpectedly", run_id)
                result = _internal(started.loaded.context, exc)
            for compaction in result.compactions:
                await active.recorder.record(CompactionCompleted(compaction))
            active.finishing = True
            return await asyncio.shield(
                self._finish(active, started.loaded, result, "keep", idempotency=None)
            )
        finally:
            self._unregister(run_id)
            active.recorder.abandon()
            self._conversation_freed(tenant, conversation_id)
