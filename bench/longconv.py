"""What a run costs as a conversation grows: Carryover over HTTP next to LangGraph in process.

In one run it measures, at 10 / 1,000 / 4,000 / 20,000 messages (200-character texts):

- a Carryover run over HTTP: a real ``carryover serve`` subprocess, echo provider,
  ``Prefer: return=minimal``, contexts PUT through the API, on SQLite (a file in a temporary
  directory) and PostgreSQL (its own database on 127.0.0.1:5432, created and dropped): run p50
  and p90, GET context p50, the server's CPU per run (utime + stime from /proc/<pid>/stat) and
  its RSS;
- a LangGraph turn with its SQLite checkpointer (``SqliteSaver``), in process, no HTTP: a graph
  with one node that answers like the echo provider, on a thread seeded with the same messages;
- runs/s with 50 concurrent clients on 50 conversations (one each, 10 messages to start), and
  the server CPU per run and RSS meanwhile, per engine.

It prints a table and writes a PNG plot (run latency vs messages, log-log). It is a script that
prints figures, not a test, and bounds its own time (``--max-seconds``)::

    .venv/bin/pip install -e '.[bench]'
    .venv/bin/python bench/longconv.py                  # the whole thing, a few minutes
    .venv/bin/python bench/longconv.py --quick          # fewer runs, 10 / 1,000 / 4,000

``--app-root DIR`` runs the server from another checkout (e.g. ``git archive`` of an older
commit) to get "before" figures with the same client.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, TypedDict

import httpx

ROOT = Path(__file__).resolve().parents[1]
TEXT_CHARS = 200
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


class OutOfTime(Exception):
    pass


@dataclass
class Budget:
    """The bench's own deadline: every phase checks it, and every request has a timeout."""

    seconds: float
    started: float = field(default_factory=time.monotonic)

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.started)

    def check(self, what: str) -> None:
        if self.left() <= 0:
            raise OutOfTime(f"out of time before {what} (--max-seconds {self.seconds:g})")


@dataclass
class Row:
    system: str  # "carryover/sqlite", "carryover/postgresql", "langgraph/sqlite"
    messages: int
    p50_ms: float
    p90_ms: float
    get_context_ms: float | None = None
    cpu_ms_per_run: float | None = None
    rss_mib: float | None = None


@dataclass
class Throughput:
    system: str
    clients: int
    runs: int
    seconds: float
    runs_per_s: float
    cpu_ms_per_run: float
    rss_mib: float
    errors: int


# --- /proc ------------------------------------------------------------------------------------


