"""Instructions a run executes in the server, counted by callgrind: a figure that does not move
with the machine's load, to compare two checkouts on a shared machine.

A fresh ``carryover serve`` runs under ``valgrind --tool=callgrind --instr-atstart=no`` (nothing
is counted while it starts), in front of the echo provider or a shared/bench fake, on SQLite in
a temporary directory or on a fresh PostgreSQL database. After a context of ``--messages`` and
``--warm`` runs, counting is switched on (``callgrind_control -i on``) for ``--runs`` runs
(``Prefer: return=minimal``), then the counts are dumped and divided by the runs. Every thread
of the server is counted (the event loop's and aiosqlite's); the database server's own work on
PostgreSQL is not. Each run is about 50 times slower under valgrind: a few hundred runs are
enough, as the count per run barely varies.

    .venv/bin/python bench/instructions.py                              # echo, SQLite
    .venv/bin/python bench/instructions.py --engine postgresql --app-root /tmp/before
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


def count(args: argparse.Namespace, root: Path) -> float:
    """Instructions per run of the checkout at ``root``."""
    with c.Procs() as procs, ExitStack() as stack:
        fake_url = c.start_fake(procs, args.provider).url if args.provider != "echo" else ""
        url = c.database(args.engine, stack, procs.workdir, "instructions")
        env = c.server_env(url, args.provider, fake_url, max(args.messages, 1_000))
        out = procs.workdir / "callgrind.out"
        wrapper = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={out}",
        ]
        server = c.start_server(procs, env, app_root=root.resolve(), wrapper=wrapper, timeout=600)
        with httpx.Client(base_url=server.url, timeout=600) as http:
            c.put_context_sync(http, "counted", args.messages)
            for i in range(args.warm):
                c.check_run(
                    http.post(
                        "/conversations/counted/runs",
                        json={"prompts": [f"warm {i}"]},
                        headers=c.MINIMAL,
                    )
                )

            def control(*flags: str) -> None:
                argv = ["callgrind_control", *flags, str(server.pid)]
                subprocess.run(argv, check=True, capture_output=True)

            control("-i", "on")
            for i in range(args.runs):
                c.check_run(
                    http.post(
                        "/conversations/counted/runs",
                        json={"prompts": [c.prompt(i)]},
                        headers=c.MINIMAL,
                    )
                )
            control("-i", "off")
            control("-d")
        total = sum(
            int(found)
            for dump in procs.workdir.glob("callgrind.out*")
            for found in re.findall(r"^totals: (\d+)", dump.read_text(), re.MULTILINE)
        )
        return total / args.runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--provider", default="echo", choices=["echo", "openai", "anthropic"])
    parser.add_argument("--engine", default="sqlite", choices=["sqlite", "postgresql"])
    parser.add_argument("--messages", type=int, default=10)
    parser.add_argument("--warm", type=int, default=20)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument(
        "--app-root", type=Path, action="append", help="a checkout to count (repeatable)"
    )
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind not found (Debian: apt-get install valgrind)")
    roots = args.app_root or [c.ROOT]
    print(f"instructions: {c.machine_note()}", flush=True)
    rows = []
    for root in roots:
        per_run = count(args, root)
        rows.append([str(root), f"{per_run / 1e6:.2f} M"])
        print(f"  {root}: {per_run / 1e6:.2f} M instructions per run", flush=True)
    print()
    print(
        f"{args.provider}, {args.engine}, {args.messages} messages, {args.runs} runs counted"
        f" after {args.warm}:\n"
    )
    print(c.table(["checkout", "instructions per run"], rows))


if __name__ == "__main__":
    main()
