"""A run that pauses for the application is counted as ``requires_action`` in
``carryover_runs_total`` (not ``other``); a queued run's record says when it started, and its
``duration_ms`` (and its duration histogram) run from that start, not from its arrival."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime

import httpx
from prometheus_client.parser import text_string_to_metric_families

from app.api.app import create_app
from app.clock import ManualClock

from ..fakes.gated import GatedProvider, gated_pool
from ..helpers import until
from .conftest import AppClient, SettingsFactory

ASYNC = {"Prefer": "respond-async"}


async def scraped(client: AppClient, name: str, **labels: str) -> float:
    text = (await client.get("/metrics")).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


async def test_a_paused_run_counts_as_requires_action(client: AppClient) -> None:
    # the counters are the process's: other modules' runs (of other profiles) count in them too
    mine = {"agent": "default"}
    await client.post("/conversations", json={"id": "c"})
    before = await scraped(client, "carryover_runs_total", status="requires_action", **mine)
    other = await scraped(client, "carryover_runs_total", status="other", **mine)
    paused = await client.post(
        "/conversations/c/runs",
        json={
            "prompts": ["/tool lookup {}"],
            "tools": [
                {"name": "lookup", "description": "look up", "parameters": {"type": "object"}}
            ],
        },
    )
    assert paused.status_code == 201 and paused.json()["status"] == "requires_action"
    after = await scraped(client, "carryover_runs_total", status="requires_action", **mine)
    assert after == before + 1
    assert await scraped(client, "carryover_runs_total", status="other", **mine) == other


@asynccontextmanager
async def on_clock(
    make_settings: SettingsFactory, clock: ManualClock, gate: GatedProvider
) -> AsyncIterator[AppClient]:
    settings = make_settings(lease_seconds=3600.0)
    app = create_app(settings, agents=gated_pool(settings, gate), clock=clock)
    http = AppClient(transport=httpx.ASGITransport(app=app), base_url="http://carryover.test")
    http.app = app
    async with app.router.lifespan_context(app), http:
        try:
            yield http
        finally:
            gate.open()


async def test_a_queued_runs_record_starts_when_its_turn_came(
    make_settings: SettingsFactory,
) -> None:
    clock, gate = ManualClock(), GatedProvider(hold=lambda prompt: prompt.startswith("held"))
    async with on_clock(make_settings, clock, gate) as client:
        await client.post("/conversations", json={"id": "c"})
        first = asyncio.create_task(
            client.post("/conversations/c/runs", json={"prompts": ["held first"]})
        )
        await gate.arrival("held first")
        queued = await client.post(
            "/conversations/c/runs",
            json={"prompts": ["second"], "if_busy": "enqueue"},
            headers=ASYNC,
        )
        assert queued.status_code == 202, queued.text
        run_id = queued.json()["run_id"]
        waiting = (await client.get(f"/conversations/c/runs/{run_id}")).json()
        assert waiting["status"] == "queued" and waiting["started_at"] is None
        assert waiting["duration_ms"] is None
        clock.advance(120)  # two minutes in the queue
        gate.release_all()
        assert (await first).json()["status"] == "completed"

        async def ended() -> dict[str, object] | None:
            got = (await client.get(f"/conversations/c/runs/{run_id}")).json()
            return got if got["status"] == "completed" else None

        record = await until(ended, what="the queued run ends")
    created = datetime.fromisoformat(str(record["created_at"]))
    started = datetime.fromisoformat(str(record["started_at"]))
    finished = datetime.fromisoformat(str(record["finished_at"]))
    assert (started - created).total_seconds() == 120  # the wait is between these two
    assert record["duration_ms"] == int((finished - started).total_seconds() * 1000) == 0
