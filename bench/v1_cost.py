"""Server CPU of a ``/v1/responses`` run against the same native run (echo provider, SQLite).

Two conversations start from the same stored context (10 or 1,000 messages); one takes native
runs (``POST /conversations/{id}/runs``, ``Prefer: return=minimal``), the other responses
(``POST /v1/responses`` with ``conversation``), alternating in rounds so a busy machine skews
both alike. Server CPU is the server process's utime + stime (bench/_common.py). Prints CPU ms
per run for each and their ratio (the target: at most 1.2)::

    .venv/bin/python bench/v1_cost.py [--sizes 10,1000] [--runs 60] [--json PATH]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    MINIMAL,
    Procs,
    check_run,
    cpu_seconds,
    fmt,
    machine_note,
    put_context_sync,
    server_env,
    start_server,
    table,
    write_json,
)

ROUND = 5  # runs of one kind before switching to the other


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", default="10,1000")
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows, figures = [], []
    with Procs() as procs:
        db = f"sqlite:///{procs.workdir / 'bench.db'}"
        server = start_server(procs, server_env(db, largest=max(sizes) + args.runs * 4))
        with httpx.Client(base_url=server.url, timeout=120) as http:
            for n in sizes:
                native_conv, v1_conv = f"native-{n}", f"v1-{n}"
                put_context_sync(http, native_conv, n)
                put_context_sync(http, v1_conv, n)
                spent = {"native": 0.0, "v1": 0.0}
                done = {"native": 0, "v1": 0}

                def native_run(i: int, conv: str = native_conv) -> None:
                    body = {"prompts": [f"question {i}"]}
                    check_run(http.post(f"/conversations/{conv}/runs", json=body, headers=MINIMAL))

                def v1_run(i: int, conv: str = v1_conv) -> None:
                    body = {"model": "default", "input": f"question {i}", "conversation": conv}
                    answer = http.post("/v1/responses", json=body)
                    if answer.status_code != 200 or answer.json()["status"] != "completed":
                        raise RuntimeError(f"response: {answer.status_code} {answer.text[:300]}")

                native_run(-1)  # warm both paths
                v1_run(-1)
                i = 0
                while min(done.values()) < args.runs:
                    for kind, run in (("native", native_run), ("v1", v1_run)):
                        before = cpu_seconds(server.pid)
                        for _ in range(ROUND):
                            run(i)
                            i += 1
                        spent[kind] += cpu_seconds(server.pid) - before
                        done[kind] += ROUND
                native_ms = spent["native"] / done["native"] * 1000
                v1_ms = spent["v1"] / done["v1"] * 1000
                ratio = v1_ms / native_ms if native_ms else float("nan")
                rows.append([n, fmt(native_ms, 2), fmt(v1_ms, 2), fmt(ratio, 2)])
                figures.append(
                    {"messages": n, "native_ms": native_ms, "v1_ms": v1_ms, "ratio": ratio}
                )
    print(table(["messages", "native run CPU ms", "/v1 response CPU ms", "ratio"], rows))
    print(machine_note())
    write_json(args.json, {"runs": args.runs, "figures": figures})


if __name__ == "__main__":
    main()
