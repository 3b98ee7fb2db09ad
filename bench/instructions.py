"""Instructions a run executes in the server, counted by callgrind: a figure that does not move
with the machine's load, to compare two checkouts on a shared machine.

A fresh ``carryover serve`` runs under ``valgrind --tool=callgrind --instr-atstart=no`` (nothing
is counted while it starts), in front of the echo provider or a shared/bench fake, on SQLite in
a temporary directory or on a fresh PostgreSQL database. After a context of ``--messages`` and
``--warm`` runs, counting is switched on (``callgrind_control -i on``) for ``--runs`` runs
(``Prefer: return=minimal``), then the counts are dumped and divided by the runs. Every thread
of the server is counted (the event loop's and aiosqlite's); the database server's own work on
PostgreSQL is not. Each run is about 50 times slower under valgrind: a few hundred runs are
enough, as the count per run barely varies. For the same reason what the server does by the
clock while idle (its lease, queue and webhook pollers, a few times a second) is about 50 times
as large a share of the count as of a run's CPU: ``--idle`` seconds with no request are counted
first, and the column "the run's own" takes that rate, times the runs' duration, off (both
figures are printed). ``--floor`` counts the floor app's requests (shared/bench/floor_app.py,
the same way) and prints each checkout's own count over the floor app's: the ``10 ÷ floor``
ratio of ``provider_cost.py`` without the machine's load in it.

    .venv/bin/python bench/instructions.py                              # echo, SQLite
    .venv/bin/python bench/instructions.py --engine postgresql --app-root /tmp/before
    .venv/bin/python bench/instructions.py --floor                      # and over the floor app
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _common as c  # bench/_common.py: a script's folder is on sys.path
import httpx


def callgrind(out: Path) -> list[str]:
    """valgrind counting nothing until told (``callgrind_control -i on``), dumping to ``out``."""
    return ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]


def control(pid: int, *flags: str) -> None:
    subprocess.run(["callgrind_control", *flags, str(pid)], check=True, capture_output=True)


def totals(workdir: Path, requests: int) -> float:
    """The instructions counted in ``workdir``'s dumps, per request."""
    total = sum(
        int(found)
        for dump in workdir.glob("callgrind.out*")
        for found in re.findall(r"^totals: (\d+)", dump.read_text(), re.MULTILINE)
    )
    return total / requests


@dataclass
class Count:
    """Instructions per request, and of them what the process does by the clock while idle."""

    per_request: float
    idle: float = 0.0

    @property
    def own(self) -> float:
        return self.per_request - self.idle


def window(pid: int, workdir: Path, action: Any) -> tuple[float, float]:
    """The instructions counted while ``action()`` runs (dumped after it), and its seconds."""
    before = totals(workdir, 1)
    control(pid, "-i", "on")
    started = time.monotonic()
    action()
    control(pid, "-i", "off")
    elapsed = time.monotonic() - started
    control(pid, "-d")
    return totals(workdir, 1) - before, elapsed


def counted(pid: int, workdir: Path, idle_seconds: float, requests: int, send: Any) -> Count:
    """Count ``idle_seconds`` with no request, then ``requests`` requests sent by ``send(i)``:
    instructions per request, and the idle rate times their duration, per request."""
    rate = 0.0
    if idle_seconds > 0:
        idle, elapsed = window(pid, workdir, lambda: time.sleep(idle_seconds))
        rate = idle / elapsed
    total, elapsed = window(pid, workdir, lambda: [send(i) for i in range(requests)])
    return Count(total / requests, rate * elapsed / requests)


def count_floor(args: argparse.Namespace) -> Count:
    """Instructions per ``POST /c/{id}/runs`` of the floor app."""
    body = {"prompts": [{"type": "user", "content": [{"type": "text", "text": "hi"}]}]}
    with c.Procs() as procs:
        floor = c.start_floor(procs, callgrind(procs.workdir / "callgrind.out"), timeout=600)
        with httpx.Client(base_url=floor.url, timeout=600) as http:
            http.put("/c/floor").raise_for_status()
            for _ in range(args.warm):
                http.post("/c/floor/runs", json=body).raise_for_status()
            return counted(
                floor.pid,
                procs.workdir,
                args.idle,
                args.runs,
                lambda _: http.post("/c/floor/runs", json=body).raise_for_status(),
            )


def count(args: argparse.Namespace, root: Path) -> Count:
    """Instructions per run of the checkout at ``root``."""
    with c.Procs() as procs, ExitStack() as stack:
        fake_url = c.start_fake(procs, args.provider).url if args.provider != "echo" else ""
        url = c.database(args.engine, stack, procs.workdir, "instructions")
        env = c.server_env(url, args.provider, fake_url, max(args.messages, 1_000))
        wrapper = callgrind(procs.workdir / "callgrind.out")
        server = c.start_server(procs, env, app_root=root.resolve(), wrapper=wrapper, timeout=600)
        with httpx.Client(base_url=server.url, timeout=600) as http:
            c.put_context_sync(http, "counted", args.messages)
            for i in range(args.warm):
                c.run_minimal(http, "counted", f"warm {i}")
            # the counted runs on conversations of --messages messages (c.Conversations)
            convs = c.Conversations(http, "counted", args.messages, args.runs)
            return counted(
                server.pid,
                procs.workdir,
                args.idle,
                args.runs,
                lambda i: c.run_minimal(http, convs.next(), c.prompt(i)),
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--provider", default="echo", choices=["echo", "openai", "openai-responses", "anthropic"]
    )
    parser.add_argument("--engine", default="sqlite", choices=["sqlite", "postgresql"])
    parser.add_argument("--messages", type=int, default=10)
    parser.add_argument("--warm", type=int, default=20)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument(
        "--app-root", type=Path, action="append", help="a checkout to count (repeatable)"
    )
    parser.add_argument("--floor", action="store_true", help="count the floor app too")
    parser.add_argument(
        "--idle",
        type=float,
        default=5.0,
        help="seconds counted with no request before the runs, to take the idle rate off (0: none)",
    )
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind not found (Debian: apt-get install valgrind)")
    roots = args.app_root or [c.ROOT]
    print(f"instructions: {c.machine_note()}", flush=True)
    floor = count_floor(args) if args.floor else None
    if floor is not None:
        print(f"  floor app: {floor.own / 1e6:.2f} M instructions per request", flush=True)
    rows = []
    for root in roots:
        found = count(args, root)
        over = f"{found.own / floor.own:.2f}" if floor else "—"
        rows.append(
            [str(root), f"{found.per_request / 1e6:.2f} M", f"{found.own / 1e6:.2f} M", over]
        )
        print(f"  {root}: {found.own / 1e6:.2f} M instructions per run", flush=True)
    if floor is not None:
        rows.append(
            [
                "floor app (shared/bench/floor_app.py)",
                f"{floor.per_request / 1e6:.2f} M",
                f"{floor.own / 1e6:.2f} M",
                "1",
            ]
        )
    print()
    print(
        f"{args.provider}, {args.engine}, {args.messages} messages, {args.runs} runs counted"
        f" after {args.warm}; the run's own: without the idle rate ({args.idle:g} s counted"
        " idle) times the runs' duration:\n"
    )
    headers = ["checkout", "instructions per run", "the run's own", "÷ floor (own)"]
    print(c.table(headers, rows))


if __name__ == "__main__":
    main()
