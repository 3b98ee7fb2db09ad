"""Compacting a conversation now (``POST …/compact``): a run without prompts, with the lease
and the run record of any run.

:class:`Compactor` is the :class:`~app.service.runs.RunManager`'s collaborator for it, on the
shared :class:`~app.service.runstate.RunState`.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from app import telemetry
from app.agent.events import CompactionCompleted
from app.etag import IfMatch

from .bounds import RunDeadline, size_bounds
from .errors import Busy, ShuttingDown
from .finishing import Finisher, internal_result
from .queue import RunQueue
from .runstate import RunState
from .types import ActiveRun, FinishedRun

# the run service's logger: its records keep the name they had before this module was split out
log = logging.getLogger("app.service.runs")


class Compactor:
    """``compact`` of the :class:`~app.service.runs.RunManager`: it ends as any run ends (the
    ``finisher``), and frees the conversation's queue (the ``queue``)."""

    def __init__(self, state: RunState, finisher: Finisher, queue: RunQueue) -> None:
        self.state = state
        self.finisher = finisher
        self.queue = queue

    async def compact(
        self, tenant: str, conversation_id: str, agent_name: str, if_match: IfMatch | None
    ) -> FinishedRun:
        """Compact now, as a run without prompts: it takes the lease like any run and leaves
        a run record with its compaction."""
        if self.state.closing:
            raise ShuttingDown
        agent = self.state.agents.get(agent_name)
        run_id = str(uuid.uuid4())
        started = await self.state.stores.runs.start_run(
            tenant,
            conversation_id,
            run_id=run_id,
            if_match=if_match,
            prompts=(),
            agent=agent_name,
            on_failure="keep",
            owner=self.state.owner,
            lease_seconds=self.state.settings.lease_seconds,
            cached=self.state.contexts.lookup,
            trace_id=telemetry.current_trace_id(),
        )
        if started.active_run_id is not None:
            retry_after = await self.state.busy_retry_after(tenant, conversation_id)
            raise Busy(started.active_run_id, retry_after=retry_after)
        self.state.took_over(started)
        assert started.loaded is not None
        active = ActiveRun(tenant, conversation_id, run_id, started, None)
        self.state.register(active)
        active.recorder = self.state.start_recorder(active)
        loaded = started.loaded
        # Under the run deadline: past it the compaction is stopped where it is (its summary
        # request, typically) as a cancel stops a run, and ends failed, storing nothing.
        task = asyncio.current_task()
        assert task is not None
        try:
            try:
                with telemetry.agent_span(agent_name, conversation_id, run_id) as span:
                    with RunDeadline(
                        self.state.settings.run_deadline_seconds,
                        task.cancel,
                        "compaction",
                    ) as deadline:
                        result = await agent.compact(
                            loaded.context,
                            tokens=loaded.tokens,
                            bounds=size_bounds(self.state.settings),
                            size=loaded.size,
                        )
                    result = deadline.settle(result)
                    telemetry.record_run(span, result.status, result.usage)
            except Exception as exc:
                log.exception("compaction %s failed unexpectedly", run_id)
                result = internal_result(started.loaded.context, exc)
            for compaction in result.compactions:
                recorded = active.recorder.record(CompactionCompleted(compaction))
                if recorded is not None:
                    await recorded
            active.finishing = True
            return await asyncio.shield(
                self.finisher.finish(active, started.loaded, result, "keep", idempotency=None)
            )
        finally:
            self.state.unregister(run_id)
            active.recorder.abandon()
            self.queue.conversation_freed(tenant, conversation_id)


__all__ = ["Compactor"]
