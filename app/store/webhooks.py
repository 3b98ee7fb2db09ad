"""Webhooks: endpoints an operator registered per tenant, and the outbox of their
deliveries.

A run's outcome and the deliveries it calls for are written in ONE transaction
(:func:`enqueue_deliveries`, called by :meth:`~app.store.runs.RunStore.finish_run` and by the
interrupt of a dead process's run), so a crash after the commit loses no delivery. Workers on
any replica claim due rows with a lease (PostgreSQL: ``FOR UPDATE SKIP LOCKED``; SQLite's
write transactions are serial), send them, and settle them: delivered, due again later
(exponential backoff), or failed after the last attempt.
"""

from __future__ import annotations

import base64
import json
import secrets
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    String,
    Text,
    bindparam,
    delete,
    func,
    insert,
    literal,
    literal_column,
    or_,
    select,
    type_coerce,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from ._sql import StoreBase
from .db import read_transaction, write_transaction
from .direct import prepared
from .tables import UTCDateTime, Webhook, WebhookDelivery, webhook_deliveries, webhooks

#: the events an endpoint can ask for: one per way a run ends
WEBHOOK_EVENTS = (
    "run.completed",
    "run.failed",
    "run.cancelled",
    "run.conflicted",
    "run.requires_action",
    "run.interrupted",
)
#: the longest wait between two attempts of a delivery
MAX_BACKOFF_SECONDS = 3600.0


