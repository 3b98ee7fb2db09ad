"""Time, injectable: every reader of the wall clock or the monotonic clock takes a :class:`Clock`.

The store reads :meth:`Clock.now` for leases, idempotency-key retention, the sweep of expired
runs and API-key timestamps; the run service reads :meth:`Clock.monotonic` for its deadlines
(``if_busy: wait``) and the purge interval. Production uses :data:`SYSTEM_CLOCK`; tests pass a
:class:`ManualClock` and move time forward instead of sleeping.

This module is below every layer (docs/architecture.md): it imports nothing of ``app``.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """The current time, timezone-aware, in UTC."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (only differences mean anything)."""
        ...


class SystemClock:
    """The machine's clocks."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()


SYSTEM_CLOCK: Clock = SystemClock()


class ManualClock:
    """A clock that moves only when told to (:meth:`advance`): for tests."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2030, 1, 1, tzinfo=UTC)
        if self._now.tzinfo is None:
            raise ValueError("a ManualClock starts at an aware datetime")
        self._monotonic = 1000.0

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._monotonic

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time does not go back")
        self._now += timedelta(seconds=seconds)
        self._monotonic += seconds


__all__ = ["SYSTEM_CLOCK", "Clock", "ManualClock", "SystemClock"]
