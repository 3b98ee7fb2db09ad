"""How a run ends: its outcome recorded (retried while the database fails transiently), the
idempotent answer kept, the log line and metrics; and the record of a run whose outcome could not
be stored, once the database answers (docs/faults.md).

:class:`Finisher` is the :class:`~app.service.runs.RunManager`'s collaborator for it, on the
shared :class:`~app.service.runstate.RunState`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from app.agent.messages import AttemptError, Context
from app.agent.records import Result
from app.observability import observe_interrupted
from app.store.faults import classify
from app.store.stores import EventRow, Loaded, OnFailure

from . import pending, runlog
from .bounds import refusal_of, refused
from .faults import OutcomeNotStored, outage_reason, retry_write
from .metrics import observe_result
from .runstate import RunState
from .types import ActiveRun, FinishedRun, Idempotency, RunRequest

# the run service's logger: its records keep the name they had before this module was split out
log = logging.getLogger("app.service.runs")

T = TypeVar("T")


class Finisher:
    """The end of a run of the :class:`~app.service.runs.RunManager`."""

    def __init__(self, state: RunState) -> None:
        self.state = state

    async def finish(
        self,
        active: ActiveRun,
        loaded: Loaded,
        result: Result,
        on_failure: OnFailure,
        idempotency: Idempotency | None,
        *,
        request: RunRequest | None = None,
    ) -> FinishedRun:
        """Record the outcome (one transaction); then, for an idempotent request, render its
        answer from the committed outcome and keep it (a second one)."""
        # A run only appends and compacts (app/agent/run.py), so this says whether the context
        # changed without comparing every message of a long conversation.
        changed = bool(result.compactions) or (
            len(result.context.messages) != len(loaded.context.messages)
        )
        ended_well = result.status in ("completed", "requires_action")
        store = changed and (ended_well or on_failure == "keep")
        size = None
        if store:
            # What a PUT of it would refuse is never stored (app/service/bounds.py).
            size, reason = await refusal_of(self.state.settings, loaded, result)
            if reason is not None:
                result, store, size = refused(result, reason), False, None
        run = active.started.run
        assert run is not None
        events: Sequence[EventRow] = ()
        paused: Sequence[EventRow] | None = None  # the events if the pause is stored
        if active.recorder is not None:
            action = pending.required_action(result)
            if action is not None:
                events, paused = await active.recorder.close_paused(action)
            else:
                events = await active.recorder.close()
        started_at = self.state.clock.monotonic()
        try:
            outcome = await self.retrying(
                active.run_id,
                lambda: self.state.stores.runs.finish_run(
                    active.tenant,
                    active.conversation_id,
                    active.run_id,
                    base=loaded,
                    result=result,
                    store=store,
                    events=events,
                    paused_events=paused,
                    answered=pending.answered(request) if request is not None else None,
                    size=size,
                    prompts=run.prompts,
                ),
            )
        except Exception as exc:
            fault = classify(exc)
            if fault is None:
                raise
            log.error(
                "run %s ended %s but its outcome could not be stored (database %s: %s)",
                active.run_id,
                result.status,
                fault.kind,
                fault.detail,
            )
            waited = self.state.clock.monotonic() - started_at
            raise OutcomeNotStored(active.run_id, result.status, fault, waited) from exc
        if active.recorder is not None:
            active.recorder.settle(outcome.status)  # run.requires_action only if it was stored
        self.state.contexts.saved(active.tenant, active.conversation_id, outcome)
        base = (loaded.incarnation, loaded.version)
        self.state.bodies.saved(active.tenant, active.conversation_id, base, outcome)
        finished = FinishedRun(run, result, outcome)
        seconds = (
            (outcome.finished_at - run.created_at).total_seconds()
            if outcome.finished_at is not None
            else 0.0
        )
        runlog.run_ended(
            run_id=active.run_id,
            conversation_id=active.conversation_id,
            tenant=active.tenant,
            agent=run.agent,
            status=outcome.status,
            seconds=seconds,
            result=result,
            problem=self.state.problem_slug(result.error, outcome.status),
            trace_id=run.trace_id,
        )
        if outcome.status == "interrupted":
            # It lost its lease: another process marked it interrupted (and counted it).
            log.warning(
                "run %s finished after its lease was lost; nothing was stored", active.run_id
            )
        else:
            observe_result(
                outcome.status,
                result,
                run.started_at or run.created_at,  # a queued run: from its claim
                outcome.finished_at,
                agent=run.agent,
            )
            if idempotency is not None:
                status_code, body = idempotency.answer(finished)
                try:
                    await self.retrying(
                        active.run_id,
                        lambda: self.state.stores.idempotency.keep_answer(
                            active.tenant,
                            active.conversation_id,
                            active.run_id,
                            status_code=status_code,
                            response=body,
                        ),
                    )
                except Exception as exc:
                    if classify(exc) is None:
                        raise
                    # The outcome is stored: the answer says so; only a replay of this key
                    # cannot be answered from the database (docs/faults.md).
                    log.error("run %s: its idempotent answer could not be kept", active.run_id)
        return finished

    async def retrying(self, run_id: str, write: Callable[[], Awaitable[T]]) -> T:
        """A write of a run's outcome, tried again while the database fails transiently (it
        restarts, a connection is lost, SQLite is locked past its busy timeout), for at most
        ``outcome_retry_seconds``; the lease is renewed meanwhile (the run is still this
        process's). Each is one transaction fenced by the lease, so trying again loses
        nothing (had a first attempt committed after all, the next one reads what it
        recorded)."""
        return await retry_write(
            run_id, write, seconds=self.state.settings.outcome_retry_seconds, clock=self.state.clock
        )

    async def record_unstored(self, active: ActiveRun, lost: OutcomeNotStored) -> None:
        """End the record of a run whose outcome could not be stored: ``interrupted``, its
        reason naming the outage, as soon as the database answers (the lease is renewed until
        then, so no other process marks it with a vaguer reason). Given up when the process
        stops: then its lease expires and any process marks it interrupted."""
        error = outage_reason(lost)
        delay = 0.05  # tried often: a client sending its prompts again races this mark
        while not self.state.closing:
            try:
                marked = await self.state.stores.leases.mark_unstored(
                    active.tenant,
                    active.conversation_id,
                    active.run_id,
                    self.state.owner,
                    error,
                )
            except Exception as exc:
                if classify(exc) is None:
                    log.exception("run %s could not be marked interrupted", active.run_id)
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)
                continue
            if marked:
                log.warning("run %s was marked interrupted: %s", active.run_id, error["message"])
                observe_interrupted()
            return


def settle(target: asyncio.Future[FinishedRun], source: asyncio.Future[FinishedRun]) -> None:
    """Settle ``target`` as ``source`` ended (a run's answer from its outcome write)."""
    if target.done():
        return
    if source.cancelled():
        target.set_exception(RuntimeError("the run was aborted"))
    elif (exc := source.exception()) is not None:
        target.set_exception(exc)
    else:
        target.set_result(source.result())


def cancelled_result(context: Context) -> Result:
    """The Result of a run cancelled before its agent took over."""
    return Result(
        status="cancelled",
        context=context,
        error=AttemptError(kind="aborted", message="the run was cancelled"),
    )


def internal_result(context: Context, exc: Exception) -> Result:
    """The Result of a run that failed on a bug of ours (``internal``)."""
    return Result(
        status="failed",
        context=context,
        error=AttemptError(kind="internal", message=f"internal error: {type(exc).__name__}"),
    )


def refused_result(context: Context, exc: Exception) -> Result:
    """The Result of a run whose tools turned out unusable when it listed them (a queued run:
    its request was accepted before), failed before anything was admitted."""
    return Result(
        status="failed",
        context=context,
        error=AttemptError(kind="fatal", message=str(exc), code="invalid_tools"),
    )


__all__ = ["Finisher", "cancelled_result", "internal_result", "refused_result", "settle"]
