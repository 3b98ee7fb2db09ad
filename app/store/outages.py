"""What the run service records about database outages (docs/faults.md): the end of a run
whose outcome could not be stored."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import delete, select, update

from ._sql import StoreBase, child_key, conversation_key
from .db import write_transaction
from .tables import conversations, idempotency_keys, runs


async def mark_unstored(
    store: StoreBase, tenant: str, conv_id: str, run_id: str, owner: str, error: dict[str, Any]
) -> bool:
    """Mark a run this process still owns ``interrupted`` with ``error``, free its
    conversation and release its idempotency key (as a dead process's run). One transaction;
    False when the run was no longer this process's running run (nothing changed)."""
    now: datetime = store.clock.now()
    async with write_transaction(store.engine) as conn:
        if conn.dialect.name == "postgresql":  # lock order: the conversation row first
            await conn.execute(
                select(conversations.c.id)
                .where(*conversation_key(tenant, conv_id))
                .with_for_update()
            )
        marked = await conn.execute(
            update(runs)
            .where(
                *child_key(runs, tenant, conv_id),
                runs.c.run_id == run_id,
                runs.c.status == "running",
                runs.c.lease_owner == owner,
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


__all__ = ["mark_unstored"]
