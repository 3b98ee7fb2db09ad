"""What one ``carryover serve`` sustains in front of a provider: runs/s and the latency it adds.

Concurrency figures and the LiteLLM comparison. In front of shared/bench/fake_openai.py
(one process, answering at once), for each engine (SQLite in a temporary directory; PostgreSQL
in a fresh database on 127.0.0.1:5432, dropped afterwards) and each worker count
(``carryover serve --workers N``), at each number of concurrent clients:

- every client has its own conversation (a context of ``--start-messages`` PUT first), makes one
  warm run, then its share of the level's runs back to back (``Prefer: return=minimal``): the
  level's runs are bounded, so it ends by itself;
- runs/s over the measured phase, the client's p50 / p99 latency, the server's CPU per run
  (utime + stime of the server and its workers);
- the latency Carryover ADDS: the client's p50 (p99) minus the fake's own p50 (p99), measured
  by calling the fake directly with the request Carryover sends it (system prompt + the history
  as it grows + the prompt, ``stream: true`` with usage, the whole event stream read), at the
  same concurrency, with the same counts, from the same client process. Percentiles are
  subtracted, not paired requests: read the p99 difference as an estimate.

Then the yardstick the targets name: LiteLLM's proxy (``litellm[proxy]``, one worker) in front of
the same fake, its clients sending the whole history each time (LiteLLM stores nothing), with
``stream: false``; its added latency is taken against the fake called the same way
(``stream: false``). LiteLLM lives in its own venv (bench/README.md); ``--litellm VENV`` (or
CARRYOVER_BENCH_LITELLM) points at it, default /work/bench-venvs/litellm; the row is skipped
with a message when it is absent.

    .venv/bin/python bench/concurrency.py                      # ~5 min on a quiet 2-core box
    .venv/bin/python bench/concurrency.py --engines sqlite --workers 1 --clients 1,16 \\
        --runs-per-level 32 --no-litellm                       # a quick look
    .venv/bin/python bench/concurrency.py --json docs/perf/concurrency.json

The client is Python (httpx + asyncio) on the same 2 cores: at 64 clients it competes with the
server for CPU, in the baseline as in the measured rows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import _common as c  # bench/_common.py: a script's folder is on sys.path
import httpx

DEFAULT_LITELLM = Path("/work/bench-venvs/litellm")


@dataclass
class Load:
    """One level of one system: what the clients saw."""

    system: str  # carryover, litellm, fake-stream, fake-json
    engine: str
    workers: int
    clients: int
    runs: int
    errors: int
    seconds: float
    runs_per_s: float
    p50_ms: float
    p99_ms: float
    cpu_ms_per_run: float | None = None
    fake_p50_ms: float | None = None
    fake_p99_ms: float | None = None
    added_p50_ms: float | None = None
    added_p99_ms: float | None = None
    first_error: str = ""


def per_client(level: int, total: int, least: int) -> int:
    return max(least, math.ceil(total / level))


async def drive(
    clients: int,
    runs_each: int,
    one: Callable[[int, int], Awaitable[None]],
) -> tuple[list[float], int, float, str]:
    """``clients`` tasks, each making ``runs_each`` calls of ``one(client, i)`` in a row: the
    latencies of those that succeeded, the errors, the wall time, the first error's text."""
    times: list[float] = []
    errors = 0
    first = ""

    async def client(j: int) -> None:
        nonlocal errors, first
        for i in range(runs_each):
            began = time.perf_counter()
            try:
                await one(j, i)
            except (RuntimeError, httpx.HTTPError, ValueError, KeyError) as exc:
                errors += 1
                first = first or f"{type(exc).__name__}: {exc}"[:300]
                continue
            times.append(time.perf_counter() - began)

    began = time.perf_counter()
    await asyncio.gather(*(client(j) for j in range(clients)))
    return times, errors, time.perf_counter() - began, first


def limits(clients: int) -> httpx.Limits:
    # idle connections dropped before uvicorn's 5 s keep-alive closes them under a request
    # (a ReadError at 64 clients otherwise)
    return httpx.Limits(
        max_connections=clients + 8, max_keepalive_connections=clients + 8, keepalive_expiry=2.0
    )


TIMEOUT = httpx.Timeout(120)


# --- stateless callers: the fake directly, LiteLLM ----------------------------------------------


def openai_history(start: int) -> list[dict[str, Any]]:
    """What Carryover sends for a context of ``start`` messages: the system prompt, then them."""
    out: list[dict[str, Any]] = [{"role": "system", "content": c.SYSTEM_PROMPT}]
    for m in c.wire_messages(start):
        out.append({"role": m["type"], "content": m["content"][0]["text"]})
    return out


