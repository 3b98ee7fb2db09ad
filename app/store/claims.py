"""Claiming the head of a conversation's queue (docs/runs.md "Queued runs"), under the
conversation's lock, in the transaction that starts the run: who may start it (held or
background, waiters that gave up dropped on the way), and its admission as for a direct start
(the tenant's quota, the caller's pre-check of its request): see :mod:`app.store.queue`."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.agent.messages import Context
from app.clock import Clock
from app.errors import CarryoverError

from ._sql import child_key, conversation_key, read_context
from ._turns import answer_async, drop_queued, fail_queued, queued, take_free
from .changes import StoredPending
from .errors import StoredDataDamaged
from .quotas import QuotaExceeded, count_start, refusal
from .runs import Refusal, StartedRun
from .tables import Conversation, Run, conversations, runs

ClaimCheck = Callable[[Run, Context, StoredPending], None]
"""The pre-check of a queued run when its turn comes: the run's row, the context it would run
on and its pending calls as the conversation row stores them; what it raises (a
:class:`CarryoverError`) refuses the run (client tools and approvals: app/service/pending.py)."""


async def lock_conversation(
    conn: AsyncConnection, tenant: str, conv_id: str, clock: Clock
) -> tuple[Conversation, datetime] | None:
    """The conversation's row, locked (PostgreSQL; SQLite writers are serialised), and the time
    once the lock is held: waiting for it must not eat into a lease. None when it is gone."""
    stmt = select(conversations).where(*conversation_key(tenant, conv_id))
    if conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update()
    found = (await conn.execute(stmt)).mappings().first()
    if found is None:
        return None
    return Conversation.model_construct(**found), clock.now()


async def claim_head(
    conn: AsyncConnection,
    conv: Conversation,
    now: datetime,
    *,
    owner: str,
    lease_seconds: float,
    mine: str | None,
    check: ClaimCheck | None = None,
    reject: bool = False,
) -> StartedRun | None:
    """Under the conversation's lock: start the head of its queue if it is this process's to
    start (see the module's docstring), dropping waiters that gave up on the way, and admit
    it — or refuse it and go on with the next (``reject``: ``mine`` does not wait for a
    ``concurrent_runs`` slot)."""
    tenant, conv_id = conv.tenant, conv.id
    busy, interrupted = await take_free(conn, tenant, conv_id, conv.active_run_id, now)
    if busy is not None:
        return None
    refused: list[Refusal] = []
    loaded = None

    def nothing(deferred: QuotaExceeded | None = None) -> StartedRun | None:
        if interrupted is None and not refused and deferred is None:
            return None
        return StartedRun(interrupted=interrupted, refused=tuple(refused), deferred=deferred)

    while True:
        head = (
            (
                await conn.execute(
                    select(runs).where(*queued(tenant, conv_id)).order_by(runs.c.queue_seq).limit(1)
                )
            )
            .mappings()
            .first()
        )
        if head is None:
            return nothing()
        held = head["lease_owner"] is not None
        alive = held and head["lease_expires_at"] is not None and head["lease_expires_at"] > now
        gave_up = head["wait_until"] is not None and head["wait_until"] <= now
        if head["run_id"] != mine and (gave_up or (head["wait_until"] is not None and not alive)):
            await drop_queued(conn, tenant, conv_id, head["run_id"])
            continue
        if alive and head["run_id"] != mine:
            return nothing()  # its holder starts it
        if held and not alive:  # its client's process died: it is a background run now
            await answer_async(conn, tenant, conv_id, head["run_id"])
        # Admission, as for a direct start (app/store/runs.py): the quota first, then the
        # pre-check of the request on the context it would run on.
        is_mine = head["run_id"] == mine
        error: CarryoverError | None = await refusal(conn, tenant, now)
        if (
            isinstance(error, QuotaExceeded)
            and error.limit == "concurrent_runs"
            and not (reject and is_mine)
        ):
            return nothing(deferred=error)  # waited out: one of the tenant's runs ends soon
        if error is None and loaded is None:
            try:
                loaded = await read_context(conn, conv)
            except StoredDataDamaged as exc:  # nothing runs on a damaged context
                error = exc
        if error is None and check is not None:
            assert loaded is not None
            try:
                check(Run.model_construct(**head), loaded.context, conv.pending_calls)
            except CarryoverError as exc:
                error = exc
        if error is None:
            break
        refused.append(Refusal(tenant, conv_id, head["run_id"], head["agent"], error, is_mine))
        if is_mine:  # its request answers the refusal; nothing of it stays
            await drop_queued(conn, tenant, conv_id, head["run_id"])
            mine = None  # the queue goes on: a background run after it may start here
        else:
            await fail_queued(conn, tenant, conv_id, head["run_id"], refusal_error(error), now)
    await count_start(conn, tenant, now)
    claimed_values = {
        "status": "running",
        "base_etag": conv.etag,
        "lease_owner": owner,
        "lease_expires_at": now + timedelta(seconds=lease_seconds),
        "queue_seq": None,
        "wait_until": None,
        "started_at": now,
    }
    await conn.execute(
        update(runs)
        .where(
            *child_key(runs, tenant, conv_id),
            runs.c.run_id == head["run_id"],
            runs.c.status == "queued",
        )
        .values(claimed_values)
    )
    await conn.execute(
        update(conversations)
        .where(*conversation_key(tenant, conv_id))
        .values(active_run_id=head["run_id"])
    )
    if loaded is None:
        loaded = await read_context(conn, conv)
    run = Run.model_construct(**{**head, **claimed_values})
    return StartedRun(run=run, loaded=loaded, interrupted=interrupted, refused=tuple(refused))


def refusal_error(error: CarryoverError) -> dict[str, Any]:
    """The ``error`` of a background run refused when its turn came: ``code`` is the slug of
    the problem a direct start would have answered (``quota_exceeded``,
    ``tool_results_required``, ``unexpected_tool_answer``, …), ``message`` its detail."""
    return {
        "kind": "fatal",
        "message": f"refused when its turn came, nothing ran: {error.detail}",
        "status": None,
        "code": error.slug.replace("-", "_"),
    }


__all__ = ["ClaimCheck", "claim_head", "lock_conversation", "refusal_error"]
