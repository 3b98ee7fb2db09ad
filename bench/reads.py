"""Server CPU per request of the API's reads: what a client polling a run, following its events
or paging its records costs the server.

A fresh ``carryover serve`` (echo provider, SQLite in a temporary directory or a fresh
PostgreSQL database) holds a conversation of ``--messages`` messages with a few runs, 20 more
conversations and a ``/v1`` response. Each read is asked ``--warm`` times, then ``--requests``
times sequentially while the server's CPU (utime + stime, bench/_common.py) is read before and
after; its CPU per request and the client's p50 are printed. With ``--app-root`` repeated, the
checkouts are measured one after the other (each its own server), to compare them in one
sitting.

    .venv/bin/python bench/reads.py                                  # SQLite, this checkout
    .venv/bin/python bench/reads.py --engine postgresql
    .venv/bin/python bench/reads.py --app-root /tmp/before --app-root .
"""

from __future__ import annotations

import argparse
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import _common as c  # bench/_common.py: a script's folder is on sys.path
import httpx


def paths(http: httpx.Client, messages: int) -> dict[str, str]:
    """The reads, by name, on data made here."""
    c.put_context_sync(http, "read", messages)
    for i in range(5):
        c.check_run(
            http.post("/conversations/read/runs", json={"prompts": [f"p{i}"]}, headers=c.MINIMAL)
        )
    ran = http.post("/conversations/read/runs", json={"prompts": ["last"]}, headers=c.MINIMAL)
    c.check_run(ran)
    run = f"/conversations/read/runs/{ran.json()['run_id']}"
    response = http.post("/v1/responses", json={"model": "default", "input": "hi"})
    response.raise_for_status()
    for _ in range(20):
        http.post("/conversations", json={}).raise_for_status()
    return {
        "GET /healthz": "/healthz",
        "GET conversation": "/conversations/read",
        "GET conversations (a page of 20)": "/conversations?limit=20",
        "GET context": "/conversations/read/context",
        "GET run (ended)": run,
        "GET run events (ended)": f"{run}/events",
        "GET runs (a page of 6)": "/conversations/read/runs",
        "GET transcript": "/conversations/read/transcript",
        "GET /v1 response": f"/v1/responses/{response.json()['id']}",
    }


def measure(args: argparse.Namespace, root: Path) -> dict[str, dict[str, float]]:
    with c.Procs() as procs, ExitStack() as stack:
        url = c.database(args.engine, stack, procs.workdir, "reads")
        server = c.start_server(procs, c.server_env(url), app_root=root.resolve())
        out: dict[str, dict[str, float]] = {}
        with httpx.Client(base_url=server.url, timeout=60) as http:
            for name, path in paths(http, args.messages).items():
                for _ in range(args.warm):
                    http.get(path).raise_for_status()
                latencies = []
                before = c.cpu_seconds(server.popen.pid)
                for _ in range(args.requests):
                    started = time.perf_counter()
                    http.get(path).raise_for_status()
                    latencies.append(time.perf_counter() - started)
                cpu = (c.cpu_seconds(server.popen.pid) - before) / args.requests
                out[name] = {"cpu_ms": cpu * 1e3, "p50_ms": c.percentile(latencies, 0.5) * 1e3}
                print(f"  {root}: {name}: {cpu * 1e3:.2f} ms CPU", flush=True)
        return out


def main() -> None:
    c.on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", default="sqlite", choices=["sqlite", "postgresql"])
    parser.add_argument("--messages", type=int, default=10)
    parser.add_argument("--warm", type=int, default=30)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--app-root", type=Path, action="append", help="a checkout (repeatable)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    roots = args.app_root or [c.ROOT]
    print(f"reads: {c.machine_note()}", flush=True)
    figures = {str(root): measure(args, root) for root in roots}
    names = list(next(iter(figures.values())))
    header = ["read", *(f"{root}: CPU ms / p50 ms" for root in figures)]
    rows: list[list[Any]] = [
        [name, *(f"{f[name]['cpu_ms']:.2f} / {f[name]['p50_ms']:.2f}" for f in figures.values())]
        for name in names
    ]
    print(f"\n{args.engine}, {args.requests} requests each after {args.warm}:\n")
    print(c.table(header, rows))
    c.write_json(args.json, {"engine": args.engine, "requests": args.requests, "figures": figures})


if __name__ == "__main__":
    main()
