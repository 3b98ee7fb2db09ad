"""A Carryover run with the ``openai`` provider next to a LangGraph turn with ``ChatOpenAI``,
against the same fake and the same history.

The target "a Carryover run at 4,000 messages with the ``openai`` provider ≤ 0.1 x a
LangGraph + ``ChatOpenAI`` turn". Both talk to shared/bench/fake_openai.py (answering at once),
with the same system prompt and history (alternating 200-character texts):

- Carryover: a real ``carryover serve`` (SQLite in a temporary directory unless ``--engine
  postgresql``), the context PUT through the API, runs over HTTP with ``Prefer:
  return=minimal``; the client's latency and the server's CPU per run (utime + stime of the
  server and its children);
- LangGraph: in this process, no HTTP in front: a graph of one node that calls
  ``ChatOpenAI(...).invoke(messages)`` (langchain-openai, ``max_retries=0``), its state kept by
  the SQLite checkpointer (``SqliteSaver``, a file in the same temporary directory), the thread
  seeded with the same messages; the turn's latency and this process's CPU per turn
  (``time.process_time``).

Each streams from the fake as it does by default (Carryover does, ``ChatOpenAI`` does not;
``--langgraph-streaming`` makes it). bench/longconv.py is the same comparison with the echo
provider and a LangGraph node that answers like it, without a provider.

    .venv/bin/pip install -e '.[bench]'         # langgraph, its SQLite saver, langchain-openai
    .venv/bin/python bench/vs_langgraph.py      # 10 and 4,000 messages, ~2 min on a quiet box
    .venv/bin/python bench/vs_langgraph.py --sizes 4000,20000 --runs 6
    .venv/bin/python bench/vs_langgraph.py --json docs/perf/vs-langgraph.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any, TypedDict

import _common as c  # bench/_common.py: a script's folder is on sys.path
import httpx

TARGET = 0.1


@dataclass
class Row:
    system: str
    messages: int
    runs: int
    p50_ms: float
    p90_ms: float
    cpu_ms_per_run: float


def carryover(server: c.Proc, engine: str, sizes: list[int], runs: int) -> list[Row]:
    rows = []
    with httpx.Client(base_url=server.url, timeout=httpx.Timeout(600)) as http:
        for n in sizes:
            conv = f"vs-{n}"
            c.put_context_sync(http, conv, n)
            for w in range(2):  # warm
                c.check_run(
                    http.post(
                        f"/conversations/{conv}/runs",
                        json={"prompts": [f"warm {w}"]},
                        headers=c.MINIMAL,
                    )
                )
            times = []
            before = c.cpu_seconds(server.pid)
            for i in range(runs):
                began = time.perf_counter()
                answer = http.post(
                    f"/conversations/{conv}/runs",
                    json={"prompts": [c.prompt(i)]},
                    headers=c.MINIMAL,
                )
                times.append(time.perf_counter() - began)
                c.check_run(answer)
            cpu = c.cpu_seconds(server.pid) - before
            rows.append(row(f"carryover/{engine} + openai", n, times, cpu))
    return rows


def row(system: str, n: int, times: list[float], cpu: float) -> Row:
    r = Row(
        system=system,
        messages=n,
        runs=len(times),
        p50_ms=statistics.median(times) * 1000,
        p90_ms=c.percentile(times, 0.9) * 1000,
        cpu_ms_per_run=cpu / len(times) * 1000,
    )
    print(
        f"  {system:34} {n:>6} msgs: p50 {r.p50_ms:8.1f} ms, CPU {r.cpu_ms_per_run:8.1f} ms/turn",
        flush=True,
    )
    return r


def langgraph(fake_url: str, sizes: list[int], runs: int, tmp: Path, streaming: bool) -> list[Row]:
    import sqlite3

    from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage
    from langchain_openai import ChatOpenAI
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import START, StateGraph
    from langgraph.graph.message import add_messages

    # The functional form: the annotations must be real objects, not strings.
    State = TypedDict("State", {"messages": Annotated[list[AnyMessage], add_messages]})  # noqa: UP013

    model = ChatOpenAI(
        model="fake-model",
        base_url=fake_url,
        api_key="sk-fake",  # type: ignore[arg-type]
        max_retries=0,
        timeout=600,
        streaming=streaming,
    )

    def call(state: Any) -> dict[str, list[AnyMessage]]:
        return {"messages": [model.invoke(state["messages"])]}

    rows: list[Row] = []
    conn = sqlite3.connect(tmp / "langgraph.db", check_same_thread=False)
    try:
        builder = StateGraph(State)
        builder.add_node("model", call)
        builder.add_edge(START, "model")
        graph = builder.compile(checkpointer=SqliteSaver(conn))
        for n in sizes:
            config: Any = {"configurable": {"thread_id": f"vs-{n}"}}
            seed: list[AnyMessage] = [SystemMessage(content=c.SYSTEM_PROMPT)]
            seed += [
                HumanMessage(content=c.text(i)) if i % 2 == 0 else AIMessage(content=c.text(i))
                for i in range(n)
            ]
            # the thread's state without calling the model, like a PUT context
            graph.update_state(config, {"messages": seed}, as_node="model")
            for w in range(2):  # warm
                graph.invoke({"messages": [HumanMessage(content=f"warm {w}")]}, config)
            times = []
            before = time.process_time()
            for i in range(runs):
                began = time.perf_counter()
                graph.invoke({"messages": [HumanMessage(content=c.prompt(i))]}, config)
                times.append(time.perf_counter() - began)
            cpu = time.process_time() - before
            label = "langgraph/sqlite + ChatOpenAI" + (" (streaming)" if streaming else "")
            rows.append(row(label, n, times, cpu))
    finally:
        conn.close()
    return rows


def main() -> None:
    c.on_sigterm()
    # nothing of LangChain's tracing: no traffic but to the fake
    for name in list(os.environ):
        if name.startswith(("LANGCHAIN_", "LANGSMITH_")):
            del os.environ[name]
    os.environ["LANGSMITH_TRACING"] = "false"
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10,4000", help="message counts (default 10,4000)")
    parser.add_argument("--runs", type=int, default=10, help="measured runs / turns per size")
    parser.add_argument("--engine", default="sqlite", choices=["sqlite", "postgresql"])
    parser.add_argument("--langgraph-streaming", action="store_true", help="ChatOpenAI streams")
    parser.add_argument("--app-root", type=Path, default=c.ROOT, help="the checkout served")
    parser.add_argument("--json", type=Path, help="write the figures there")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    began = time.monotonic()
    print(f"vs_langgraph: {c.machine_note()}", flush=True)
    rows: list[Row] = []
    with c.Procs() as procs, ExitStack() as db:
        fake = c.start_fake(procs, "openai")
        url = c.database(args.engine, db, procs.workdir, "vs")
        env = c.server_env(url, "openai", fake.url, max(sizes))
        server = c.start_server(procs, env, app_root=args.app_root.resolve())
        try:
            rows += carryover(server, args.engine, sizes, args.runs)
        finally:
            procs.stop(server)  # not competing with the peer for the CPU
        rows += langgraph(fake.url, sizes, args.runs, procs.workdir, args.langgraph_streaming)

    ratios = []
    for n in sizes:
        ours = next(r for r in rows if r.messages == n and r.system.startswith("carryover"))
        peer = next(r for r in rows if r.messages == n and r.system.startswith("langgraph"))
        ratios.append(
            {
                "messages": n,
                "p50_ratio": ours.p50_ms / peer.p50_ms,
                "cpu_ratio": ours.cpu_ms_per_run / peer.cpu_ms_per_run,
            }
        )
    print()
    print(
        c.table(
            ["system", "messages", "runs", "p50 ms", "p90 ms", "CPU ms/run or turn"],
            [
                [
                    r.system,
                    f"{r.messages:,}",
                    r.runs,
                    c.fmt(r.p50_ms),
                    c.fmt(r.p90_ms),
                    c.fmt(r.cpu_ms_per_run),
                ]
                for r in rows
            ],
        )
    )
    print()
    print(
        c.table(
            ["messages", "Carryover ÷ LangGraph, p50", "CPU", f"target ≤ {TARGET:g} (p50)"],
            [
                [
                    f"{x['messages']:,}",
                    f"{x['p50_ratio']:.2f}",
                    f"{x['cpu_ratio']:.2f}",
                    "✓" if x["p50_ratio"] <= TARGET else "✗",
                ]
                for x in ratios
            ],
        )
    )
    took = time.monotonic() - began
    print(f"\n{took:.0f} s; {c.machine_note()}")
    c.write_json(
        args.json,
        {
            "engine": args.engine,
            "langgraph_streaming": args.langgraph_streaming,
            "rows": [asdict(r) for r in rows],
            "ratios": ratios,
            "seconds": took,
        },
    )


if __name__ == "__main__":
    main()
