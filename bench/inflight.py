"""How many runs one Carryover process holds in flight, and what that costs.

Starts ``carryover serve`` (echo provider; SQLite in a temporary directory unless a
PostgreSQL URL is given), creates one conversation per run, then sends all runs at once, each
a slow echo (``/sleep S``), and prints:

- the peak of ``carryover_runs_in_progress`` sampled from /metrics (runs the server held in
  flight at once) and the peak of requests the client had outstanding;
- the total time, and how long the slowest run took over its sleep;
- the server's resident memory (VmRSS from /proc/<pid>/status, summed over its processes)
  before, at the peak and after;
- what the database did: the runs' statuses as recorded.

It is a script that prints figures, not a test; nothing is asserted::

    .venv/bin/python bench/inflight.py --runs 200 --sleep 5
    .venv/bin/python bench/inflight.py --runs 500 --sleep 5 \\
        --database-url postgresql://postgres@127.0.0.1:5432/carryover_bench

A PostgreSQL database must exist (it is migrated, and its tables are left as they are).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
GAUGE = re.compile(r"^carryover_runs_in_progress(?:\{[^}]*\})?\s+([0-9.eE+-]+)$", re.M)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def group_pids(leader: int) -> list[int]:
    """The server process and every process in its group (uvicorn workers)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == leader:  # the process group id
            pids.append(int(entry.name))
    return pids


