"""Run leases (contract §4): a running run's lease is renewed by its process; a lease that expired
means the process died, and its run is marked ``interrupted`` (by a sweep, or by the next run
that takes the conversation over)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, and_, delete, literal, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from ._sql import StoreBase, child_key, conversation_key
from .db import read_one, write_transaction
from .tables import conversations, idempotency_keys, runs
from .webhooks import enqueue_deliveries


@dataclass(frozen=True)
class Renewal:
    """What :meth:`LeaseStore.renew_leases` found."""

    renewed: frozenset[str]  # runs still running under this owner, leases extended
    cancel_requested: frozenset[str]  # of those, the ones another replica asked to cancel


#: the ``error`` of a run whose process died
WENT_AWAY: dict[str, Any] = {
    "kind": "internal",
    "message": "the process running this run went away",
    "status": None,
    "code": "interrupted",
}


async def _mark_interrupted(
    conn: AsyncConnection,
    tenant: str,
    conv_id: str,
    run_id: str,
    now: datetime,
    *,
    holds: ColumnElement[bool],
    error: dict[str, Any],
) -> bool:
    """The four statements that interrupt a run: ``interrupted`` with ``error``, nothing
    stored, its conversation freed, its idempotency key released (an idempotent request whose
    run ended so may be sent again). Conditional on the run still ``running`` and ``holds``
    (PostgreSQL re-checks that on the current row when a renewal or the run's own finish
    committed meanwhile); False when it did not hold, and then nothing is changed."""
    if conn.dialect.name == "postgresql":
        # Lock order: the conversation row first, then the run row (as start_run and
        # finish_run take them), so that an interrupt never deadlocks with either.
        await conn.execute(
            select(conversations.c.id).where(*conversation_key(tenant, conv_id)).with_for_update()
        )
    marked = await conn.execute(
        update(runs)
        .where(
            *child_key(runs, tenant, conv_id),
            runs.c.run_id == run_id,
            runs.c.status == "running",
            holds,
        )
        .values(status="interrupted", finished_at=now, lease_expires_at=None, error=error)
    )
    if not marked.rowcount:
        return False
    await conn.execute(
        update(conversations)
        .where(*conversation_key(tenant, conv_id), conversations.c.active_run_id == run_id)
        .values(active_run_id=None)
    )
    await conn.execute(
        delete(idempotency_keys).where(
            *child_key(idempotency_keys, tenant, conv_id),
            idempotency_keys.c.run_id == run_id,
            idempotency_keys.c.response.is_(None),
        )
    )
    return True


async def interrupt(
    conn: AsyncConnection, tenant: str, conv_id: str, run_id: str, now: datetime
) -> bool:
    """A run whose process died: ``interrupted``, nothing stored, conversation freed.

    Conditional on the run still running with its lease expired; False when it did not hold,
    and then nothing is changed.
    """
    expired = or_(runs.c.lease_expires_at.is_(None), runs.c.lease_expires_at <= now)
    if not await _mark_interrupted(
        conn, tenant, conv_id, run_id, now, holds=expired, error=WENT_AWAY
    ):
        return False
    await enqueue_deliveries(conn, tenant, conv_id, run_id, "interrupted", now)
    return True


class LeaseStore(StoreBase):
    async def lease_holder(self, tenant: str, conv_id: str) -> str | None:
        """The run holding the conversation under a live lease; None when it is free, the lease
        expired, or the conversation is gone. A read: requests waiting for the conversation
        (``if_busy: wait``) poll it, and only try to take the lease when it looks free."""
        holder = and_(
            runs.c.tenant == conversations.c.tenant,
            runs.c.conversation_id == conversations.c.id,
            runs.c.run_id == conversations.c.active_run_id,
        )
        rows = await read_one(
            self.engine,
            select(conversations.c.active_run_id, runs.c.status, runs.c.lease_expires_at)
            .select_from(conversations.outerjoin(runs, holder))
            .where(*conversation_key(tenant, conv_id)),
        )
        row = rows[0] if rows else None
        if row is None or row["active_run_id"] is None or row["status"] != "running":
            return None
        if row["lease_expires_at"] is None or row["lease_expires_at"] <= self.clock.now():
            return None
        active: str = row["active_run_id"]
        return active

    async def renew_leases(
        self, run_ids: Sequence[str], *, owner: str, lease_seconds: float
    ) -> Renewal:
        """Extend the leases of this process's running runs, in one statement for all of them.

        Returns which leases were renewed (a run missing from them is no longer this process's
        to finish: another process found its lease expired and marked it ``interrupted``) and
        which of the renewed runs another replica asked to cancel.
        """
        if not run_ids:
            return Renewal(renewed=frozenset(), cancel_requested=frozenset())
        async with write_transaction(self.engine) as conn:
            rows = (
                await conn.execute(
                    update(runs)
                    .where(
                        runs.c.run_id.in_(list(run_ids)),
                        runs.c.lease_owner == owner,
                        runs.c.status == "running",
                    )
                    .values(lease_expires_at=self.clock.now() + timedelta(seconds=lease_seconds))
                    .returning(runs.c.run_id, runs.c.cancel_requested)
                )
            ).all()
        return Renewal(
            renewed=frozenset(row.run_id for row in rows),
            cancel_requested=frozenset(row.run_id for row in rows if row.cancel_requested),
        )

    async def ping(self) -> None:
        """One round trip to the database (the lease keeper's: does it answer again?)."""
        await read_one(self.engine, select(literal(1)))

    async def interrupt_expired(self, *, alive: Collection[str] = ()) -> int:
        """Mark runs whose lease expired (their process died) ``interrupted``; free their
        conversations. Returns how many runs were marked.

        ``alive``: runs the caller is running itself and knows to be alive (a process never
        interrupts its own runs because its renewals were late; other processes may).
        """
        found = await read_one(
            self.engine,
            select(runs.c.tenant, runs.c.conversation_id, runs.c.run_id)
            .where(runs.c.status == "running", runs.c.lease_expires_at < self.clock.now())
            .order_by(runs.c.tenant, runs.c.conversation_id, runs.c.run_id),
        )
        expired = [row for row in found if row["run_id"] not in alive]
        marked = 0
        # One short transaction each: no transaction holds the locks of several conversations.
        for row in expired:
            async with write_transaction(self.engine) as conn:
                marked += await interrupt(
                    conn, row["tenant"], row["conversation_id"], row["run_id"], self.clock.now()
                )
        return marked

    async def mark_unstored(
        self, tenant: str, conv_id: str, run_id: str, owner: str, error: dict[str, Any]
    ) -> bool:
        """Mark a run this process still owns ``interrupted`` with ``error`` (its outcome could
        not be stored: docs/faults.md), as a dead process's run is, in one transaction; False
        when the run was no longer this process's running run (nothing changed)."""
        now: datetime = self.clock.now()
        async with write_transaction(self.engine) as conn:
            return await _mark_interrupted(
                conn, tenant, conv_id, run_id, now, holds=runs.c.lease_owner == owner, error=error
            )


__all__ = ["WENT_AWAY", "LeaseStore", "Renewal", "interrupt"]