class Stateless:
    """Clients that hold their history themselves and POST it whole to a Chat Completions URL,
    appending the prompt and the answer each time, as Carryover does for them."""

    def __init__(self, http: httpx.AsyncClient, url: str, clients: int, start: int, stream: bool):
        self.http, self.url, self.stream = http, url, stream
        self.histories = [openai_history(start) for _ in range(clients)]

    async def call(self, j: int, i: int) -> None:
        history = self.histories[j]
        history.append({"role": "user", "content": c.prompt(i)})
        body: dict[str, Any] = {"model": "fake-model", "messages": history}
        if self.stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
            async with self.http.stream("POST", self.url, json=body) as answer:
                data = b"".join([part async for part in answer.aiter_bytes()])
                if answer.status_code != 200 or b"[DONE]" not in data:
                    raise RuntimeError(f"stream: {answer.status_code} {data[:300]!r}")
            text = f"ok: {len(history)} messages"  # what the fake answers
        else:
            answer = await self.http.post(self.url, json=body)
            if answer.status_code != 200:
                raise RuntimeError(f"{answer.status_code} {answer.text[:300]}")
            text = answer.json()["choices"][0]["message"]["content"]
        history.append({"role": "assistant", "content": text})


async def stateless_level(
    system: str, url: str, clients: int, runs_each: int, start: int, stream: bool, pid: int | None
) -> Load:
    async with httpx.AsyncClient(timeout=TIMEOUT, limits=limits(clients)) as http:
        caller = Stateless(http, url, clients, start, stream)
        await drive(clients, 1, lambda j, i: caller.call(j, -1 - i))  # warm, as a run's warm run
        before = c.cpu_seconds(pid) if pid else 0.0
        times, errors, took, first = await drive(clients, runs_each, caller.call)
        cpu = c.cpu_seconds(pid) - before if pid else None
    return summarize(system, "—", 1, clients, times, errors, took, cpu, first)


def summarize(
    system: str,
    engine: str,
    workers: int,
    clients: int,
    times: list[float],
    errors: int,
    took: float,
    cpu: float | None,
    first: str,
) -> Load:
    done = len(times)
    return Load(
        system=system,
        engine=engine,
        workers=workers,
        clients=clients,
        runs=done,
        errors=errors,
        seconds=took,
        runs_per_s=done / took if took else 0.0,
        p50_ms=statistics.median(times) * 1000 if times else float("nan"),
        p99_ms=c.percentile(times, 0.99) * 1000,
        cpu_ms_per_run=None if cpu is None else cpu / max(1, done) * 1000,
        first_error=first,
    )


def against(load: Load, base: Load) -> Load:
    load.fake_p50_ms, load.fake_p99_ms = base.p50_ms, base.p99_ms
    load.added_p50_ms = load.p50_ms - base.p50_ms
    load.added_p99_ms = load.p99_ms - base.p99_ms
    return load


# --- Carryover ----------------------------------------------------------------------------------


async def carryover_level(
    server: c.Proc, engine: str, workers: int, clients: int, runs_each: int, start: int
) -> Load:
    tag = f"w{workers}-c{clients}"
    async with httpx.AsyncClient(
        base_url=server.url, timeout=TIMEOUT, limits=limits(clients)
    ) as http:
        for j in range(clients):
            await c.put_context(http, f"{tag}-{j}", start)

        async def run(j: int, i: int) -> None:
            answer = await http.post(
                f"/conversations/{tag}-{j}/runs",
                json={"prompts": [c.prompt(i)]},
                headers=c.MINIMAL,
            )
            c.check_run(answer)

        await drive(clients, 1, lambda j, i: run(j, -1 - i))  # warm
        before = c.cpu_seconds(server.pid)
        times, errors, took, first = await drive(clients, runs_each, run)
        cpu = c.cpu_seconds(server.pid) - before
    return summarize("carryover", engine, workers, clients, times, errors, took, cpu, first)


# --- LiteLLM ------------------------------------------------------------------------------------


def litellm_config(path: Path, fake_url: str) -> Path:
    # JSON is YAML: no yaml dependency here
    config = {
        "model_list": [
            {
                "model_name": "fake-model",
                "litellm_params": {
                    "model": "openai/fake-model",
                    "api_base": fake_url,
                    "api_key": "sk-fake",
                },
            }
        ],
        "litellm_settings": {"telemetry": False, "drop_params": True, "num_retries": 0},
        # no key, as the Carryover server here has none (loopback only): the same auth work
        "general_settings": {
            "disable_spend_logs": True,
            "dangerously_permit_weak_or_unset_master_key": True,
        },
    }
    path.write_text(json.dumps(config, indent=2))
    return path


