"""What checking stored messages against their checksums costs a read (docs/faults.md,
"Damaged stored rows"): the joined read GET context makes on a cache miss, and the row read a
run makes, of one conversation of N messages, with the checks and without them (the check
functions replaced by no-ops in this process), interleaved so that the machine's load falls on
both alike. In process, no server; SQLite in a temporary folder, PostgreSQL with ``--pg URL``
(a database it may fill: one conversation ``bench``).

    .venv/bin/python bench/stored_checks.py [--messages 50,2000] [--chars 5000] [--reps 25]
        [--pg postgresql://postgres@127.0.0.1:5432/DB] [--json PATH]
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
from pathlib import Path
from typing import Any

import app.store._sql as sql
from app.agent.messages import Context, UserMessage
from app.store.db import make_engine
from app.store.migrate import upgrade
from app.store.stores import Stores

CHECKS = (sql.verify_joined, sql.verify_rows)


def checks(on: bool) -> None:
    if on:
        sql.verify_joined, sql.verify_rows = CHECKS
    else:
        sql.verify_joined = sql.verify_rows = lambda *a, **k: None  # type: ignore[assignment]


async def measure(url: str, n: int, chars: int, reps: int) -> dict[str, Any]:
    await upgrade(url)
    engine = make_engine(url)
    try:
        conv = Stores(engine).conversations
        messages = tuple(UserMessage.text("x" * chars + str(i)) for i in range(n))
        await conv.delete_conversation("bench", "bench")
        await conv.replace_context("bench", "bench", Context(messages=messages), create=True)
        times: dict[str, list[float]] = {k: [] for k in ("get off", "get on", "run off", "run on")}
        for _ in range(reps):
            for on in (False, True):
                checks(on)
                start = time.perf_counter()
                (await conv.load_context_rows("bench", "bench")).context_json()
                times[f"get {'on' if on else 'off'}"].append(time.perf_counter() - start)
                start = time.perf_counter()
                await conv.load_context("bench", "bench")
                times[f"run {'on' if on else 'off'}"].append(time.perf_counter() - start)
        checks(True)
        size = len((await conv.load_context_rows("bench", "bench")).context_json())
        return {
            "engine": url.split(":", 1)[0],
            "messages": n,
            "bytes": size,
            **{k: round(statistics.median(v) * 1000, 2) for k, v in times.items()},
        }
    finally:
        await engine.dispose()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", default="50,2000")
    parser.add_argument("--chars", type=int, default=5000)
    parser.add_argument("--reps", type=int, default=25)
    parser.add_argument("--pg", help="a PostgreSQL URL to measure on too")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        urls = [f"sqlite:///{folder}/bench.db"] + ([args.pg] if args.pg else [])
        for url in urls:
            for n in (int(x) for x in args.messages.split(",")):
                rows.append(await measure(url, n, args.chars, args.reps))
    print("| engine | messages | MB | GET read, ms (no check → checked) | run read, ms |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['engine']} | {r['messages']} | {r['bytes'] / 1e6:.2f} | "
            f"{r['get off']} → {r['get on']} | {r['run off']} → {r['run on']} |"
        )
    if args.json:
        document = {"rows": rows, "loadavg": os.getloadavg(), "argv": sys.argv}
        args.json.write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