def group_pids(leader: int) -> list[int]:
    """The server process and every process in its group."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == leader:
            pids.append(int(entry.name))
    return pids


def cpu_seconds(leader: int) -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in group_pids(leader):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return total


def rss_mib(leader: int) -> float:
    total = 0
    for pid in group_pids(leader):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        found = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
        total += int(found.group(1)) if found else 0
    return total / 1024


# --- contexts ---------------------------------------------------------------------------------


def text(i: int) -> str:
    head = f"message {i} "
    return head + "x" * (TEXT_CHARS - len(head))


def wire_messages(n: int) -> list[dict[str, Any]]:
    """``n`` alternating user/assistant messages (an uploaded history: ``provider: ""``)."""
    return [
        {
            "type": "user" if i % 2 == 0 else "assistant",
            "content": [{"type": "text", "text": text(i)}],
        }
        for i in range(n)
    ]


def prompt(i: int) -> str:
    return f"run {i} " + "p" * (TEXT_CHARS - 10)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# --- the Carryover server ---------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def server(
    database_url: str,
    app_root: Path,
    tmp: Path,
    largest: int,
    extra_env: dict[str, str] | None = None,
) -> Iterator[tuple[str, int]]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CARRYOVER_")}
    env.update(
        {
            "CARRYOVER_DATABASE_URL": database_url,
            "CARRYOVER_PORT": str(port),
            "CARRYOVER_PROVIDER": "echo",
            "CARRYOVER_LOG_LEVEL": "WARNING",
            # Room for the largest context, and no compaction: the bench measures a plain run.
            "CARRYOVER_MAX_CONTEXT_MESSAGES": str(largest + 10_000),
            "CARRYOVER_MAX_BODY_BYTES": str(max(8, largest // 1000 + 8) * 1024 * 1024),
            "CARRYOVER_CONTEXT_WINDOW": str(100_000_000),
            "PYTHONPATH": str(app_root),
        }
    )
    env.update(extra_env or {})
    log = tmp / f"server-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--port", str(port)],
            env=env,
            cwd=app_root,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"the server exited ({proc.returncode}):\n{log.read_text()[-3000:]}"
                )
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server did not become ready:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)
        yield url, proc.pid
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


async def put_context(http: httpx.AsyncClient, conv: str, n: int) -> None:
    answer = await http.put(
        f"/conversations/{conv}/context",
        headers={"If-None-Match": "*"},
        json={"system_prompt": "You are concise.", "summary": "", "messages": wire_messages(n)},
    )
    if answer.status_code not in (200, 201):
        raise RuntimeError(f"PUT context ({n} messages): {answer.status_code} {answer.text[:300]}")


async def one_run(http: httpx.AsyncClient, conv: str, i: int) -> float:
    began = time.perf_counter()
    answer = await http.post(
        f"/conversations/{conv}/runs",
        headers={"Prefer": "return=minimal"},
        json={"prompts": [prompt(i)]},
    )
    took = time.perf_counter() - began
    if answer.status_code != 201 or answer.json().get("status") != "completed":
        raise RuntimeError(f"run: {answer.status_code} {answer.text[:300]}")
    return took


async def carryover_sizes(
    url: str, leader: int, engine: str, sizes: list[int], runs: int, budget: Budget
) -> list[Row]:
    rows: list[Row] = []
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(120)) as http:
        for n in sizes:
            budget.check(f"carryover/{engine} at {n}")
            conv = f"bench-{engine}-{n}"
            await put_context(http, conv, n)
            await one_run(http, conv, -1)  # warm: caches, connections, first-run costs
            cpu_before = cpu_seconds(leader)
            times = [await one_run(http, conv, i) for i in range(runs)]
            cpu = cpu_seconds(leader) - cpu_before
            gets = []
            for _ in range(max(3, runs // 4)):
                began = time.perf_counter()
                got = await http.get(f"/conversations/{conv}/context")
                got.raise_for_status()
                gets.append(time.perf_counter() - began)
            rows.append(
                Row(
                    system=f"carryover/{engine}",
                    messages=n,
                    p50_ms=statistics.median(times) * 1000,
                    p90_ms=percentile(times, 0.9) * 1000,
                    get_context_ms=statistics.median(gets) * 1000,
                    cpu_ms_per_run=cpu / runs * 1000,
                    rss_mib=rss_mib(leader),
                )
            )
            print(
                f"  {rows[-1].system:22} {n:>6} msgs  run p50 {rows[-1].p50_ms:8.1f} ms", flush=True
            )
    return rows


async def carryover_throughput(
    url: str, leader: int, engine: str, clients: int, seconds: float, budget: Budget
) -> Throughput:
    budget.check(f"throughput on {engine}")
    limits = httpx.Limits(max_connections=clients + 8, max_keepalive_connections=clients + 8)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(120), limits=limits) as http:
        convs = [f"tp-{engine}-{i}" for i in range(clients)]
        for conv in convs:
            await put_context(http, conv, 10)
        done = 0
        errors = 0
        stop_at = time.monotonic() + min(seconds, max(1.0, budget.left()))

        async def client(conv: str) -> None:
            nonlocal done, errors
            i = 0
            while time.monotonic() < stop_at:
                try:
                    await one_run(http, conv, i)
                    done += 1
                except (RuntimeError, httpx.HTTPError):
                    errors += 1
                i += 1

        cpu_before = cpu_seconds(leader)
        began = time.monotonic()
        await asyncio.gather(*(client(c) for c in convs))
        took = time.monotonic() - began
        cpu = cpu_seconds(leader) - cpu_before
    return Throughput(
        system=f"carryover/{engine}",
        clients=clients,
        runs=done,
        seconds=took,
        runs_per_s=done / took,
        cpu_ms_per_run=cpu / max(1, done) * 1000,
        rss_mib=rss_mib(leader),
        errors=errors,
    )


def create_pg_database(name: str) -> str:
    import asyncpg  # the service's own driver

    async def go() -> None:
        conn = await asyncpg.connect(PG_ADMIN)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()

    asyncio.run(go())
    return f"postgresql://postgres@127.0.0.1:5432/{name}"


def drop_pg_database(name: str) -> None:
    import asyncpg

    async def go() -> None:
        conn = await asyncpg.connect(PG_ADMIN)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()

    asyncio.run(go())


# --- LangGraph --------------------------------------------------------------------------------


def langgraph_sizes(sizes: list[int], runs: int, tmp: Path, budget: Budget) -> list[Row]:
    import sqlite3

    from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import START, StateGraph
    from langgraph.graph.message import add_messages

    # The functional form: the annotations must be real objects, not strings.
    State = TypedDict("State", {"messages": Annotated[list[AnyMessage], add_messages]})  # noqa: UP013

    def echo(state: Any) -> dict[str, list[AnyMessage]]:
        # What the echo provider answers: a count and a quote of the last user text.
        last = state["messages"][-1]
        seen = len(state["messages"])
        return {
            "messages": [AIMessage(content=f"echo: saw {seen} message(s); {last.content!s:.40}")]
        }

    rows: list[Row] = []
    conn = sqlite3.connect(tmp / "langgraph.db", check_same_thread=False)
    try:
        saver = SqliteSaver(conn)
        builder = StateGraph(State)
        builder.add_node("model", echo)
        builder.add_edge(START, "model")
        graph = builder.compile(checkpointer=saver)
        for n in sizes:
            budget.check(f"langgraph at {n}")
            config: Any = {"configurable": {"thread_id": f"bench-{n}"}}
            seed: list[AnyMessage] = [
                HumanMessage(content=text(i)) if i % 2 == 0 else AIMessage(content=text(i))
                for i in range(n)
            ]
            # Seed the thread's state without running the model (like a PUT context).
            graph.update_state(config, {"messages": seed}, as_node="model")
            graph.invoke({"messages": [HumanMessage(content=prompt(-1))]}, config)  # warm
            times = []
            for i in range(runs):
                began = time.perf_counter()
                graph.invoke({"messages": [HumanMessage(content=prompt(i))]}, config)
                times.append(time.perf_counter() - began)
            rows.append(
                Row(
                    system="langgraph/sqlite",
                    messages=n,
                    p50_ms=statistics.median(times) * 1000,
                    p90_ms=percentile(times, 0.9) * 1000,
                )
            )
            print(
                f"  {'langgraph/sqlite':22} {n:>6} msgs  turn p50 {rows[-1].p50_ms:8.1f} ms",
                flush=True,
            )
    finally:
        conn.close()
    return rows


# --- output -----------------------------------------------------------------------------------


def fmt(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def table(rows: list[Row], throughput: list[Throughput]) -> str:
    lines = [
        "| system | messages | run p50 ms | run p90 ms | GET context p50 ms | server CPU ms/run "
        "| server RSS MiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.system} | {r.messages:,} | {fmt(r.p50_ms)} | {fmt(r.p90_ms)} | "
            f"{fmt(r.get_context_ms)} | {fmt(r.cpu_ms_per_run)} | {fmt(r.rss_mib, 0)} |"
        )
    if throughput:
        lines += [
            "",
            "| system | clients | runs | runs/s | server CPU ms/run | server RSS MiB | errors |",
            "|---|---|---|---|---|---|---|",
        ]
        for t in throughput:
            lines.append(
                f"| {t.system} | {t.clients} | {t.runs} | {t.runs_per_s:.1f} | "
                f"{t.cpu_ms_per_run:.1f} | {t.rss_mib:.0f} | {t.errors} |"
            )
    return "\n".join(lines)


def plot(rows: list[Row], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for system in dict.fromkeys(r.system for r in rows):
        mine = [r for r in rows if r.system == system]
        ax.plot([r.messages for r in mine], [r.p50_ms for r in mine], marker="o", label=system)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("messages in the conversation")
    ax.set_ylabel("run / turn p50 (ms)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- main -------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs, up to 4,000 messages")
    parser.add_argument(
        "--sizes", help="comma-separated message counts (default 10,1000,4000,20000)"
    )
    parser.add_argument("--runs", type=int, help="runs per size (default 30, quick 8)")
    parser.add_argument("--engines", default="sqlite,postgresql", help="default: both")
    parser.add_argument("--no-langgraph", action="store_true")
    parser.add_argument("--clients", type=int, default=50, help="concurrent clients (default 50)")
    parser.add_argument(
        "--throughput-seconds",
        type=float,
        help="length of the concurrent phase (default 10, quick 3)",
    )
    parser.add_argument("--max-seconds", type=float, default=1200, help="overall time bound")
    parser.add_argument("--app-root", type=Path, default=ROOT, help="the checkout the server runs")
    parser.add_argument("--plot", type=Path, default=ROOT / "docs/perf/longconv.png")
    parser.add_argument("--json", type=Path, help="also write the figures there")
    parser.add_argument("--label", default="", help="a word for the plot title (e.g. before)")
    parser.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for the server (e.g. CARRYOVER_GC_GEN0_THRESHOLD=0)",
    )
    args = parser.parse_args()

    sizes = (
        [int(s) for s in args.sizes.split(",")]
        if args.sizes
        else ([10, 1000, 4000] if args.quick else [10, 1000, 4000, 20000])
    )
    runs = args.runs or (8 if args.quick else 30)
    seconds = args.throughput_seconds or (3.0 if args.quick else 10.0)
    engines = [e for e in args.engines.split(",") if e]
    budget = Budget(args.max_seconds)
    rows: list[Row] = []
    throughput: list[Throughput] = []
    note = ""

    with tempfile.TemporaryDirectory(prefix="carryover-longconv-") as tmp_name:
        tmp = Path(tmp_name)
        try:
            for engine in engines:
                pg_name = f"carryover_bench_{os.getpid()}"
                if engine == "sqlite":
                    url_db = f"sqlite:///{tmp}/bench-{engine}.db"
                elif engine == "postgresql":
                    url_db = create_pg_database(pg_name)
                else:
                    sys.exit(f"unknown engine {engine!r}")
                try:
                    with server(
                        url_db,
                        args.app_root.resolve(),
                        tmp,
                        max(sizes),
                        dict(item.split("=", 1) for item in args.server_env),
                    ) as (url, pid):
                        print(f"carryover on {engine} (server pid {pid})", flush=True)
                        rows += asyncio.run(carryover_sizes(url, pid, engine, sizes, runs, budget))
                        throughput.append(
                            asyncio.run(
                                carryover_throughput(
                                    url, pid, engine, args.clients, seconds, budget
                                )
                            )
                        )
                finally:
                    if engine == "postgresql":
                        drop_pg_database(pg_name)
            if not args.no_langgraph:
                print("langgraph with SqliteSaver, in process", flush=True)
                rows += langgraph_sizes(sizes, runs, tmp, budget)
        except OutOfTime as exc:
            note = str(exc)
            print(note, file=sys.stderr)

    print()
    print(table(rows, throughput))
    if note:
        print(f"\n(incomplete: {note})")
    if rows:
        title = "Run latency vs conversation length" + (f" ({args.label})" if args.label else "")
        plot(rows, args.plot, title)
        print(f"\nplot: {args.plot}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "rows": [asdict(r) for r in rows],
                    "throughput": [asdict(t) for t in throughput],
                    "incomplete": note,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
