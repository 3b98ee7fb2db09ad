"""Server CPU per run of two or more checkouts, their servers side by side, runs alternating in
blocks: a before/after that a shared machine's changing load moves less than sittings apart.

One ``carryover serve`` per checkout (``--app-root``, repeated; each on a database of its own),
all started first, each with a conversation of ``--messages`` messages and ``--warm`` runs. Then
``--blocks`` rounds: in each, every server in turn gets ``--block`` sequential runs (echo, or
``--provider`` against one fast fake they share, ``Prefer: return=minimal``) while its CPU
(utime + stime, bench/_common.py) is read before and after. A block's runs take turns on
conversations of ``--messages`` messages PUT for it before its CPU is read, so that no run is on
a conversation more than 20 messages longer (``_common.Conversations``): on one conversation,
which grows by two messages a run, a long sitting would measure ever longer provider requests. A
load that comes and goes lands on all of them within a round; the median of the blocks is the
figure to compare. The server CPU is read from ``/proc`` in clock ticks (10 ms): a block of 100
runs reads to about 2 %.

``--floor``: the floor app (shared/bench/floor_app.py) takes its turn in each round too, with
``--block`` requests, and each checkout's figure is also given over it: the ``10 ÷ floor``
ratio of ``provider_cost.py``, with the floor app measured in the same minutes as the runs
rather than once before them (the median of the rounds' ratios, and their spread).

    .venv/bin/python bench/alternate.py --app-root /tmp/before --app-root .
    .venv/bin/python bench/alternate.py --provider openai --app-root /tmp/before --app-root .
    .venv/bin/python bench/alternate.py --floor                 # this checkout ÷ the floor app

``--provider`` may name several (``echo,openai,anthropic``): each checkout then gets a server
per provider, all taking turns in each round, and each provider's figure is also given as its
difference over echo of the same checkout in the same round (the contract's "a provider run at
10 messages ≤ an echo run + 2 ms", measured where a drifting machine moves both alike).

    .venv/bin/python bench/alternate.py --floor --provider echo,openai,anthropic
"""

from __future__ import annotations

import argparse
import statistics
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import _common as c  # bench/_common.py: a script's folder is on sys.path
import httpx

#: what a floor app request sends (as provider_cost.py and instructions.py do)
FLOOR_BODY = {"prompts": [{"type": "user", "content": [{"type": "text", "text": "hi"}]}]}


