"""Quotas across replicas: two ``carryover serve`` processes on one PostgreSQL database share a
tenant's budget — 20 concurrent runs against 5 runs per minute start exactly 5 (the tenant's
quota row is locked in the transaction that takes each lease); and six runs queued on one
conversation through both servers, background and waiting, against 3 runs per minute: exactly
3 start, whichever server claims them (a queued run is admitted in its claim's transaction)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import httpx

from ..fakes.gated_http import PROFILE, GatedOpenAI
from ..helpers import HANG_GUARD_SECONDS, assert_problem
from .harness import ROOT, Servers, all_runs, client, eventually, run_record, server_env

TENANT = "default"


def quotas_cli(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = server_env(database_url, 8000)  # the port is not used
    return subprocess.run(
        [sys.executable, "-m", "app.cli", "quotas", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_two_processes_start_exactly_the_runs_per_minute(
    servers: Servers, postgres_url: str
) -> None:
    done = quotas_cli(postgres_url, "set", "--tenant", TENANT, "--runs-per-minute", "5")
    assert done.returncode == 0, done.stderr
    assert "runs-per-minute 5" in done.stdout
    shown = quotas_cli(postgres_url, "show", "--tenant", TENANT)
    assert shown.stdout.strip() == f"{TENANT}: runs-per-minute 5"

    first, second = await servers.start(postgres_url, count=2)
    async with httpx.AsyncClient(timeout=30) as http:
        for i in range(20):
            created = await http.post(f"{first.url}/conversations", json={"id": f"q{i}"})
            assert created.status_code == 201

        async def run(i: int) -> httpx.Response:
            server = first if i % 2 else second
            return await http.post(
                f"{server.url}/conversations/q{i}/runs", json={"prompts": [f"run {i}"]}
            )

        answers = await asyncio.gather(*(run(i) for i in range(20)))
        statuses = sorted(a.status_code for a in answers)
        assert statuses == [201] * 5 + [429] * 15, [a.text for a in answers if a.status_code >= 500]
        for refused in (a for a in answers if a.status_code == 429):
            assert refused.json()["type"].endswith("/quota-exceeded")
            assert refused.headers["ratelimit-policy"] == '"runs-per-minute";q=5;w=60'
        # the refused ones left no run behind, on either server
        counts = [
            len((await http.get(f"{first.url}/conversations/q{i}/runs")).json()["items"])
            for i in range(20)
        ]
        assert sum(counts) == 5
        usage = (await http.get(f"{second.url}/usage")).json()
        assert usage["days"][0]["runs"] == 5 and usage["quota"]["runs_last_minute"] == 5

    cleared = quotas_cli(postgres_url, "clear", "--tenant", TENANT)
    assert cleared.returncode == 0 and "cleared" in cleared.stdout
    assert quotas_cli(postgres_url, "show").stdout.strip() == "no quotas"
    again = quotas_cli(postgres_url, "clear", "--tenant", TENANT)
    assert again.returncode == 1 and "has no quotas" in again.stderr
    bad = quotas_cli(postgres_url, "set", "--tenant", TENANT)
    assert bad.returncode == 2


async def test_two_processes_admit_exactly_the_runs_per_minute_of_one_queue(
    servers: Servers, postgres_url: str, gate: GatedOpenAI
) -> None:
    tenant = "queue-tenant"  # a tenant of its own: the window of the test above stays its own
    done = quotas_cli(postgres_url, "set", "--tenant", tenant, "--runs-per-minute", "3")
    assert done.returncode == 0, done.stderr
    keys = f"{tenant}:queue-key-0123456789"
    auth = {"Authorization": "Bearer queue-key-0123456789"}
    a, b = await servers.start(postgres_url, 2, api_keys=keys, **gate.settings())
    async with client(a, headers=auth) as on_a, client(b, headers=auth) as on_b:
        created = await on_a.post("/conversations", json={"id": "queue"})
        assert created.status_code == 201, created.text

        async def queued(count: int) -> None:
            async def probe() -> bool | None:
                statuses = [r["status"] for r in await all_runs(on_a, "queue")]
                return True if statuses.count("queued") >= count else None

            await eventually(probe, within=HANG_GUARD_SECONDS, what=f"{count} queued run(s)")

        def submit(http: httpx.AsyncClient, n: int, background: bool) -> Any:
            return http.post(
                "/conversations/queue/runs",
                json={"prompts": [f"queued {n}"], "agent": PROFILE, "if_busy": "enqueue"},
                headers={"Prefer": "respond-async"} if background else {},
            )

        # 0 starts at once (on A); 1-5 queue behind it, alternately on B and A
        plan = [
            (on_a, True),
            (on_b, True),
            (on_b, False),
            (on_a, True),
            (on_a, False),
            (on_b, True),
        ]
        background: dict[int, str] = {}
        waiting: dict[int, asyncio.Task[httpx.Response]] = {}
        for n, (http, is_background) in enumerate(plan):
            if is_background:
                answer = await submit(http, n, True)
                assert answer.status_code == 202, answer.text
                background[n] = answer.json()["run_id"]
            else:
                waiting[n] = asyncio.create_task(submit(http, n, False))
            if n:
                await queued(n)
        await gate.release_in_order(3)  # 0, 1, 2 run; the model sees no other

        answered = {n: await task for n, task in waiting.items()}
        assert answered[2].status_code == 201 and answered[2].json()["status"] == "completed"
        refused = assert_problem(answered[4], 429, "quota-exceeded")
        assert (refused["limit"], refused["quota"]) == ("runs_per_minute", 3)
        assert answered[4].headers["ratelimit-policy"] == '"runs-per-minute";q=3;w=60'

        async def ended(run_id: str) -> dict[str, Any] | None:
            record = await run_record(on_b, "queue", run_id)
            return None if record["status"] in ("queued", "running") else record

        ends = {
            n: await eventually(lambda r=run_id: ended(r), within=HANG_GUARD_SECONDS)
            for n, run_id in background.items()
        }
        assert [ends[n]["status"] for n in (0, 1)] == ["completed", "completed"]
        for n in (3, 5):
            assert ends[n]["status"] == "failed" and ends[n]["stored"] is False
            assert ends[n]["error"]["code"] == "quota_exceeded"
            assert ends[n]["error"]["type"].endswith("/run-quota-exceeded")
        assert sorted(h.prompt for h in gate.held) == ["queued 0", "queued 1", "queued 2"]
        records = await all_runs(on_b, "queue")
        assert len(records) == 5  # the refused waiter left none
        assert [r["status"] for r in records].count("completed") == 3

        usage = (await on_b.get("/usage")).json()
        assert usage["days"][0]["runs"] == 3 and usage["quota"]["runs_last_minute"] == 3
        assert usage["days"][0]["input_tokens"] == sum(r["usage"]["input_tokens"] for r in records)
        metrics = (await on_a.get("/metrics")).text
        assert 'carryover_queued_runs{kind="background"} 0.0' in metrics
        assert 'carryover_queued_runs{kind="waiting"} 0.0' in metrics
    cleared = quotas_cli(postgres_url, "clear", "--tenant", tenant)
    assert cleared.returncode == 0
