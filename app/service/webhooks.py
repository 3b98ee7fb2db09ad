"""Webhook deliveries, signed as Standard Webhooks (https://www.standardwebhooks.com).

The outbox rows are written with the run's outcome (:mod:`app.store.webhooks`); a
:class:`WebhookWorker` on every replica (unless ``CARRYOVER_WEBHOOK_WORKER=false``) claims due
rows with a lease, POSTs them, and settles them: a 2xx is delivered; any other answer, a
timeout or a connection error is tried again after ``webhook_backoff_seconds`` doubling per
attempt, up to ``webhook_max_attempts``, then the delivery is ``failed``. At least once: a
worker that dies after sending and before settling leaves the row to be sent again once its
lease expired — receivers deduplicate on ``webhook-id``, which every attempt repeats.

The body is ``{"type": "run.<status>", "timestamp": …, "data": <run record without context>}``,
rendered from the stored (immutable) run record, so every attempt sends the same bytes.

Before each attempt the endpoint's address is checked (app/addresses.py) unless it was added
with ``--allow-private``: a name that resolves to a private, loopback or link-local address is
not sent to (the attempt fails, ``refused: …``), and the request goes to the address that was
checked, so a name cannot resolve to another one between the check and the connection.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import logging
import uuid
from collections.abc import Callable
from typing import Any

import httpx

from app.addresses import PrivateTarget, Resolver, check_url, pinned, resolve
from app.clock import Clock
from app.config import Settings
from app.store.faults import classify
from app.store.stores import RunRecord, Stores
from app.store.tables import Webhook, WebhookDelivery
from app.tls import client_context

log = logging.getLogger(__name__)

#: deliveries claimed at once by one worker
CLAIM_BATCH = 16
SECRET_PREFIX = "whsec_"

Render = Callable[[RunRecord], dict[str, Any]]


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value: ``v1,`` and the base64 HMAC-SHA256, keyed with the
    secret's bytes (base64 after ``whsec_``), of ``"{msg_id}.{timestamp}.{body}"``."""
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def verify(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """A receiver's check (for tests and as documentation): any ``v1`` signature matches."""
    expected = sign(secret, headers["webhook-id"], int(headers["webhook-timestamp"]), body)
    return any(
        hmac.compare_digest(candidate, expected)
        for candidate in headers["webhook-signature"].split()
    )


class WebhookWorker:
    def __init__(self, stores: Stores, settings: Settings, clock: Clock, render: Render):
        self.stores = stores
        self.settings = settings
        self.clock = clock
        self.render = render
        self.owner = f"webhooks-{uuid.uuid4().hex[:12]}"
        self._task: asyncio.Task[None] | None = None
        self._http: httpx.AsyncClient | None = None
        #: how endpoint names are resolved for the address check (app/addresses.py)
        self.resolver: Resolver = resolve

    async def start(self) -> None:
        if self._task is None:
            self._http = httpx.AsyncClient(
                timeout=self.settings.webhook_timeout_seconds,
                follow_redirects=False,
                verify=client_context(),
            )
            self._task = asyncio.create_task(self._loop(), name="carryover-webhooks")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def _loop(self) -> None:
        while True:
            try:
                while await self.deliver_due():
                    pass
            except Exception as exc:  # the database may be away for a moment: next poll
                fault = classify(exc)
                if fault is None:
                    log.exception("delivering webhooks failed")
                else:  # as the lease keeper: a warning naming the fault, no traceback
                    log.warning(
                        "delivering webhooks failed (database %s); trying again", fault.kind
                    )
            await asyncio.sleep(self.settings.webhook_poll_seconds)

    async def deliver_due(self) -> int:
        """Claim and send one batch of due deliveries; how many were claimed."""
        claimed = await self.stores.webhooks.claim_deliveries(
            self.owner,
            lease_seconds=self.settings.webhook_timeout_seconds + 30,
            limit=CLAIM_BATCH,
        )
        if claimed:
            await asyncio.gather(*(self._deliver(d, hook) for d, hook in claimed))
        return len(claimed)

    async def body(self, delivery: WebhookDelivery) -> bytes:
        record = await self.stores.records.get_run(
            delivery.tenant, delivery.conversation_id, delivery.run_id
        )
        data = (
            self.render(record)
            if record is not None
            else {  # the conversation was deleted since
                "run_id": delivery.run_id,
                "conversation_id": delivery.conversation_id,
                "status": delivery.event.removeprefix("run."),
            }
        )
        payload = {
            "type": delivery.event,
            "timestamp": delivery.created_at.isoformat().replace("+00:00", "Z"),
            "data": data,
        }
        return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()

    async def _deliver(self, delivery: WebhookDelivery, hook: Webhook) -> None:
        error: str | None = None
        try:
            body = await self.body(delivery)
            timestamp = int(self.clock.now().timestamp())
            headers = {
                "content-type": "application/json",
                "user-agent": "carryover-webhooks",
                "webhook-id": delivery.id,
                "webhook-timestamp": str(timestamp),
                "webhook-signature": sign(hook.secret, delivery.id, timestamp, body),
            }
            assert self._http is not None
            # checked (unless added with --allow-private) and sent to the address checked
            target = await check_url(
                hook.url, allow_private=hook.allow_private, resolver=self.resolver
            )
            url, host, extensions = pinned(target)
            answer = await self._http.post(
                url, content=body, headers={**headers, **host}, extensions=extensions
            )
            if not 200 <= answer.status_code < 300:
                error = f"HTTP {answer.status_code}"
        except PrivateTarget as exc:
            error = f"refused: {exc}; add the endpoint with --allow-private to allow it"
        except httpx.TimeoutException:
            error = "timeout"
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"[:500]
        status = await self.stores.webhooks.settle_delivery(
            delivery.id,
            self.owner,
            delivered=error is None,
            error=error,
            max_attempts=self.settings.webhook_max_attempts,
            backoff_seconds=self.settings.webhook_backoff_seconds,
        )
        if error is not None:
            log.warning("webhook %s to %s failed (%s): %s", delivery.id, hook.url, error, status)


__all__ = ["CLAIM_BATCH", "WebhookWorker", "sign", "verify"]