def start_litellm(procs: c.Procs, venv: Path, fake_url: str) -> c.Proc:
    port = c.free_port()
    config = litellm_config(procs.workdir / "litellm.yaml", fake_url)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("LITELLM_", "OPENAI_", "DATABASE_URL", "HTTP_PROXY", "HTTPS_PROXY"))
    }
    env |= {
        # its model price map from the package, not fetched: nothing leaves 127.0.0.1
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_LOG": "ERROR",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }
    argv = [str(venv / "bin" / "litellm"), "--config", str(config)]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
    proc = procs.start(f"litellm-{port}", argv, env=env)
    proc.url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240
    while True:
        if proc.popen.poll() is not None:
            raise RuntimeError(f"litellm exited ({proc.popen.returncode}):\n{proc.tail()}")
        try:
            if httpx.get(f"{proc.url}/health/liveliness", timeout=5).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"litellm did not come up:\n{proc.tail()}")
        time.sleep(0.5)


# --- output -------------------------------------------------------------------------------------


def report(loads: list[Load]) -> str:
    rows = []
    for r in loads:
        rows.append(
            [
                r.system,
                r.engine,
                r.workers,
                r.clients,
                r.runs,
                c.fmt(r.runs_per_s),
                c.fmt(r.p50_ms),
                c.fmt(r.p99_ms),
                c.fmt(r.fake_p50_ms),
                c.fmt(r.fake_p99_ms),
                c.fmt(r.added_p50_ms),
                c.fmt(r.added_p99_ms),
                c.fmt(r.cpu_ms_per_run),
                r.errors,
            ]
        )
    header = ["system", "engine", "workers", "clients", "runs", "runs/s", "p50 ms", "p99 ms"]
    header += ["fake p50", "fake p99", "added p50", "added p99", "server CPU ms/run", "errors"]
    return c.table(header, rows)


def verdict(loads: list[Load], level: int = 16) -> str:
    lite = [r for r in loads if r.system == "litellm" and r.clients == level]
    ours = [r for r in loads if r.system == "carryover" and r.clients == level and r.workers == 1]
    if not lite or not ours or lite[0].added_p50_ms is None:
        return ""
    out = [f"\nadded p50 at {level} clients, one worker (target: Carryover ≤ LiteLLM):"]
    for r in ours:
        assert r.added_p50_ms is not None and lite[0].added_p50_ms is not None
        ratio = r.added_p50_ms / lite[0].added_p50_ms if lite[0].added_p50_ms > 0 else math.inf
        ok = "✓" if r.added_p50_ms <= lite[0].added_p50_ms else "✗"
        out.append(
            f"  carryover/{r.engine} {r.added_p50_ms:.1f} ms vs litellm "
            f"{lite[0].added_p50_ms:.1f} ms: {ratio:.2f}x {ok}"
        )
    return "\n".join(out)


def plot(loads: list[Load], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    measured = [r for r in loads if r.added_p50_ms is not None]
    for key in dict.fromkeys((r.system, r.engine, r.workers) for r in measured):
        mine = [r for r in measured if (r.system, r.engine, r.workers) == key]
        label = key[0] if key[0] == "litellm" else f"{key[0]}/{key[1]}/{key[2]}w"
        xs = [r.clients for r in mine]
        left.plot(xs, [r.added_p50_ms for r in mine], marker="o", label=label)
        right.plot(xs, [r.runs_per_s for r in mine], marker="o", label=label)
    for ax, what in ((left, "added p50 latency (ms)"), (right, "runs/s")):
        ax.set_xscale("log")
        ticks = sorted({r.clients for r in measured})
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(what)
        ax.grid(True, which="both", alpha=0.3)
    left.legend(fontsize="small")
    fig.suptitle("In front of a fast provider fake")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"plot: {path}")


