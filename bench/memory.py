"""The memory a serving process holds under a soak of large prompts, against its cache bounds
(docs/operations.md, "Memory").

Starts ``carryover serve`` (the ``echo`` agent, which answers each prompt with its text, so a
run adds two messages of ``--chars`` characters each; SQLite in a temporary folder) once per
configuration, then runs ``--runs`` runs round-robin over ``--conversations`` conversations
(every conversation stays hot, so every context is a candidate for the cache) from
``--clients`` concurrent clients, and reads the server's resident memory (VmRSS) every
``--every`` runs. Configurations:

- ``bounded``: the context cache bounded in bytes at ``--cache-mib`` (the GET body cache
  likewise), as a deployment sets it;
- ``messages-only``: the byte bound lifted (``CARRYOVER_CONTEXT_CACHE_BYTES`` of 1 TiB), only
  the message-count bound (200,000 by default) left — how the cache was bounded before it
  counted bytes.

    .venv/bin/python bench/memory.py [--runs 3000] [--conversations 300] [--chars 20000]
        [--clients 4] [--every 250] [--cache-mib 64] [--configs bounded,messages-only]
        [--json PATH] [--plot PATH]

Prints, per configuration, the resident memory at start, at its peak and at the end, the
content the runs added, and the peak growth against the configured bound.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time
from pathlib import Path
from typing import Any

import httpx
from _common import (  # bench/_common.py: a script's folder is on sys.path
    Procs,
    fmt,
    on_sigterm,
    rss_mib,
    server_env,
    start_server,
    table,
    write_json,
)

MIB = 1024 * 1024


def config_env(name: str, cache_mib: int) -> dict[str, str]:
    if name == "bounded":
        return {
            "CARRYOVER_CONTEXT_CACHE_BYTES": str(cache_mib * MIB),
            "CARRYOVER_CONTEXT_BODY_CACHE_BYTES": str(cache_mib * MIB),
        }
    if name == "messages-only":
        return {
            "CARRYOVER_CONTEXT_CACHE_BYTES": str(1 << 40),
            "CARRYOVER_CONTEXT_BODY_CACHE_BYTES": str(cache_mib * MIB),
        }
    raise SystemExit(f"unknown configuration {name!r}: bounded or messages-only")


def prompt_text(run: int, chars: int) -> str:
    """A prompt of ``chars`` characters that no other run repeats (no two texts share storage)."""
    head = f"run {run}: "
    return head + ("abcdefghij" * (chars // 10 + 1))[: chars - len(head)]


async def soak(url: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    conversations = [f"mem-{i}" for i in range(args.conversations)]
    samples: list[tuple[int, float]] = []
    content = 0
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        for conv in conversations:
            answer = await http.post("/conversations", json={"id": conv})
            answer.raise_for_status()
        samples.append((0, rss_mib(pid)))
        order = itertools.cycle(conversations)
        done = 0
        lock = asyncio.Lock()

        async def client() -> None:
            nonlocal done, content
            while True:
                async with lock:
                    if done >= args.runs:
                        return
                    done += 1
                    run = done
                    conv = next(order)
                text = prompt_text(run, args.chars)
                answer = await http.post(
                    f"/conversations/{conv}/runs",
                    json={"prompts": [text]},
                    headers={"Prefer": "return=minimal"},
                )
                if answer.status_code != 201 or answer.json().get("status") != "completed":
                    raise RuntimeError(f"run {run}: {answer.status_code} {answer.text[:300]}")
                content += 2 * len(text)
                if run % args.every == 0:
                    samples.append((run, rss_mib(pid)))

        started = time.monotonic()
        await asyncio.gather(*(client() for _ in range(args.clients)))
        seconds = time.monotonic() - started
    samples.append((args.runs, rss_mib(pid)))
    samples.sort()
    return {"samples": samples, "content_mib": content / MIB, "seconds": seconds}


def main() -> None:
    on_sigterm()
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3000)
    parser.add_argument("--conversations", type=int, default=300)
    parser.add_argument("--chars", type=int, default=20_000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--every", type=int, default=250)
    parser.add_argument("--cache-mib", type=int, default=64)
    parser.add_argument("--configs", default="bounded,messages-only")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args()
    results: list[dict[str, Any]] = []
    for name in args.configs.split(","):
        with Procs() as procs:
            env = server_env(
                f"sqlite:///{procs.workdir}/memory.db",
                extra={
                    **config_env(name, args.cache_mib),
                    "CARRYOVER_MAX_BODY_BYTES": str(max(8 * MIB, 4 * args.chars)),
                },
            )
            server = start_server(procs, env, name=f"carryover-{name}")
            measured = asyncio.run(soak(server.url, server.pid, args))
        rss = [mib for _, mib in measured["samples"]]
        results.append(
            {
                "config": name,
                "cache_bound_mib": args.cache_mib if name == "bounded" else None,
                "rss_start_mib": rss[0],
                "rss_peak_mib": max(rss),
                "rss_end_mib": rss[-1],
                "growth_mib": max(rss) - rss[0],
                "content_mib": measured["content_mib"],
                "runs_per_s": args.runs / measured["seconds"],
                "samples": measured["samples"],
            }
        )
    print(
        table(
            [
                "configuration",
                "cache bound MiB",
                "content added MiB",
                "RSS start MiB",
                "RSS peak MiB",
                "RSS end MiB",
                "peak growth MiB",
                "runs/s",
            ],
            [
                [
                    r["config"],
                    r["cache_bound_mib"] if r["cache_bound_mib"] is not None else "none",
                    fmt(r["content_mib"]),
                    fmt(r["rss_start_mib"]),
                    fmt(r["rss_peak_mib"]),
                    fmt(r["rss_end_mib"]),
                    fmt(r["growth_mib"]),
                    fmt(r["runs_per_s"]),
                ]
                for r in results
            ],
        )
    )
    write_json(args.json, {"results": results})
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        for r in results:
            xs = [run for run, _ in r["samples"]]
            ax.plot(xs, [mib for _, mib in r["samples"]], marker=".", label=r["config"])
        ax.axhline(results[0]["rss_start_mib"] + args.cache_mib, linestyle=":", color="grey")
        ax.set_xlabel("runs")
        ax.set_ylabel("server RSS, MiB")
        ax.set_title(f"{args.chars:,}-character prompts, {args.conversations} conversations")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)


if __name__ == "__main__":
    main()
