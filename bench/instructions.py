"""Instructions a run executes in the server, counted by callgrind: a figure that does not move
with the machine's load, to compare two checkouts on a shared machine.

A fresh ``carryover serve`` runs under ``valgrind --tool=callgrind --instr-atstart=no`` (nothing
is counted while it starts), in front of the echo provider or a shared/bench fake, on SQLite in
a temporary directory or on a fresh PostgreSQL database. After a context of ``--messages`` and
``--warm`` runs, counting is switched on (``callgrind_control -i on``) for ``--runs`` runs
(``Prefer: return=minimal``), then the counts are dumped and divided by the runs. Every thread
of the server is counted (the event loop's and aiosqlite's); the database server's own work on
PostgreSQL is not. Each run is about 50 times slower under valgrind: a few hundred runs are
enough, as the count per run barely varies. ``--floor`` counts the floor app's requests
(shared/bench/floor_app.py, the same way) and prints each checkout's count over it: the
``10 ÷ floor`` ratio of ``provider_cost.py`` without the machine's load in it.

    .venv/bin/python bench/instructions.py                              # echo, SQLite
    .venv/bin/python bench/instructions.py --engine postgresql --app-root /tmp/before
    .venv/bin/python bench/instructions.py --floor                      # and over the floor app
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
from contextlib import ExitStack
from pathlib import Path

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


def count_floor(args: argparse.Namespace) -> float:
    """Instructions per ``POST /c/{id}/runs`` of the floor app."""
    body = {"prompts": [{"type": "user", "content": [{"type": "text", "text": "hi"}]}]}
    with c.Procs() as procs:
        floor = c.start_floor(procs, callgrind(procs.workdir / "callgrind.out"), timeout=600)
        with httpx.Client(base_url=floor.url, timeout=600) as http:
            http.put("/c/floor").raise_for_status()
            for _ in range(args.warm):
                http.post("/c/floor/runs", json=body).raise_for_status()
            control(floor.pid, "-i", "on")
            for _ in range(args.runs):
                http.post("/c/floor/runs", json=body).raise_for_status()
            control(floor.pid, "-i", "off")
            control(floor.pid, "-d")
        return totals(procs.workdir, args.runs)


def count(args: argparse.Namespace, root: Path) -> float:
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
            control(server.pid, "-i", "on")
            for i in range(args.runs):
                c.run_minimal(http, convs.next(), c.prompt(i))
            control(server.pid, "-i", "off")
            control(server.pid, "-d")
        return totals(procs.workdir, args.runs)


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
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind not found (Debian: apt-get install valgrind)")
    roots = args.app_root or [c.ROOT]
    print(f"instructions: {c.machine_note()}", flush=True)
    floor = count_floor(args) if args.floor else None
    if floor is not None:
        print(f"  floor app: {floor / 1e6:.2f} M instructions per request", flush=True)
    rows = []
    for root in roots:
        per_run = count(args, root)
        over = f"{per_run / floor:.2f}" if floor else "—"
        rows.append([str(root), f"{per_run / 1e6:.2f} M", over])
        print(f"  {root}: {per_run / 1e6:.2f} M instructions per run", flush=True)
    if floor is not None:
        rows.append(["floor app (shared/bench/floor_app.py)", f"{floor / 1e6:.2f} M", "1"])
    print()
    print(
        f"{args.provider}, {args.engine}, {args.messages} messages, {args.runs} runs counted"
        f" after {args.warm}:\n"
    )
    print(c.table(["checkout", "instructions per run", "÷ floor"], rows))


if __name__ == "__main__":
    main()