def main() -> None:
    c.on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--provider",
        default="echo",
        help="echo, openai, openai-responses or anthropic, or several: echo,openai",
    )
    parser.add_argument("--engine", default="sqlite", choices=["sqlite", "postgresql"])
    parser.add_argument("--messages", type=int, default=10)
    parser.add_argument("--warm", type=int, default=50)
    parser.add_argument("--block", type=int, default=100, help="runs per block")
    parser.add_argument("--blocks", type=int, default=20, help="rounds of blocks")
    parser.add_argument("--app-root", type=Path, action="append", help="a checkout (repeatable)")
    parser.add_argument("--floor", action="store_true", help="the floor app takes turns too")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    roots = [root.resolve() for root in args.app_root or [c.ROOT]]
    providers = args.provider.split(",")
    known = {"echo", "openai", "openai-responses", "anthropic"}
    if not set(providers) <= known or len(set(providers)) < len(providers):
        parser.error(f"--provider: {', '.join(sorted(known))}, each once (not {args.provider})")
    print(f"alternate: {c.machine_note()}", flush=True)
    # a checkout named twice (to see the noise of the method itself) is measured twice
    checkouts = [
        str(root) if roots.count(root) == 1 else f"{root} (#{i + 1})"
        for i, root in enumerate(roots)
    ]
    # (label, checkout, its root, provider): one server each
    cases = [
        (checkout if len(providers) == 1 else f"{checkout}, {provider}", checkout, root, provider)
        for checkout, root in zip(checkouts, roots, strict=True)
        for provider in providers
    ]
    labels = [case[0] for case in cases]
    per_block: dict[str, list[float]] = {label: [] for label in labels}
    floor_blocks: list[float] = []
    with c.Procs() as procs, ExitStack() as stack:
        fakes = {p: c.start_fake(procs, p).url for p in providers if p != "echo"}
        floor = floor_http = None
        if args.floor:
            floor = c.start_floor(procs)
            floor_http = stack.enter_context(httpx.Client(base_url=floor.url, timeout=600))
            floor_http.put("/c/floor").raise_for_status()
            for _ in range(args.warm):
                floor_http.post("/c/floor/runs", json=FLOOR_BODY).raise_for_status()
        servers: list[tuple[str, c.Proc, httpx.Client]] = []
        for i, (label, _, root, provider) in enumerate(cases):
            url = c.database(args.engine, stack, procs.workdir, f"alternate{i}")
            env = c.server_env(url, provider, fakes.get(provider, ""), max(args.messages, 1_000))
            server = c.start_server(procs, env, app_root=root)
            http = stack.enter_context(httpx.Client(base_url=server.url, timeout=600))
            c.put_context_sync(http, "alternate", args.messages)
            for n in range(args.warm):
                c.run_minimal(http, "alternate", f"warm {n}")
            servers.append((label, server, http))
        for block in range(args.blocks):
            if floor is not None and floor_http is not None:
                before = c.cpu_seconds(floor.popen.pid)
                for _ in range(args.block):
                    floor_http.post("/c/floor/runs", json=FLOOR_BODY).raise_for_status()
                floor_blocks.append((c.cpu_seconds(floor.popen.pid) - before) / args.block * 1e3)
            for label, server, http in servers:
                # each block's runs on conversations of --messages (c.Conversations)
                convs = c.Conversations(http, f"block{block}", args.messages, args.block)
                before = c.cpu_seconds(server.popen.pid)
                for n in range(args.block):
                    c.run_minimal(http, convs.next(), c.prompt(n))
                cpu = (c.cpu_seconds(server.popen.pid) - before) / args.block * 1e3
                per_block[label].append(cpu)
            print(f"  block {block + 1}/{args.blocks} done", flush=True)
    header = ["checkout", "median ms/run", "mean", "min", "max"]
    rows: list[list[Any]] = [
        [
            label,
            f"{statistics.median(v):.2f}",
            f"{statistics.mean(v):.2f}",
            f"{min(v):.2f}",
            f"{max(v):.2f}",
        ]
        for label, v in per_block.items()
    ]
    print(
        f"\n{args.provider}, {args.engine}, {args.messages} messages: server CPU per run, "
        f"{args.blocks} blocks of {args.block} runs per server, alternating:\n"
    )
    if "echo" in providers and len(providers) > 1:
        header_echo = "minus echo, ms (rounds: median, min, max)"
        for row, (label, checkout, _, provider) in zip(rows, cases, strict=True):
            echo = per_block[next(c[0] for c in cases if c[1] == checkout and c[3] == "echo")]
            diffs = [run - base for run, base in zip(per_block[label], echo, strict=True)]
            row.append(
                "—"
                if provider == "echo"
                else f"{statistics.median(diffs):+.2f} ({min(diffs):+.2f} to {max(diffs):+.2f})"
            )
        header.append(header_echo)
    if floor_blocks:
        floor_median = statistics.median(floor_blocks)
        header += ["÷ floor (rounds: median, min, max)"]
        for row, v in zip(rows, per_block.values(), strict=True):
            ratios = [run / floor for run, floor in zip(v, floor_blocks, strict=True)]
            row.append(f"{statistics.median(ratios):.2f} ({min(ratios):.2f} to {max(ratios):.2f})")
        rows.append(
            [
                "floor app (shared/bench/floor_app.py)",
                f"{floor_median:.2f}",
                f"{statistics.mean(floor_blocks):.2f}",
                f"{min(floor_blocks):.2f}",
                f"{max(floor_blocks):.2f}",
                *(["—"] if "echo" in providers and len(providers) > 1 else []),
                "1",
            ]
        )
    print(c.table(header, rows))
    c.write_json(
        args.json,
        {
            "provider": args.provider,
            "engine": args.engine,
            "messages": args.messages,
            "block": args.block,
            "per_block_ms": per_block,
            "floor_per_block_ms": floor_blocks or None,
        },
    )


if __name__ == "__main__":
    main()