def main() -> None:
    c.on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="1,16,64", help="concurrency levels")
    parser.add_argument("--engines", default="sqlite,postgresql")
    parser.add_argument("--workers", default="1,2", help="carryover serve --workers, each")
    parser.add_argument(
        "--runs-per-level", type=int, default=128, help="measured runs per level (shared out)"
    )
    parser.add_argument("--min-runs-per-client", type=int, default=2)
    parser.add_argument("--start-messages", type=int, default=10, help="each context's start")
    parser.add_argument(
        "--litellm",
        type=Path,
        default=Path(os.environ.get("CARRYOVER_BENCH_LITELLM", DEFAULT_LITELLM)),
        help="the venv holding litellm[proxy] (default: $CARRYOVER_BENCH_LITELLM or %(default)s)",
    )
    parser.add_argument("--no-litellm", action="store_true")
    parser.add_argument("--app-root", type=Path, default=c.ROOT, help="the checkout served")
    parser.add_argument(
        "--server-env", action="append", default=[], metavar="NAME=VALUE", help="for the server"
    )
    parser.add_argument("--json", type=Path, help="write the figures there")
    parser.add_argument("--plot", type=Path, help="write a PNG plot there")
    args = parser.parse_args()
    levels = [int(x) for x in args.clients.split(",")]
    engines = [e for e in args.engines.split(",") if e]
    worker_counts = [int(x) for x in args.workers.split(",")]
    start = args.start_messages

    began = time.monotonic()
    print(f"concurrency: {c.machine_note()}", flush=True)
    loads: list[Load] = []
    baseline: dict[tuple[bool, int], Load] = {}
    skipped: dict[str, str] = {}
    with c.Procs() as procs:
        fake = c.start_fake(procs, "openai")
        url = f"{fake.url}/chat/completions"
        lite_venv = None if args.no_litellm else args.litellm
        if lite_venv and not (lite_venv / "bin" / "litellm").exists():
            skipped["litellm"] = (
                f"no litellm in {lite_venv} (bench/README.md: install litellm[proxy] into its "
                "own venv, then --litellm VENV)"
            )
            lite_venv = None
        elif args.no_litellm:
            skipped["litellm"] = "--no-litellm"
        streams = [True] + ([False] if lite_venv else [])
        for level in levels:
            each = per_client(level, args.runs_per_level, args.min_runs_per_client)
            for stream in streams:
                name = "fake-stream" if stream else "fake-json"
                base = asyncio.run(stateless_level(name, url, level, each, start, stream, None))
                baseline[stream, level] = base
                loads.append(base)
                print(
                    f"  {name:11} {level:>3} clients: p50 {base.p50_ms:7.1f} ms,"
                    f" p99 {base.p99_ms:7.1f} ms, {base.runs_per_s:6.1f} /s",
                    flush=True,
                )

        for engine in engines:
            for workers in worker_counts:
                with ExitStack() as db:
                    db_url = c.database(engine, db, procs.workdir, f"conc-{engine}-{workers}")
                    extra = dict(item.split("=", 1) for item in args.server_env)
                    env = c.server_env(db_url, "openai", fake.url, 1000, extra)
                    server = c.start_server(
                        procs, env, workers=workers, app_root=args.app_root.resolve()
                    )
                    try:
                        for level in levels:
                            each = per_client(level, args.runs_per_level, args.min_runs_per_client)
                            load = asyncio.run(
                                carryover_level(server, engine, workers, level, each, start)
                            )
                            loads.append(against(load, baseline[True, level]))
                            print(
                                f"  carryover/{engine}/{workers}w {level:>3} clients:"
                                f" {load.runs_per_s:6.1f} runs/s, added p50 "
                                f"{load.added_p50_ms:7.1f} ms, p99 {load.added_p99_ms:7.1f} ms,"
                                f" {load.errors} errors",
                                flush=True,
                            )
                    finally:
                        procs.stop(server)

        if lite_venv:
            try:
                lite = start_litellm(procs, lite_venv, fake.url)
            except RuntimeError as exc:
                skipped["litellm"] = str(exc)[-600:]
                print(f"  litellm: skipped: {skipped['litellm']}", flush=True)
                lite = None
            if lite:
                try:
                    for level in levels:
                        each = per_client(level, args.runs_per_level, args.min_runs_per_client)
                        load = asyncio.run(
                            stateless_level(
                                "litellm",
                                f"{lite.url}/v1/chat/completions",
                                level,
                                each,
                                start,
                                False,
                                lite.pid,
                            )
                        )
                        loads.append(against(load, baseline[False, level]))
                        print(
                            f"  litellm {level:>3} clients: {load.runs_per_s:6.1f} /s, added p50"
                            f" {load.added_p50_ms:7.1f} ms, p99 {load.added_p99_ms:7.1f} ms,"
                            f" {load.errors} errors",
                            flush=True,
                        )
                finally:
                    procs.stop(lite)

    print()
    print(report(loads))
    print(verdict(loads))
    for r in loads:
        if r.first_error:
            print(f"\n{r.system}/{r.engine}/{r.workers}w/{r.clients}: first error: {r.first_error}")
    for what, why in skipped.items():
        print(f"\n{what}: skipped: {why}")
    took = time.monotonic() - began
    print(f"\n{took:.0f} s; {c.machine_note()}")
    c.write_json(
        args.json,
        {
            "start_messages": start,
            "loads": [asdict(r) for r in loads],
            "skipped": skipped,
            "seconds": took,
        },
    )
    if args.plot and loads:
        plot(loads, args.plot)


if __name__ == "__main__":
    main()
