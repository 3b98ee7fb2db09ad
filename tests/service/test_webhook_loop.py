"""The webhook worker's loop through a database fault (docs/faults.md): a warning naming the
fault and the next poll, no traceback (the fault suites find none in the servers' logs)."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import pytest

from app.clock import ManualClock
from app.config import Settings
from app.service.webhooks import WebhookWorker

from ..helpers import HANG_GUARD_SECONDS


async def test_a_database_fault_is_a_warning_and_the_next_poll(
    caplog: pytest.LogCaptureFixture,
) -> None:
    polls: list[int] = []
    polled_again = asyncio.Event()

    class Down:
        async def claim_deliveries(self, *args: object, **kwargs: object) -> list[object]:
            polls.append(1)
            if len(polls) > 1:
                polled_again.set()
            raise ConnectionRefusedError(111, "Connect call failed")

    settings = Settings(webhook_poll_seconds=0.01)
    stores = SimpleNamespace(webhooks=Down())
    worker = WebhookWorker(stores, settings, ManualClock(), render=lambda record: {})  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="app.service.webhooks"):
        await worker.start()
        try:
            await asyncio.wait_for(polled_again.wait(), HANG_GUARD_SECONDS)
        finally:
            await worker.aclose()
    records = [r for r in caplog.records if r.name == "app.service.webhooks"]
    assert records and all(r.exc_info is None for r in records), records
    assert "database unavailable" in records[0].getMessage()
