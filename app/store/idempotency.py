"""Idempotency keys of run requests (contract §4): claimed with the run's lease, answered once the
run's outcome is recorded, kept for ``idempotency_ttl_seconds`` and then purged."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from ._sql import StoreBase, child_key
from .db import write_transaction
from .errors import IdempotencyInFlight, IdempotencyMismatch
from .tables import idempotency_keys, runs


@dataclass(frozen=True)
class IdempotencyClaim:
    """An ``Idempotency-Key`` presented with a run request."""

    key: str
    request_hash: str
    ttl_seconds: int
    #: the request's hash in the form of keys stored before ``request_hash``'s (a bare hex
    #: digest, without the ``json-sha256:`` prefix): such a key is compared in it
    legacy_hash: str | None = None

    def matches(self, stored: str) -> bool:
        """Whether a stored key's hash is this request's."""
        if stored == self.request_hash:
            return True
        legacy = ":" not in stored  # stored before the hash named its form
        return legacy and self.legacy_hash is not None and stored == self.legacy_hash


@dataclass(frozen=True)
class IdempotentReplay:
    """The stored first answer to a request with the same key and body."""

    run_id: str | None
    status_code: int
    response: dict[str, Any]


async def _run_finished(conn: AsyncConnection, tenant: str, conv_id: str, run_id: str) -> bool:
    status = (
        await conn.execute(
            select(runs.c.status).where(*child_key(runs, tenant, conv_id), runs.c.run_id == run_id)
        )
    ).scalar_one_or_none()
    return status is None or status != "running"


async def claimed(
    conn: AsyncConnection, tenant: str, conv_id: str, claim: IdempotencyClaim, now: datetime
) -> IdempotentReplay | None:
    """What a key seen before means: the stored answer, a refusal, or (expired) nothing.

    A key is expired once past its retention and no longer in flight: answered, or its run
    finished without an answer being kept (its process died in between).
    """
    key = [*child_key(idempotency_keys, tenant, conv_id), idempotency_keys.c.key == claim.key]
    row = (await conn.execute(select(idempotency_keys).where(*key))).mappings().first()
    if row is None:
        return None
    if row["expires_at"] <= now and (
        row["response"] is not None or await _run_finished(conn, tenant, conv_id, row["run_id"])
    ):
        await conn.execute(delete(idempotency_keys).where(*key))
        return None
    if not claim.matches(row["request_hash"]):
        raise IdempotencyMismatch(
            f"Idempotency-Key {claim.key!r} was used with a different request body"
        )
    if row["response"] is None:
        raise IdempotencyInFlight(
            f"the request with Idempotency-Key {claim.key!r} is still running",
            run_id=row["run_id"],
        )
    return IdempotentReplay(
        run_id=row["run_id"], status_code=int(row["status_code"]), response=row["response"]
    )


async def insert_claim(
    conn: AsyncConnection,
    tenant: str,
    conv_id: str,
    run_id: str,
    claim: IdempotencyClaim,
    now: datetime,
) -> None:
    await conn.execute(
        insert(idempotency_keys).values(
            tenant=tenant,
            conversation_id=conv_id,
            key=claim.key,
            request_hash=claim.request_hash,
            run_id=run_id,
            status_code=None,
            response=None,
            created_at=now,
            expires_at=now + timedelta(seconds=claim.ttl_seconds),
        )
    )


class IdempotencyStore(StoreBase):
    async def keep_answer(
        self,
        tenant: str,
        conv_id: str,
        run_id: str,
        *,
        status_code: int,
        response: dict[str, Any],
    ) -> bool:
        """Keep the answer to the idempotent request that started ``run_id`` (after its outcome
        was recorded), for repeats to replay; False when there is no key for the run."""
        async with write_transaction(self.engine) as conn:
            done = await conn.execute(
                update(idempotency_keys)
                .where(
                    *child_key(idempotency_keys, tenant, conv_id),
                    idempotency_keys.c.run_id == run_id,
                )
                .values(status_code=status_code, response=response)
            )
        return bool(done.rowcount)

    async def purge_idempotency_keys(self) -> int:
        """Delete idempotency keys past their retention: answered ones, and ones whose run
        finished without an answer being kept. Keys of runs still in flight stay until their
        answer is kept; a dead run's key is released when the run is interrupted."""
        finished = (
            select(runs.c.run_id)
            .where(
                runs.c.tenant == idempotency_keys.c.tenant,
                runs.c.conversation_id == idempotency_keys.c.conversation_id,
                runs.c.run_id == idempotency_keys.c.run_id,
                runs.c.status != "running",
            )
            .exists()
        )
        async with write_transaction(self.engine) as conn:
            done = await conn.execute(
                delete(idempotency_keys).where(
                    idempotency_keys.c.expires_at < self.clock.now(),
                    idempotency_keys.c.response.is_not(None) | finished,
                )
            )
        return int(done.rowcount or 0)


__all__ = ["IdempotencyClaim", "IdempotencyStore", "IdempotentReplay", "claimed", "insert_claim"]