def new_secret() -> str:
    """A Standard Webhooks signing secret: ``whsec_`` and 32 random bytes in base64."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def _like_escaped(text: str) -> str:
    """``text`` for the middle of a ``LIKE … ESCAPE '/'`` pattern, its wildcards escaped."""
    return text.replace("/", "//").replace("%", "/%").replace("_", "/_")


_ANY = literal_column("'%'", String())


def _deliveries_insert() -> Any:
    """One delivery per endpoint of ``:tenant`` whose events match ``:pattern``, as one
    ``INSERT … SELECT`` on bound parameters: built once, run in every run's outcome.

    The pattern is ``'%' || :pattern || '%'``, not a bound ``%…%``: SQLite re-prepares a
    statement whose ``LIKE`` pattern is a bare parameter each time it is bound (it may plan
    around the pattern's prefix), a parse of this whole statement in every run."""
    at = bindparam("b_at", type_=UTCDateTime())
    rows = select(
        (bindparam("b_id_prefix", type_=String()) + func.replace(webhooks.c.id, "-", "")).label(
            "id"
        ),
        webhooks.c.id,
        bindparam("b_tenant", type_=String()),
        bindparam("b_conv_id", type_=String()),
        bindparam("b_run_id", type_=String()),
        bindparam("b_event", type_=String()),
        literal("pending"),
        literal(0),
        at,
        at,
    ).where(
        webhooks.c.tenant == bindparam("b_tenant"),
        type_coerce(webhooks.c.events, Text).like(
            _ANY + bindparam("b_pattern", type_=String()) + _ANY, escape="/"
        ),
    )
    return insert(webhook_deliveries).from_select(
        [
            "id",
            "webhook_id",
            "tenant",
            "conversation_id",
            "run_id",
            "event",
            "status",
            "attempts",
            "next_attempt_at",
            "created_at",
        ],
        rows,
    )


_INSERT_DELIVERIES = prepared(_deliveries_insert())


async def enqueue_deliveries(
    conn: AsyncConnection, tenant: str, conv_id: str, run_id: str, status: str, now: datetime
) -> int:
    """In the caller's transaction: one delivery per endpoint of the tenant that asked for
    ``run.<status>``, as ONE ``INSERT … SELECT`` (no read-then-write in the outcome
    transaction; nothing inserted when the tenant has no endpoint). The delivery's id is
    ``msg_`` + the run's id + the endpoint's: one message per run and endpoint."""
    event = f"run.{status}"
    done = await conn.execute(
        _INSERT_DELIVERIES,
        {  # b_*: SQLAlchemy reserves column names in an INSERT
            "b_id_prefix": f"msg_{run_id.replace('-', '')}_",
            "b_tenant": tenant,
            "b_conv_id": conv_id,
            "b_run_id": run_id,
            "b_event": event,
            "b_at": now,
            "b_pattern": _like_escaped(json.dumps(event)),
        },
    )
    return int(done.rowcount or 0)


class WebhookStore(StoreBase):
    async def add_webhook(
        self, tenant: str, url: str, events: Sequence[str], *, allow_private: bool = False
    ) -> Webhook:
        """Register an endpoint. ``allow_private``: the operator's yes to a private, loopback
        or link-local address (else checked before each delivery: app/addresses.py)."""
        values: dict[str, Any] = {
            "id": str(uuid.uuid4()),
            "tenant": tenant,
            "url": url,
            "secret": new_secret(),
            "events": list(events),
            "created_at": self.clock.now(),
            "allow_private": allow_private,
        }
        async with write_transaction(self.engine) as conn:
            await conn.execute(insert(webhooks).values(values))
        return Webhook(**values)

    async def list_webhooks(self, tenant: str | None = None) -> list[Webhook]:
        stmt = select(webhooks).order_by(webhooks.c.tenant, webhooks.c.created_at)
        if tenant is not None:
            stmt = stmt.where(webhooks.c.tenant == tenant)
        async with read_transaction(self.engine) as conn:
            return [Webhook(**row) for row in (await conn.execute(stmt)).mappings()]

    async def get_webhook(self, webhook_id: str) -> Webhook | None:
        async with read_transaction(self.engine) as conn:
            row = (
                (await conn.execute(select(webhooks).where(webhooks.c.id == webhook_id)))
                .mappings()
                .first()
            )
        return Webhook(**row) if row is not None else None

    async def remove_webhook(self, webhook_id: str) -> bool:
        """Remove an endpoint (and its deliveries); False when there is none."""
        async with write_transaction(self.engine) as conn:
            done = await conn.execute(delete(webhooks).where(webhooks.c.id == webhook_id))
        return bool(done.rowcount)

    async def list_deliveries(
        self, *, webhook_id: str | None = None, tenant: str | None = None, limit: int = 50
    ) -> list[WebhookDelivery]:
        """The newest deliveries first."""
        stmt = select(webhook_deliveries).order_by(webhook_deliveries.c.created_at.desc())
        if webhook_id is not None:
            stmt = stmt.where(webhook_deliveries.c.webhook_id == webhook_id)
        if tenant is not None:
            stmt = stmt.where(webhook_deliveries.c.tenant == tenant)
        async with read_transaction(self.engine) as conn:
            rows = (await conn.execute(stmt.limit(limit))).mappings()
            return [WebhookDelivery(**row) for row in rows]

    async def claim_deliveries(
        self, owner: str, *, lease_seconds: float, limit: int
    ) -> list[tuple[WebhookDelivery, Webhook]]:
        """Take up to ``limit`` due deliveries (pending, next attempt reached, not leased by a
        live worker) with a lease, and their endpoints."""
        now = self.clock.now()
        due = (
            select(webhook_deliveries.c.id)
            .where(
                webhook_deliveries.c.status == "pending",
                webhook_deliveries.c.next_attempt_at <= now,
                or_(
                    webhook_deliveries.c.lease_expires_at.is_(None),
                    webhook_deliveries.c.lease_expires_at <= now,
                ),
            )
            .order_by(webhook_deliveries.c.next_attempt_at)
            .limit(limit)
        )
        async with write_transaction(self.engine) as conn:
            if conn.dialect.name == "postgresql":
                due = due.with_for_update(skip_locked=True)
            ids = [row.id for row in (await conn.execute(due)).all()]
            if not ids:
                return []
            await conn.execute(
                update(webhook_deliveries)
                .where(webhook_deliveries.c.id.in_(ids))
                .values(lease_owner=owner, lease_expires_at=now + timedelta(seconds=lease_seconds))
            )
            rows = (
                await conn.execute(
                    select(webhook_deliveries, webhooks)
                    .join(webhooks, webhooks.c.id == webhook_deliveries.c.webhook_id)
                    .where(webhook_deliveries.c.id.in_(ids))
                    .order_by(webhook_deliveries.c.next_attempt_at)
                )
            ).all()
        n = len(webhook_deliveries.c)
        claimed = []
        for row in rows:
            delivery = WebhookDelivery(
                **dict(zip(webhook_deliveries.c.keys(), row[:n], strict=True))
            )
            hook = Webhook(**dict(zip(webhooks.c.keys(), row[n:], strict=True)))
            claimed.append((delivery, hook))
        return claimed

    async def settle_delivery(
        self,
        delivery_id: str,
        owner: str,
        *,
        delivered: bool,
        error: str | None,
        max_attempts: int,
        backoff_seconds: float,
    ) -> str | None:
        """Record an attempt of a claimed delivery: ``delivered``; or ``pending`` again after
        ``backoff_seconds * 2**(attempts - 1)`` (capped); or ``failed`` after the last attempt.
        Only the lease's owner settles it. Returns the new status (None: not ours any more)."""
        now = self.clock.now()
        key = [webhook_deliveries.c.id == delivery_id, webhook_deliveries.c.lease_owner == owner]
        async with write_transaction(self.engine) as conn:
            row = (
                await conn.execute(
                    select(webhook_deliveries.c.attempts, webhook_deliveries.c.status).where(*key)
                )
            ).first()
            if row is None or row.status != "pending":
                return None
            attempts = row.attempts + 1
            if delivered:
                status, next_at, finished = "delivered", now, now
            elif attempts >= max_attempts:
                status, next_at, finished = "failed", now, now
            else:
                wait = min(MAX_BACKOFF_SECONDS, backoff_seconds * 2 ** (attempts - 1))
                status, next_at, finished = "pending", now + timedelta(seconds=wait), None
            await conn.execute(
                update(webhook_deliveries)
                .where(*key)
                .values(
                    status=status,
                    attempts=attempts,
                    next_attempt_at=next_at,
                    lease_owner=None,
                    lease_expires_at=None,
                    last_error=error,
                    finished_at=finished,
                )
            )
        return status


__all__ = [
    "MAX_BACKOFF_SECONDS",
    "WEBHOOK_EVENTS",
    "WebhookStore",
    "enqueue_deliveries",
    "new_secret",
]
