"""Server CPU per run on the real provider path, by conversation length, and the worst /healthz.

The provider path's cost targets (docs/performance.md). For each provider mode it starts a
fresh ``carryover serve`` (SQLite in a temporary directory unless ``--engine postgresql``) in
front of a fast fake (shared/bench/fake_openai.py, fake_anthropic.py, and
bench/fake_responses.py for the Responses API: they answer at once), PUTs a context of each
size (200-character texts), runs it a few times with ``Prefer: return=minimal`` and prints
(the runs of a size take turns on as many conversations of that size as keep each within 20
messages, or a tenth of the size, of it: ``_common.Conversations``; and the sizes take turns,
in ``--rounds`` rounds, so that a drift in the machine's load moves them alike):

- the server's CPU per run (utime + stime of the server process and its children, from
  /proc/PID/stat; the fake's and the client's time are not counted), less what the /healthz
  probe's requests cost it (calibrated by 200 sequential /healthz first; the raw figure is
  shown too), and the run's p50 latency;
- the worst ``/healthz`` answer during the measured runs (polled every 50 ms from a thread);
- the floor app's CPU per request (shared/bench/floor_app.py, served by uvicorn from this venv:
  FastAPI + pydantic + aiosqlite doing the writes a stored-state run must do);
- the ratios the targets are stated in: CPU at 4,000 ÷ at 10 (≤ 1.5), at 20,000 ÷ at 10 (≤ 3),
  at 10 ÷ the floor (≤ 2), and /healthz worst at 20,000 (< 100 ms).

The modes: ``echo``; ``openai``, ``openai-responses`` and ``anthropic`` as configured by the
environment (they stream from the provider; each answer of ``openai-responses`` holds a
reasoning item, replayed by every later request); ``openai-nostream``,
``openai-responses-nostream`` and ``anthropic-nostream``, the same through a
CARRYOVER_CONFIG_FILE whose default profile says ``stream = false``. A checkout whose profiles do
not know ``stream`` refuses that file at startup: the row is skipped with the server's message.

    .venv/bin/python bench/provider_cost.py                         # all modes, ~4 min (idle box)
    .venv/bin/python bench/provider_cost.py --modes openai,echo --sizes 10,4000 --runs 20,8
    .venv/bin/python bench/provider_cost.py --json docs/perf/provider-cost.json \\
        --plot docs/perf/provider-cost.png

``--app-root DIR`` runs the server of another checkout (e.g. a ``git worktree`` of an older
commit) with the same client, for "before" figures.
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import _common as c  # bench/_common.py: a script's folder is on sys.path
import httpx

MODES = [
    "echo",
    "openai",
    "openai-nostream",
    "openai-responses",
    "openai-responses-nostream",
    "anthropic",
    "anthropic-nostream",
]
TARGET_4000, TARGET_20000, TARGET_FLOOR, TARGET_HEALTHZ_MS = 1.5, 3.0, 2.0, 100.0


@dataclass
class Row:
    mode: str
    messages: int
    runs: int
    cpu_ms_per_run: float  # the probe's own requests taken out (below)
    raw_cpu_ms_per_run: float  # all the server's CPU during the runs, probe included
    p50_ms: float
    p90_ms: float
    healthz_worst_ms: float
    healthz_probes: int
    rss_mib: float


def healthz_cpu(http: httpx.Client, server: c.Proc, times: int = 200) -> float:
    """The server's CPU per ``GET /healthz``: what the probe's requests cost it, to take out
    of the runs' figure (at 10 messages they would otherwise add a few ms per run)."""
    for _ in range(20):
        http.get("/healthz")
    before = c.cpu_seconds(server.pid)
    for _ in range(times):
        http.get("/healthz").raise_for_status()
    return (c.cpu_seconds(server.pid) - before) / times


@dataclass
class _Tally:
    """What the runs at one size added up to, over the rounds."""

    cpu: float = 0.0
    probes: int = 0
    worst: float = 0.0
    times: list[float] = field(default_factory=list)


def _share(k: int, rounds: int, i: int) -> int:
    """Round ``i``'s share of ``k`` runs (spread as evenly as they go)."""
    return k // rounds + (1 if i < k % rounds else 0)


