"""Quotas across replicas: two ``carryover serve`` processes on one PostgreSQL database share a
tenant's budget — 20 concurrent runs against 5 runs per minute start exactly 5 (the tenant's
quota row is locked in the transaction that takes each lease)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import httpx

from .harness import ROOT, Servers, server_env

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
