"""/healthz while a long compaction runs, measured over HTTP.

Issue 10: a run that had to compact 9,000 messages froze its process for 15-19 s, so
``/healthz`` stalled and the lease lapsed. This bench runs that reproduction on real
``carryover serve`` processes and measures the health endpoint of the process doing it:

- SQLite: one server (a file in a temporary directory);
- PostgreSQL: two servers sharing one database of their own on 127.0.0.1:5432 (created, and
  dropped after), with the 2 s lease of the lifecycle tests, so a frozen loop would lose it.

Each time it PUTs 9,000 alternating user/assistant messages of ``u00001 `` + 50 ``a`` (the
settings of ``tests/lifecycle/test_long_compaction.py``: echo provider, a 100,000-token
window, so the first run compacts at its threshold), starts a run, and meanwhile polls
``/healthz`` of the process running it every ~20 ms (and, on PostgreSQL, of the other one).
It prints, and writes to ``--json``, the max and p99 ``/healthz`` latency, the run's status,
duration and compactions, the server's CPU during the run, and the machine's load average::

    .venv/bin/python bench/compaction.py            # both engines, about a minute
    .venv/bin/python bench/compaction.py --engines sqlite
    .venv/bin/python bench/compaction.py --repeat 5   # five runs per engine (the machine is noisy)

The target (docs/performance.md): ``/healthz`` under 100 ms meanwhile.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from longconv import (  # the same server and database helpers
    ROOT,
    cpu_seconds,
    create_pg_database,
    drop_pg_database,
    percentile,
    server,
)

MESSAGES = 9_000
POLL_SECONDS = 0.02
#: the settings that make the first run compact (tests/lifecycle/test_long_compaction.py)
SERVER_ENV = {
    "CARRYOVER_CONTEXT_WINDOW": "100000",
    "CARRYOVER_LEASE_SECONDS": "2",
    # the service's own limits (longconv raises them for its largest PUT)
    "CARRYOVER_MAX_CONTEXT_MESSAGES": "10000",
    "CARRYOVER_MAX_BODY_BYTES": str(8 * 1024 * 1024),
}


@dataclass
class Health:
    """``/healthz`` of one process while the run went on."""

    process: str  # "running the run" or "the other one"
    polls: int
    max_ms: float
    p99_ms: float
    p50_ms: float
    failures: int


@dataclass
class Scenario:
    engine: str
    processes: int
    messages: int
    run_status: str
    run_stored: bool
    run_seconds: float
    compactions: list[dict[str, Any]]
    server_cpu_seconds: float
    health: list[Health]
    load_average: tuple[float, float, float]


def long_context() -> dict[str, Any]:
    messages = []
    for i in range(MESSAGES):
        role = "user" if i % 2 == 0 else "assistant"
        messages.append(
            {"type": role, "content": [{"type": "text", "text": f"u{i:05d} " + "a" * 50}]}
        )
    return {"system_prompt": "", "summary": "", "messages": messages}


async def poll(url: str, stop: asyncio.Event, process: str) -> Health:
    """GET /healthz every ~20 ms until ``stop``: each request's latency."""
    times: list[float] = []
    failures = 0
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(30)) as http:
        while not stop.is_set():
            began = time.perf_counter()
            try:
                ok = (await http.get("/healthz")).status_code == 200
            except httpx.HTTPError:
                ok = False
            took = time.perf_counter() - began
            times.append(took)
            failures += not ok
            await asyncio.sleep(max(0.0, POLL_SECONDS - took))
    ms = [t * 1000 for t in times] or [0.0]
    return Health(
        process=process,
        polls=len(times),
        max_ms=max(ms),
        p99_ms=percentile(ms, 0.99),
        p50_ms=statistics.median(ms),
        failures=failures,
    )