def rss_kib(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        found = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
        total += int(found.group(1)) if found else 0
    return total


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time the processes used so far."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return total


def mib(kib: int) -> str:
    return f"{kib / 1024:.1f} MiB"


class Sampler:
    """Samples the in-progress gauge and the server's RSS until stopped."""

    def __init__(self, http: httpx.AsyncClient, leader: int, interval: float) -> None:
        self.http = http
        self.leader = leader
        self.interval = interval
        self.peak_gauge = 0.0
        self.peak_rss = 0
        self.samples = 0
        self.outstanding = 0
        self.peak_outstanding = 0
        self.timeline: list[tuple[float, float]] = []
        self._stop = asyncio.Event()

    async def run(self) -> None:
        while not self._stop.is_set():
            try:
                text = (await self.http.get("/metrics")).text
                values = [float(v) for v in GAUGE.findall(text)]
                if values:
                    self.peak_gauge = max(self.peak_gauge, sum(values))
                    self.timeline.append((time.monotonic(), sum(values)))
            except (httpx.HTTPError, ValueError):
                pass
            self.peak_rss = max(self.peak_rss, rss_kib(group_pids(self.leader)))
            self.samples += 1
            try:
                await asyncio.wait_for(self._stop.wait(), self.interval)
            except TimeoutError:
                pass

    def stop(self) -> None:
        self._stop.set()


def tail(log: Path) -> str:
    return log.read_text(errors="replace")[-4000:]


async def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=2) as http:
        for _ in range(600):
            if proc.poll() is not None:
                sys.exit(f"the server exited ({proc.returncode}):\n{tail(log)}")
            try:
                if (await http.get("/readyz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
    sys.exit(f"the server did not become ready:\n{tail(log)}")


async def bench(args: argparse.Namespace, url: str, leader: int) -> None:
    limits = httpx.Limits(max_connections=args.runs + 16, max_keepalive_connections=args.runs)
    timeout = httpx.Timeout(args.sleep * 10 + 120)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as http:
        sem = asyncio.Semaphore(32)

        async def create() -> str:
            async with sem:
                created = await http.post("/conversations", json={})
                created.raise_for_status()
                conv: str = created.json()["id"]
                return conv

        convs = await asyncio.gather(*(create() for _ in range(args.runs)))
        idle_rss = rss_kib(group_pids(leader))
        cpu_before = cpu_seconds(group_pids(leader))

        probe = httpx.AsyncClient(base_url=url, timeout=30)  # not queued behind the runs
        sampler = Sampler(probe, leader, args.sample)
        sampling = asyncio.create_task(sampler.run())
        durations: list[float] = []
        statuses: Counter[str] = Counter()

        async def one(i: int, conv: str) -> None:
            sampler.outstanding += 1
            sampler.peak_outstanding = max(sampler.peak_outstanding, sampler.outstanding)
            began = time.monotonic()
            try:
                answer = await http.post(
                    f"/conversations/{conv}/runs",
                    headers={"Prefer": "return=minimal"},
                    json={"prompts": [f"/sleep {args.sleep} bench run {i}"]},
                )
                statuses[str(answer.status_code) + " " + answer.json().get("status", "")] += 1
            except Exception as exc:  # counted, not raised: the figures are the point
                statuses[type(exc).__name__] += 1
            finally:
                durations.append(time.monotonic() - began)
                sampler.outstanding -= 1

        started = time.monotonic()
        await asyncio.gather(*(one(i, conv) for i, conv in enumerate(convs)))
        total = time.monotonic() - started
        sampler.stop()
        await sampling
        await probe.aclose()
        after_rss = rss_kib(group_pids(leader))
        cpu = cpu_seconds(group_pids(leader)) - cpu_before

    ordered = sorted(durations)
    peak_at = next((t for t, v in sampler.timeline if v >= sampler.peak_gauge), started)
    print(f"runs:                     {args.runs} concurrent, each /sleep {args.sleep}")
    print(f"database:                 {args.database_display}")
    print(f"workers:                  {args.workers}")
    print(f"answers:                  {dict(statuses)}")
    print(
        f"peak in flight (gauge):   {sampler.peak_gauge:.0f}  "
        f"(carryover_runs_in_progress, {sampler.samples} samples)"
    )
    print(f"peak outstanding (client):{sampler.peak_outstanding:>4}")
    print(f"total time:               {total:.2f} s  (ideal: {args.sleep:.2f} s)")
    print(f"  all started after:      {peak_at - started:.2f} s  (first sample at the peak)")
    print(
        f"run time p50/p95/max:     {statistics.median(ordered):.2f} / "
        f"{ordered[int(len(ordered) * 0.95) - 1]:.2f} / {ordered[-1]:.2f} s"
    )
    print(
        f"server CPU:               {cpu:.2f} s  ({cpu / args.runs * 1000:.1f} ms per run, "
        f"sampling included)"
    )
    print(
        f"server RSS idle/peak/after: {mib(idle_rss)} / {mib(sampler.peak_rss)} / "
        f"{mib(after_rss)}  (peak - idle per run: "
        f"{(sampler.peak_rss - idle_rss) / max(1, args.runs):.0f} KiB)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200, help="concurrent runs (default 200)")
    parser.add_argument(
        "--sleep", type=float, default=5.0, help="seconds each echo run sleeps (default 5)"
    )
    parser.add_argument(
        "--database-url",
        default=None,
        help="PostgreSQL URL (default: a SQLite file in a temporary directory)",
    )
    parser.add_argument("--workers", type=int, default=1, help="server worker processes")
    parser.add_argument("--lease-seconds", type=float, default=5.0)
    parser.add_argument("--keep-log", metavar="PATH", help="copy the server's log there")
    parser.add_argument(
        "--sample", type=float, default=0.1, help="seconds between /metrics samples"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="carryover-bench-") as tmp:
        database = args.database_url or f"sqlite:///{tmp}/bench.db"
        args.database_display = re.sub(r"://([^:/@]*):[^@/]*@", r"://\1:***@", database)
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("CARRYOVER_")}
        env.update(
            {
                "CARRYOVER_DATABASE_URL": database,
                "CARRYOVER_PORT": str(port),
                "CARRYOVER_PROVIDER": "echo",
                "CARRYOVER_LOG_LEVEL": "WARNING",
                "CARRYOVER_LEASE_SECONDS": str(args.lease_seconds),
                "CARRYOVER_MAX_PAGE_SIZE": "200",
            }
        )
        log = Path(tmp) / "server.log"
        argv = [
            sys.executable,
            "-m",
            "app.cli",
            "serve",
            "--port",
            str(port),
            "--workers",
            str(args.workers),
        ]
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                argv,
                env=env,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        url = f"http://127.0.0.1:{port}"
        try:
            asyncio.run(wait_ready(url, proc, log))
            asyncio.run(bench(args, url, proc.pid))
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        errors = [
            line
            for line in log.read_text(errors="replace").splitlines()
            if "ERROR" in line or "locked" in line
        ]
        if errors:
            print(f"server log: {len(errors)} error line(s), first: {errors[0][:200]}")
        if args.keep_log:
            Path(args.keep_log).write_bytes(log.read_bytes())


if __name__ == "__main__":
    main()
