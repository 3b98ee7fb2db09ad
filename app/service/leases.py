"""The run service's process-wide duties, apart from running: keeping the leases of this
process's runs, sweeping runs of dead processes, purging idempotency keys, and stopping.

:class:`LeaseKeeper` is the :class:`~app.service.runs.RunManager`'s collaborator for them, on the
shared :class:`~app.service.runstate.RunState`. One loop, every :attr:`RunState.tick`:

- renews the leases of every run of this process in one statement, and learns from the same
  statement which of them another replica asked to cancel (they are cancelled) and which are no
  longer this process's (another process found the lease expired and marked the run
  ``interrupted``; the run is cancelled, and the store refuses its outcome);
- marks runs of dead processes (their lease expired) ``interrupted`` — but not after a pass
  failed on the database until the database answered this process again and
  :data:`SWEEP_GRACE_TICKS` ticks passed since: a lease that expired while the database was
  away may belong to a live run, whose process renews it first (at its own next tick) — a
  read on the ``(status, lease_expires_at)`` index, and a short write per run found, so a dead
  process's runs end within about ``lease_seconds + tick`` of its last renewal;
- renews the holds of this process's requests waiting in a conversation's queue, and (outside
  that grace) claims the heads of queues that no client holds once their conversation is free
  (after a run ended or its process died: :mod:`app.service.queue`);
- every ``min(60 s, idempotency_ttl_seconds)`` (at most as often as that, by the injected
  clock's monotonic time), deletes the idempotency keys past their retention, and run events
  past theirs (``event_retention_seconds``, in bounded batches).

Shutdown: when the process is asked to stop (SIGTERM or SIGINT to a server that handles them,
such as uvicorn), the runs in flight are cancelled at once and recorded ``cancelled`` — their
clients get that answer and their conversations are free at once, instead of the server waiting
for runs that may go on for minutes (or being killed and leaving them to their leases). A run
that is already writing its outcome finishes writing. New runs are refused while stopping.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from app.observability import observe_interrupted
from app.store.db import make_engine
from app.store.faults import classify
from app.store.stores import Stores

from .queue import RunQueue
from .runstate import RunState

log = logging.getLogger(__name__)

#: the signals after which a server stops: runs in flight are cancelled then
SHUTDOWN_SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: idempotency keys past their retention are deleted at most this often (seconds)
PURGE_EVERY = 60.0
#: ticks without sweeping once the database answers again after a failed keeping pass: the
#: live processes renew first
SWEEP_GRACE_TICKS = 2
#: the most batches of expired conversations one sweep deletes (the rest wait a tick)
SWEEP_BATCHES = 10


class LeaseKeeper:
    """The lease keeper and the stopping of a :class:`~app.service.runs.RunManager`'s runs."""

    def __init__(self, state: RunState, queue: RunQueue) -> None:
        self.state = state
        self.queue = queue
        # renewals, sweeps, purges: on an engine of its own once keeping
        self.lease_stores = state.stores
        self._keeper: asyncio.Task[None] | None = None
        self._hooked: dict[int, tuple[Any, Any]] = {}

    async def start(self) -> None:
        if self._keeper is None:
            self.lease_stores = self._own_connection()
            self._keeper = asyncio.create_task(self._keep_leases(), name="carryover-leases")
            self._hook_signals()

    def _own_connection(self) -> Stores:
        """The stores on a connection of the keeper's own.

        Under load every connection of the shared pool is taken and hundreds of requests queue
        for one; a renewal queued behind them comes too late, and the runs' leases expire while
        the runs are alive. (An in-memory SQLite database is one per connection: shared then.)
        """
        url = self.state.stores.engine.url
        if url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:"):
            return self.state.stores
        return Stores(make_engine(url, pool_size=1, max_overflow=0), self.state.clock)

    async def aclose(self) -> None:
        """Cancel this process's runs (they are recorded ``cancelled``) and stop the keeper."""
        self.shutdown()
        await self.queue.drain()  # a run a claim starts now ends cancelled
        for active in list(self.state.active.values()):
            if active.task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await active.task
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
            self._keeper = None
        if self.lease_stores is not self.state.stores:
            await self.lease_stores.engine.dispose()
            self.lease_stores = self.state.stores
        self._unhook_signals()

    def shutdown(self) -> None:
        """Stop: refuse new runs and cancel the ones in flight (each is recorded cancelled)."""
        state = self.state
        if not state.closing and state.active:
            log.info("stopping: cancelling %d run(s) in flight", len(state.active))
        state.closing = True
        for active in list(state.active.values()):
            state.stop(active)
        self.queue.wake_all()

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

    async def sweep_retention(self) -> int:
        """Delete expired conversations (docs/conversations.md, "Retention") in batches of
        ``retention_sweep_batch``, at most :data:`SWEEP_BATCHES` batches per call; how many."""
        total = 0
        for _ in range(SWEEP_BATCHES):
            deleted = await self.lease_stores.conversations.sweep_expired(
                default_seconds=self.state.settings.retention_seconds,
                batch=self.state.settings.retention_sweep_batch,
            )
            total += deleted
            if deleted < self.state.settings.retention_sweep_batch:
                break
        if total:
            log.info("retention: deleted %d expired conversation(s)", total)
        versions = 0
        for _ in range(SWEEP_BATCHES):  # earlier versions past their retention
            swept = await self.lease_stores.versions.sweep_old_versions(
                seconds=self.state.settings.version_retention_seconds,
                batch=self.state.settings.retention_sweep_batch,
            )
            versions += swept
            if swept < self.state.settings.retention_sweep_batch:
                break
        if versions:
            log.info("retention: deleted %d context version(s) past retention", versions)
        return total

    async def _keep_leases(self) -> None:
        purged = swept = self.state.clock.monotonic()
        purge_every = min(PURGE_EVERY, float(self.state.settings.idempotency_ttl_seconds))
        # After the database failed, dead processes are swept again only once every live one
        # had ticks to renew its leases: a lease that expired during the outage belongs to a
        # run that may be alive (and finishing) elsewhere (docs/faults.md). The grace counts
        # from the pass that found the database back, not from the last failed one (up to a
        # tick before the return: the grace then left the others no tick of their own).
        sweep_after: float | None = None
        down = False  # a pass failed on the database, none reached it since
        while True:
            await asyncio.sleep(self.state.tick)
            try:
                # Bounded: a database call that hangs must not stop the keeping. (asyncio.timeout,
                # not wait_for: Python 3.11's wait_for can swallow the keeper's cancellation.)
                async with asyncio.timeout(self.state.settings.lease_seconds):
                    renewed = await self._renew()
                    if down and not renewed:  # no run to renew: ask the database itself
                        await self.lease_stores.leases.ping()
                now = self.state.clock.monotonic()
                if down:
                    down = False
                    sweep_after = now + SWEEP_GRACE_TICKS * self.state.tick
                if sweep_after is None or now >= sweep_after:
                    sweep_after = None
                    async with asyncio.timeout(self.state.settings.lease_seconds):
                        interrupted = await self.lease_stores.leases.interrupt_expired(
                            alive=set(self.state.active)
                        )
                    if interrupted:
                        log.warning("marked %d run(s) of a dead process interrupted", interrupted)
                        observe_interrupted(interrupted)
                # app/service/queue.py: renew the holds of waiting requests; start the next
                # queued runs (not during the grace: a claim interrupts an expired holder)
                async with asyncio.timeout(self.state.settings.lease_seconds):
                    await self.queue.sweep(self.lease_stores, claim=sweep_after is None)
                if now - purged >= purge_every:
                    purged = now
                    await self.lease_stores.idempotency.purge_idempotency_keys()
                    await self.lease_stores.events.purge_events(
                        self.state.settings.event_retention_seconds
                    )
                if now - swept >= self.state.settings.retention_sweep_seconds:
                    swept = now
                    await self.sweep_retention()
            except Exception as exc:  # the database may be away for a while: next tick
                down = True
                fault = classify(exc)
                if fault is None and not isinstance(exc, TimeoutError):
                    log.exception("lease keeping failed")
                else:
                    what = fault.kind if fault is not None else "timeout"
                    log.warning("lease keeping failed (database %s); trying again", what)

    async def _renew(self) -> bool:
        """Renew the leases of this process's runs; False when it has none (nothing asked)."""
        ids = list(self.state.active)  # finishing ones too: recording may take a while
        if not ids:
            return False
        renewal = await self.lease_stores.leases.renew_leases(
            ids, owner=self.state.owner, lease_seconds=self.state.settings.lease_seconds
        )
        for run_id in ids:
            active = self.state.active.get(run_id)
            if active is None:
                continue
            if run_id not in renewal.renewed:
                if active.finishing:
                    continue  # it finished (or is finishing) meanwhile
                log.warning(
                    "run %s lost its lease (marked interrupted elsewhere); stopping it", run_id
                )
                self.state.stop(active)
            elif run_id in renewal.cancel_requested:
                self.state.stop(active)
        return True


__all__ = ["PURGE_EVERY", "SHUTDOWN_SIGNALS", "SWEEP_GRACE_TICKS", "LeaseKeeper"]