async def scenario(engine: str, urls: list[str], pid: int, conversation: str = "long") -> Scenario:
    """PUT the long context on the first server, run there while polling every server."""
    async with httpx.AsyncClient(base_url=urls[0], timeout=httpx.Timeout(600)) as http:
        put = await http.put(
            f"/conversations/{conversation}/context",
            json=long_context(),
            headers={"If-None-Match": "*"},
        )
        if put.status_code != 201:
            raise RuntimeError(f"PUT context: {put.status_code} {put.text[:300]}")
        stop = asyncio.Event()
        names = ["running the run", "the other one"]
        pollers = [asyncio.create_task(poll(u, stop, names[i])) for i, u in enumerate(urls)]
        await asyncio.sleep(0.2)  # the pollers are going
        cpu_before = cpu_seconds(pid)
        began = time.perf_counter()
        ran = await http.post(
            f"/conversations/{conversation}/runs",
            json={"prompts": ["compact now, please"]},
            headers={"Prefer": "return=minimal"},
        )
        took = time.perf_counter() - began
        cpu = cpu_seconds(pid) - cpu_before
        stop.set()
        health = list(await asyncio.gather(*pollers))
    if ran.status_code != 201:
        raise RuntimeError(f"run: {ran.status_code} {ran.text[:300]}")
    body = ran.json()
    return Scenario(
        engine=engine,
        processes=len(urls),
        messages=MESSAGES,
        run_status=body["status"],
        run_stored=body["stored"],
        run_seconds=took,
        compactions=[
            {"reason": c["reason"], "folded": len(c["folded"]), "at": c["at"]}
            for c in body["compactions"]
        ],
        server_cpu_seconds=cpu,
        health=health,
        load_average=os.getloadavg(),
    )


def report(done: list[Scenario]) -> str:
    lines = [
        "| engine | processes | run | run s | folded | server CPU s | /healthz of | polls "
        "| max ms | p99 ms | p50 ms | failed | load avg (1/5/15 min) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in done:
        folded = sum(c["folded"] for c in s.compactions)
        for h in s.health:
            lines.append(
                f"| {s.engine} | {s.processes} | {s.run_status}, stored {s.run_stored} "
                f"| {s.run_seconds:.2f} | {folded:,} | {s.server_cpu_seconds:.2f} | {h.process} "
                f"| {h.polls} | {h.max_ms:.1f} | {h.p99_ms:.1f} | {h.p50_ms:.1f} | {h.failures} "
                f"| {' / '.join(f'{x:.1f}' for x in s.load_average)} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default="sqlite,postgresql", help="default: both")
    parser.add_argument("--app-root", type=Path, default=ROOT, help="the checkout the server runs")
    parser.add_argument("--json", type=Path, default=ROOT / "docs/perf/compaction.json")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs per engine, each on a conversation of its own PUT just before (default 1)",
    )
    args = parser.parse_args()

    done: list[Scenario] = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="carryover-compaction-") as tmp_name:
        tmp = Path(tmp_name)
        for engine in [e for e in args.engines.split(",") if e]:
            pg_name = f"carryover_bench_compaction_{os.getpid()}"
            if engine == "sqlite":
                url_db, count = f"sqlite:///{tmp}/compaction.db", 1
            elif engine == "postgresql":
                url_db, count = create_pg_database(pg_name), 2
            else:
                sys.exit(f"unknown engine {engine!r}")
            try:
                with ExitStack() as stack:
                    started = [
                        stack.enter_context(
                            server(url_db, args.app_root.resolve(), tmp, MESSAGES, SERVER_ENV)
                        )
                        for _ in range(count)
                    ]
                    urls = [url for url, _ in started]
                    print(
                        f"{engine}: {count} server(s), pids {[p for _, p in started]}", flush=True
                    )
                    for i in range(args.repeat):
                        name = "long" if i == 0 else f"long{i}"
                        done.append(asyncio.run(scenario(engine, urls, started[0][1], name)))
            finally:
                if engine == "postgresql":
                    drop_pg_database(pg_name)
    print()
    print(report(done))
    print(f"\nload average before: {' / '.join(f'{x:.1f}' for x in load_before)}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {"load_average_before": load_before, "scenarios": [asdict(s) for s in done]},
            indent=2,
        )
    )
    print(f"figures: {args.json}")


if __name__ == "__main__":
    main()
