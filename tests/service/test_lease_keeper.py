"""The lease keeper's sweep grace after a database outage (docs/faults.md, "Sweep grace"), pass
by pass: the keeper runs against a scripted lease store, and the clock moves one tick per pass.

Another process renews its runs' leases at its first tick after the database is back, and its
ticks may fall up to one tick after this process's. So this process must not sweep until
SWEEP_GRACE_TICKS ticks after the database *answered it again*: counted from its last failed
pass, as before, the sweep could come one tick after the return, before the other process's
renewal, and mark its finished run (its outcome write being retried) ``interrupted``.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace
from typing import Any

from app.clock import ManualClock
from app.config import Settings
from app.service.agents import AgentPool
from app.service.leases import SWEEP_GRACE_TICKS
from app.service.runs import RunManager
from app.store.leases import Renewal
from tests.repository import Repository

from ..helpers import HANG_GUARD_SECONDS

#: a tick of 2**-6 s (lease / 3): the manual clock adds it up exactly
LEASE = 3 / 64


class ScriptedLeases:
    """The keeper's store: pass ``n`` (from 1) fails on the database when ``n`` is in
    ``down``; each pass moves ``clock`` one tick; the passes that swept are recorded."""

    def __init__(self, clock: ManualClock, tick: float, down: set[int], passes: int) -> None:
        self.clock = clock
        self.tick = tick
        self.down = down
        self.passes = passes
        self.n = 0
        self.swept: list[int] = []
        self.done = asyncio.Event()

    def _answer(self) -> None:
        if self.n in self.down:
            raise ConnectionRefusedError(111, "Connect call failed")

    async def renew_leases(self, run_ids: Any, *, owner: str, lease_seconds: float) -> Renewal:
        self.n += 1  # every pass begins with a renewal: this process has a run
        self.clock.advance(self.tick)
        if self.n >= self.passes:
            self.done.set()
        self._answer()
        return Renewal(renewed=frozenset(run_ids), cancel_requested=frozenset())

    async def interrupt_expired(self, *, alive: Any = ()) -> int:
        self._answer()
        self.swept.append(self.n)
        return 0

    async def ready_queues(self, **_: Any) -> list[tuple[str, str]]:
        self._answer()
        return []

    async def ping(self) -> None:
        self._answer()


async def _passes(down: set[int], passes: int) -> list[int]:
    """The passes that swept, of ``passes`` keeper passes, the database away in ``down``."""
    clock = ManualClock()
    settings = Settings(lease_seconds=LEASE)
    manager = RunManager(None, AgentPool(settings), settings, clock)  # type: ignore[arg-type]
    store = ScriptedLeases(clock, manager.state.tick, down, passes)
    manager.keeper.lease_stores = SimpleNamespace(leases=store, queue=store)  # type: ignore[assignment]
    manager.active["its-run"] = None  # type: ignore[assignment]  # renewed: never finishing
    keeper = asyncio.create_task(manager.keeper._keep_leases())
    try:
        await asyncio.wait_for(store.done.wait(), HANG_GUARD_SECONDS)
    finally:
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeper
    return [n for n in store.swept if n < passes]


async def test_no_sweep_until_the_grace_after_the_database_answers_again() -> None:
    assert SWEEP_GRACE_TICKS == 2
    # passes 3 and 4 fail (the database away); pass 5 is the first that reaches it again
    swept = await _passes(down={3, 4}, passes=10)
    # passes 5 and 6 are the grace: the other processes renew meanwhile
    assert swept == [1, 2, 7, 8, 9], swept


async def test_a_longer_outage_is_graced_from_its_end() -> None:
    # passes 2 to 6 fail; pass 7 reaches the database again, passes 7 and 8 are the grace
    swept = await _passes(down={2, 3, 4, 5, 6}, passes=12)
    assert swept == [1, 9, 10, 11], swept


async def test_the_keepers_ping_is_one_round_trip(repo: Repository) -> None:
    await repo.ping()  # a keeper without runs asks this before its grace begins