def measure_mode(
    http: httpx.Client,
    server: c.Proc,
    mode: str,
    sizes: list[int],
    runs: list[int],
    rounds: int = 1,
) -> list[Row]:
    """The runs at each size, in ``rounds`` rounds that take the sizes in turn (forward, then
    backward): a machine whose load drifts during a sitting moves every size's figure alike,
    not one size's alone, so the ratios between sizes hold still."""
    per_probe = healthz_cpu(http, server)
    convs: dict[int, c.Conversations] = {}
    for n, k in zip(sizes, runs, strict=True):
        # warm: caches, connections, first-run costs (more for the first, cheap, size); the
        # runs on conversations of n messages, none grown past n + max(20, n / 10)
        warm = max(2, min(10, k // 4))
        convs[n] = c.Conversations(http, f"cost-{n}", n, k, warm=1)
        for w in range(max(0, warm - len(convs[n].ids))):
            c.run_minimal(http, convs[n].next(), f"warm {w}")
    tallies = {n: _Tally() for n in sizes}
    done = dict.fromkeys(sizes, 0)
    for i in range(rounds):
        order = list(zip(sizes, runs, strict=True))
        for n, k in order if i % 2 == 0 else reversed(order):
            tally = tallies[n]
            with c.HealthProbe(server.url) as probe:
                before = c.cpu_seconds(server.pid)
                for _ in range(_share(k, rounds, i)):
                    began = time.perf_counter()
                    answer = http.post(
                        f"/conversations/{convs[n].next()}/runs",
                        json={"prompts": [c.prompt(done[n])]},
                        headers=c.MINIMAL,
                    )
                    tally.times.append(time.perf_counter() - began)
                    c.check_run(answer)
                    done[n] += 1
                tally.cpu += c.cpu_seconds(server.pid) - before
            tally.probes += probe.count
            tally.worst = max(tally.worst, probe.worst)
    rows = []
    for n, k in zip(sizes, runs, strict=True):
        t = tallies[n]
        rows.append(
            Row(
                mode=mode,
                messages=n,
                runs=k,
                cpu_ms_per_run=max(0.0, t.cpu - t.probes * per_probe) / k * 1000,
                raw_cpu_ms_per_run=t.cpu / k * 1000,
                p50_ms=statistics.median(t.times) * 1000,
                p90_ms=c.percentile(t.times, 0.9) * 1000,
                healthz_worst_ms=t.worst * 1000,
                healthz_probes=t.probes,
                rss_mib=c.rss_mib(server.pid),
            )
        )
        r = rows[-1]
        print(
            f"  {mode:19} {n:>6} msgs: CPU {r.cpu_ms_per_run:9.1f} ms/run, p50 {r.p50_ms:9.1f} ms,"
            f" /healthz worst {r.healthz_worst_ms:7.0f} ms",
            flush=True,
        )
    return rows


def floor_cpu(procs: c.Procs, requests: int) -> float:
    """CPU ms per ``POST /c/{id}/runs`` of the floor app over ``requests`` sequential requests."""
    floor = c.start_floor(procs)
    body = {"prompts": [{"type": "user", "content": [{"type": "text", "text": "hi"}]}]}
    try:
        with httpx.Client(base_url=floor.url, timeout=60) as http:
            http.put("/c/floor").raise_for_status()
            for _ in range(10):
                http.post("/c/floor/runs", json=body).raise_for_status()
            before = c.cpu_seconds(floor.pid)
            for _ in range(requests):
                http.post("/c/floor/runs", json=body).raise_for_status()
            return (c.cpu_seconds(floor.pid) - before) / requests * 1000
    finally:
        procs.stop(floor)


def ratios(rows: list[Row], floor_ms: float | None, sizes: list[int]) -> list[dict[str, Any]]:
    out = []
    for mode in dict.fromkeys(r.mode for r in rows):
        by = {r.messages: r for r in rows if r.mode == mode}
        base = by.get(10) or by.get(min(sizes))
        entry: dict[str, Any] = {"mode": mode}
        if base:
            for n, target in ((4000, TARGET_4000), (20000, TARGET_20000)):
                if n in by:
                    value = by[n].cpu_ms_per_run / base.cpu_ms_per_run
                    entry[f"cpu_{n}_over_{base.messages}"] = value
                    entry[f"cpu_{n}_over_{base.messages}_ok"] = value <= target
            if floor_ms:
                value = base.cpu_ms_per_run / floor_ms
                entry[f"cpu_{base.messages}_over_floor"] = value
                entry[f"cpu_{base.messages}_over_floor_ok"] = value <= TARGET_FLOOR
        largest = max(by)
        entry["healthz_worst_ms_at_largest"] = by[largest].healthz_worst_ms
        entry["largest"] = largest
        entry["healthz_ok"] = by[largest].healthz_worst_ms < TARGET_HEALTHZ_MS
        out.append(entry)
    return out


def report(rows: list[Row], floor_ms: float | None, found: list[dict[str, Any]]) -> str:
    out = [
        c.table(
            [
                "mode",
                "messages",
                "runs",
                "server CPU ms/run",
                "(probe in)",
                "run p50 ms",
                "run p90 ms",
                "/healthz worst ms",
                "server RSS MiB",
            ],
            [
                [
                    r.mode,
                    f"{r.messages:,}",
                    r.runs,
                    c.fmt(r.cpu_ms_per_run),
                    c.fmt(r.raw_cpu_ms_per_run),
                    c.fmt(r.p50_ms),
                    c.fmt(r.p90_ms),
                    c.fmt(r.healthz_worst_ms, 0),
                    c.fmt(r.rss_mib, 0),
                ]
                for r in rows
            ],
        )
    ]
    if floor_ms is not None:
        out.append(f"\nfloor app (shared/bench/floor_app.py): {floor_ms:.2f} ms CPU per request")

    def cell(entry: dict[str, Any], key: str, target: float) -> str:
        if key not in entry:
            return "—"
        return f"{entry[key]:.2f} {'✓' if entry[key + '_ok'] else '✗'} (≤ {target:g})"

    out.append("")
    out.append(
        c.table(
            ["mode", "4,000 ÷ 10", "20,000 ÷ 10", "10 ÷ floor", "/healthz worst at largest"],
            [
                [
                    e["mode"],
                    cell(e, "cpu_4000_over_10", TARGET_4000),
                    cell(e, "cpu_20000_over_10", TARGET_20000),
                    cell(e, "cpu_10_over_floor", TARGET_FLOOR),
                    f"{e['healthz_worst_ms_at_largest']:.0f} ms at {e['largest']:,} "
                    f"{'✓' if e['healthz_ok'] else '✗'} (< {TARGET_HEALTHZ_MS:g})",
                ]
                for e in found
            ],
        )
    )
    return "\n".join(out)


def plot(rows: list[Row], floor_ms: float | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for mode in dict.fromkeys(r.mode for r in rows):
        mine = [r for r in rows if r.mode == mode]
        ax.plot(
            [r.messages for r in mine], [r.cpu_ms_per_run for r in mine], marker="o", label=mode
        )
    if floor_ms:
        ax.axhline(floor_ms, color="grey", linestyle=":", label="floor app")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("messages in the conversation")
    ax.set_ylabel("server CPU per run (ms)")
    ax.set_title("Server CPU per run through a provider fake")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"plot: {path}")


def main() -> None:
    c.on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default=",".join(MODES), help=f"default: {','.join(MODES)}")
    parser.add_argument("--sizes", default="10,4000,20000", help="message counts")
    parser.add_argument(
        "--runs", default="40,12,6", help="measured runs per size (one number: the same for all)"
    )
    parser.add_argument(
        "--rounds", type=int, default=4, help="rounds that take the sizes in turn (1: one by one)"
    )
    parser.add_argument("--floor-requests", type=int, default=300, help="0: no floor app")
    parser.add_argument("--engine", default="sqlite", choices=["sqlite", "postgresql"])
    parser.add_argument("--app-root", type=Path, default=c.ROOT, help="the checkout served")
    parser.add_argument("--json", type=Path, help="write the figures there")
    parser.add_argument("--plot", type=Path, help="write a PNG plot there")
    args = parser.parse_args()

    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            parser.error(f"unknown mode {m!r} ({', '.join(MODES)})")
    sizes = [int(s) for s in args.sizes.split(",")]
    runs = [int(s) for s in args.runs.split(",")]
    runs = runs * len(sizes) if len(runs) == 1 else runs
    if len(runs) != len(sizes):
        parser.error("--runs: one number, or one per size")

    began = time.monotonic()
    print(f"provider_cost: {c.machine_note()}", flush=True)
    rows: list[Row] = []
    skipped: dict[str, str] = {}
    floor_ms = None
    with c.Procs() as procs, ExitStack() as dbs:
        if args.floor_requests:
            floor_ms = floor_cpu(procs, args.floor_requests)
            print(f"  floor app: {floor_ms:.2f} ms CPU per request", flush=True)
        fakes: dict[str, c.Proc] = {}
        for mode in modes:
            provider = mode.removesuffix("-nostream")
            extra: dict[str, str] = {}
            fake_url = ""
            if provider != "echo":
                if provider not in fakes:
                    fakes[provider] = c.start_fake(procs, provider)
                fake_url = fakes[provider].url
            if mode.endswith("-nostream"):
                toml = procs.workdir / f"agents-{mode}.toml"
                c.agents_toml(toml, provider, fake_url, stream=False)
                extra["CARRYOVER_CONFIG_FILE"] = str(toml)
            url = c.database(args.engine, dbs, procs.workdir, f"cost-{mode}")
            env = c.server_env(url, provider, fake_url, max(sizes), extra)
            try:
                server = c.start_server(procs, env, app_root=args.app_root.resolve(), name=mode)
            except RuntimeError as exc:
                if not mode.endswith("-nostream"):
                    raise
                why = str(exc).strip().splitlines()[-1].strip()[:300]
                skipped[mode] = f"the server refused a profile with stream = false: {why}"
                print(f"  {mode}: skipped ({skipped[mode]})", flush=True)
                continue
            try:
                with httpx.Client(base_url=server.url, timeout=httpx.Timeout(600)) as http:
                    rows += measure_mode(http, server, mode, sizes, runs, max(1, args.rounds))
            finally:
                procs.stop(server)

    found = ratios(rows, floor_ms, sizes)
    print()
    print(report(rows, floor_ms, found))
    for mode, why in skipped.items():
        print(f"\n{mode}: skipped: {why}")
    took = time.monotonic() - began
    print(f"\n{took:.0f} s; {c.machine_note()}")
    c.write_json(
        args.json,
        {
            "engine": args.engine,
            "rounds": max(1, args.rounds),
            "rows": [asdict(r) for r in rows],
            "floor_cpu_ms_per_request": floor_ms,
            "ratios": found,
            "skipped": skipped,
            "seconds": took,
        },
    )
    if args.plot and rows:
        plot(rows, floor_ms, args.plot)


if __name__ == "__main__":
    main()
