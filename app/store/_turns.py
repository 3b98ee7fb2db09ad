"""Whose turn it is on a conversation: the statements shared by starting a run
(:mod:`.runs`) and the run queue (:mod:`.queue`).

A conversation is *free* when no run holds it under a live lease (a holder whose lease expired
is marked ``interrupted`` on the way). Its *queue* is its runs with status ``queued``, in
``queue_seq`` order; ``queue_seq`` is set only while a run is queued, so the queue is a range
of the ``ix_runs_queue`` index however many runs the conversation had.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BindParameter, and_, bindparam, delete, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from ._sql import bound_child_key, child_key
from .events import EventRow, insert_events
from .leases import interrupt
from .tables import idempotency_keys, runs
from .webhooks import enqueue_deliveries

#: the answer kept for an Idempotency-Key of a run whose request did not wait for it (a
#: background run, or one whose client went away while it was queued): a repeat answers the
#: run's record as it is then
ASYNC_ANSWER_KEY = "respond_async"


def async_answer(run_id: str) -> dict[str, Any]:
    return {ASYNC_ANSWER_KEY: True, "run_id": run_id}


async def take_free(
    conn: AsyncConnection, tenant: str, conv_id: str, active_run_id: str | None, now: datetime
) -> tuple[str | None, str | None]:
    """``(busy_with, interrupted)``: the run holding the conversation under a live lease (None
    when free), and the run of a dead process that was marked ``interrupted`` to free it."""
    if active_run_id is None:
        return None, None
    holder = (
        await conn.execute(
            select(runs.c.status, runs.c.lease_expires_at).where(
                *child_key(runs, tenant, conv_id), runs.c.run_id == active_run_id
            )
        )
    ).first()
    if holder is None or holder.status != "running":
        return None, None
    expired = holder.lease_expires_at is None or holder.lease_expires_at <= now
    # The holder may renew its lease meanwhile: the interrupt is conditional.
    if not expired or not await interrupt(conn, tenant, conv_id, active_run_id, now):
        return active_run_id, None
    return None, active_run_id


def queued(tenant: str, conv_id: str) -> list[Any]:
    """The conversation's queue (an ``ix_runs_queue`` range)."""
    return [*child_key(runs, tenant, conv_id), runs.c.queue_seq.is_not(None)]


def live(now: datetime | BindParameter[Any]) -> Any:
    """A queued run that may still run: not a waiter that gave up or whose process died."""
    return or_(
        runs.c.wait_until.is_(None),
        and_(runs.c.wait_until > now, runs.c.lease_expires_at > now),
    )


async def queue_ahead(
    conn: AsyncConnection, tenant: str, conv_id: str, now: datetime
) -> str | None:
    """The first queued run that may still run, if any: a new request does not overtake it."""
    found: str | None = (
        await conn.execute(
            select(runs.c.run_id)
            .where(*queued(tenant, conv_id), live(now))
            .order_by(runs.c.queue_seq)
            .limit(1)
        )
    ).scalar_one_or_none()
    return found


def queue_head_by_parameters() -> Any:
    """:func:`queue_ahead` as a scalar subquery labelled ``queue_head``, on bound parameters
    ``tenant``, ``conv_id`` and ``now``: read with the conversation's row, in the statement
    that locks it, built once (app/store/runs.py)."""
    return (
        select(runs.c.run_id)
        .where(
            *bound_child_key(runs),
            runs.c.queue_seq.is_not(None),
            live(bindparam("now")),
        )
        .order_by(runs.c.queue_seq)
        .limit(1)
        .scalar_subquery()
        .label("queue_head")
    )


async def next_queue_seq(conn: AsyncConnection, tenant: str, conv_id: str) -> int:
    """The arrival number of a run joining the queue (under the conversation's lock)."""
    last = (
        await conn.execute(select(func.max(runs.c.queue_seq)).where(*queued(tenant, conv_id)))
    ).scalar_one_or_none()
    return int(last or 0) + 1


async def drop_queued(conn: AsyncConnection, tenant: str, conv_id: str, run_id: str) -> bool:
    """Remove a queued run that will never run because its request gave up (``if_busy: wait``
    past its bound, or its client's process died): the row and its idempotency key go, as if
    the request had been refused. False when it is no longer queued."""
    key = [*child_key(runs, tenant, conv_id), runs.c.run_id == run_id]
    gone = await conn.execute(delete(runs).where(*key, runs.c.status == "queued"))
    if not gone.rowcount:
        return False
    await conn.execute(
        delete(idempotency_keys).where(
            *child_key(idempotency_keys, tenant, conv_id), idempotency_keys.c.run_id == run_id
        )
    )
    return True


async def answer_async(conn: AsyncConnection, tenant: str, conv_id: str, run_id: str) -> None:
    """Keep :func:`async_answer` for the run's Idempotency-Key, unless an answer is kept."""
    await conn.execute(
        update(idempotency_keys)
        .where(
            *child_key(idempotency_keys, tenant, conv_id),
            idempotency_keys.c.run_id == run_id,
            idempotency_keys.c.response.is_(None),
        )
        .values(status_code=202, response=async_answer(run_id))
    )


async def cancel_queued(
    conn: AsyncConnection, tenant: str, conv_id: str, run_id: str, now: datetime
) -> bool:
    """A queued run that is cancelled ends ``cancelled`` without running (nothing stored, no
    transcript entry: its prompts were never admitted). False when it is not queued."""
    error = {
        "kind": "aborted",
        "message": "the run was cancelled while queued; it never ran",
        "status": None,
        "code": "cancelled_queued",
    }
    return await _end_queued(conn, tenant, conv_id, run_id, "cancelled", error, now)


async def _end_queued(
    conn: AsyncConnection,
    tenant: str,
    conv_id: str,
    run_id: str,
    status: str,
    error: dict[str, Any],
    now: datetime,
) -> bool:
    """End a run that is still queued with ``status`` and ``error``, out of the queue and
    holding nothing, and answer its waiting Idempotency-Key; False when it is not queued."""
    done = await conn.execute(
        update(runs)
        .where(
            *child_key(runs, tenant, conv_id), runs.c.run_id == run_id, runs.c.status == "queued"
        )
        .values(
            status=status,
            finished_at=now,
            error=error,
            queue_seq=None,
            wait_until=None,
            lease_owner=None,
            lease_expires_at=None,
        )
    )
    if not done.rowcount:
        return False
    await answer_async(conn, tenant, conv_id, run_id)
    return True


async def fail_queued(
    conn: AsyncConnection,
    tenant: str,
    conv_id: str,
    run_id: str,
    error: dict[str, Any],
    now: datetime,
) -> bool:
    """A background queued run refused when its turn came (a spent quota, a client-tool
    pre-check) ends ``failed`` without running, with ``error`` (its problem): nothing stored,
    no transcript entry (its prompts were never admitted). Like any end, its ``run.finished``
    event and the deliveries of ``run.failed`` are written with it; its Idempotency-Key
    answers its record. False when it is not queued."""
    if not await _end_queued(conn, tenant, conv_id, run_id, "failed", error, now):
        return False
    await insert_events(conn, [EventRow(tenant, conv_id, run_id, 1, "run.finished", None, now)])
    await enqueue_deliveries(conn, tenant, conv_id, run_id, "failed", now)
    return True


__all__ = [
    "ASYNC_ANSWER_KEY",
    "answer_async",
    "async_answer",
    "cancel_queued",
    "drop_queued",
    "fail_queued",
    "live",
    "next_queue_seq",
    "queue_ahead",
    "queue_head_by_parameters",
    "queued",
    "take_free",
]
