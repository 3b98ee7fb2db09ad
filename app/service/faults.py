"""What the run service does when the database fails (docs/faults.md).

- :class:`DatabaseDown`: a refusal answered ``503 database-unavailable`` with ``Retry-After``,
  from a :class:`~app.store.faults.DbFault`.
- :class:`OutcomeNotStored`: a run finished but its outcome could not be written within
  ``outcome_retry_seconds``: the client is told so (503, ``stored: false``), and the run record
  is then marked ``interrupted`` with a reason naming the outage once the database is back
  (:meth:`app.store.leases.LeaseStore.mark_unstored`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from app.clock import Clock
from app.errors import CarryoverError
from app.store.faults import DbFault, retry_transient

log = logging.getLogger(__name__)

T = TypeVar("T")


class DatabaseDown(CarryoverError):
    """The database could not be used: 503 ``database-unavailable`` with ``Retry-After``."""

    slug = "database-unavailable"
    status = 503

    def __init__(self, fault: DbFault, detail: str | None = None, **extras: object) -> None:
        super().__init__(
            detail or f"the database is not available ({fault.kind.replace('_', ' ')})",
            headers={"Retry-After": str(fault.retry_after)},
            **extras,
        )
        self.fault = fault


class OutcomeNotStored(DatabaseDown):
    """A run ended, but its outcome could not be written: nothing of it is stored."""

    def __init__(self, run_id: str, status: str, fault: DbFault, waited: float) -> None:
        super().__init__(
            fault,
            f"run {run_id} ended {status}, but its outcome could not be stored: the database "
            f"stayed unavailable ({fault.kind.replace('_', ' ')}) for {waited:.0f} s. Nothing "
            "of the run is stored (the prompts neither); the run is recorded interrupted once "
            "the database is back. Send the prompts again then.",
            run_id=run_id,
            stored=False,
        )
        self.run_id = run_id
        self.run_status = status
        self.waited = waited


async def retry_write(
    run_id: str, write: Callable[[], Awaitable[T]], *, seconds: float, clock: Clock
) -> T:
    """A write of a run's outcome (idempotent under its lease fence), retried with backoff
    while the database fails transiently, for at most ``seconds``."""

    def on_retry(fault: DbFault, attempt: int, delay: float) -> None:
        log.warning(
            "recording run %s failed (%s: %s); trying again in %.2f s (attempt %d)",
            run_id,
            fault.kind,
            fault.detail,
            delay,
            attempt,
        )

    return await retry_transient(
        write,
        attempts=None if seconds > 0 else 1,
        deadline=seconds if seconds > 0 else None,
        max_delay=1.0,
        clock=clock.monotonic,
        on_retry=on_retry,
    )


def outage_reason(exc: OutcomeNotStored) -> dict[str, object]:
    """The ``error`` of a run whose outcome could not be stored."""
    return {
        "kind": "internal",
        "message": (
            f"the run ended {exc.run_status} but its outcome could not be stored: the database "
            f"was unavailable ({exc.fault.kind.replace('_', ' ')}) for {exc.waited:.0f} s"
        ),
        "status": None,
        "code": "database_unavailable",
    }


__all__ = [
    "DatabaseDown",
    "OutcomeNotStored",
    "outage_reason",
    "retry_write",
]
