"""What a streamed delta costs Carryover, and the delay streaming through it adds.

Streaming figures. bench/fake_stream.py streams a long answer (``--deltas`` pieces of
``--chars`` characters, at once unless ``--delay-ms``) from ``/v1``, and the same text in one
piece from ``/whole/v1``. One ``carryover serve`` (``openai`` provider; SQLite unless
``--engine postgresql``) has two profiles: ``default`` at the split stream, ``whole`` at the
whole one. Clients ask for server-sent events (``"stream": true``, ``Accept:
text/event-stream``, ``Prefer: return=minimal``: docs/runs.md), each its own conversation, at
each level of concurrent streams, and it prints:

- server CPU per run and per provider delta (the run's CPU ÷ ``--deltas``), and the MARGINAL
  CPU per delta: (CPU per split run - CPU per whole run) ÷ (deltas - 1), sequential runs,
  which leaves out what a run costs whatever its answer's pieces;
- time to first byte of the answer and to the first ``delta`` event, and to the end of the
  stream, p50 / p99, next to the fake's own (called directly with the request Carryover sends
  it, read the same way, at the same concurrency): the difference is the delay Carryover adds;
- how many ``delta`` events a client received per run (Carryover coalesces a block's deltas
  that arrive within 50 ms) and that their text adds up to the whole answer.

    .venv/bin/python bench/streaming.py                        # ~3 min on a quiet 2-core box
    .venv/bin/python bench/streaming.py --clients 1,16 --deltas 500 --runs-per-level 16
    .venv/bin/python bench/streaming.py --delay-ms 2           # paced like a model: 2 ms apart
    .venv/bin/python bench/streaming.py --json docs/perf/streaming.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import _common as c  # bench/_common.py: a script's folder is on sys.path
import httpx

TIMEOUT = httpx.Timeout(300)


@dataclass
class Stream:
    """One streamed answer as the client saw it (seconds from the request)."""

    first_byte: float
    first_delta: float
    total: float
    delta_events: int
    text_chars: int


@dataclass
class Level:
    system: str  # carryover, fake (the fake called directly)
    clients: int
    runs: int
    errors: int
    seconds: float
    runs_per_s: float
    first_byte_p50_ms: float
    first_byte_p99_ms: float
    first_delta_p50_ms: float
    first_delta_p99_ms: float
    total_p50_ms: float
    total_p99_ms: float
    delta_events_per_run: float
    cpu_ms_per_run: float | None = None
    cpu_us_per_delta: float | None = None
    added_first_byte_p50_ms: float | None = None
    added_first_delta_p50_ms: float | None = None
    added_total_p50_ms: float | None = None
    first_error: str = ""


async def sse(response: httpx.Response, began: float, delta_event: str) -> tuple[Stream, dict]:
    """Read an event stream to its end: when the first byte and the first ``delta_event``
    came, how many of those and their text's length; the last event's data."""
    first_byte = first_delta = 0.0
    events = chars = 0
    event = ""
    last: dict[str, Any] = {}
    async for line in response.aiter_lines():
        now = time.perf_counter() - began
        first_byte = first_byte or now
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data = line[5:].strip()
            if delta_event == "openai":  # Chat Completions chunks: data lines only
                if data == "[DONE]":
                    continue
                choices = json.loads(data).get("choices") or [{}]
                piece = choices[0].get("delta", {}).get("content")
                if piece:
                    first_delta = first_delta or now
                    events += 1
                    chars += len(piece)
            elif event == "delta":
                first_delta = first_delta or now
                events += 1
                chars += len(json.loads(data).get("text", ""))
            elif event == "run.finished":
                last = json.loads(data)
    total = time.perf_counter() - began
    return Stream(first_byte, first_delta, total, events, chars), last


def summarize(
    system: str,
    clients: int,
    streams: list[Stream],
    errors: int,
    took: float,
    first: str,
    cpu: float | None,
    deltas: int,
) -> Level:
    def p(values: list[float], q: float) -> float:
        return c.percentile(values, q) * 1000

    fb = [s.first_byte for s in streams]
    fd = [s.first_delta for s in streams]
    tt = [s.total for s in streams]
    done = len(streams)
    per_run = None if cpu is None else cpu / max(1, done) * 1000
    return Level(
        system=system,
        clients=clients,
        runs=done,
        errors=errors,
        seconds=took,
        runs_per_s=done / took if took else 0.0,
        first_byte_p50_ms=p(fb, 0.5),
        first_byte_p99_ms=p(fb, 0.99),
        first_delta_p50_ms=p(fd, 0.5),
        first_delta_p99_ms=p(fd, 0.99),
        total_p50_ms=p(tt, 0.5),
        total_p99_ms=p(tt, 0.99),
        delta_events_per_run=statistics.mean(s.delta_events for s in streams) if streams else 0,
        cpu_ms_per_run=per_run,
        cpu_us_per_delta=None if per_run is None else per_run * 1000 / deltas,
        first_error=first,
    )


async def drive(clients: int, runs_each: int, one: Any) -> tuple[list[Stream], int, float, str]:
    streams: list[Stream] = []
    errors = 0
    first = ""

    async def client(j: int) -> None:
        nonlocal errors, first
        for i in range(runs_each):
            try:
                streams.append(await one(j, i))
            except (RuntimeError, httpx.HTTPError, ValueError, KeyError) as exc:
                errors += 1
                first = first or f"{type(exc).__name__}: {exc}"[:300]

    began = time.perf_counter()
    await asyncio.gather(*(client(j) for j in range(clients)))
    return streams, errors, time.perf_counter() - began, first


def limits(clients: int) -> httpx.Limits:
    # idle connections dropped before uvicorn's 5 s keep-alive closes them under a request
    # (a ReadError at 64 clients otherwise)
    return httpx.Limits(
        max_connections=clients + 8, max_keepalive_connections=clients + 8, keepalive_expiry=2.0
    )


class Carryover:
    def __init__(self, http: httpx.AsyncClient, tag: str, expect_chars: int, agent: str = ""):
        self.http, self.tag, self.expect, self.agent = http, tag, expect_chars, agent

    async def run(self, j: int, i: int) -> Stream:
        body: dict[str, Any] = {"prompts": [c.prompt(i)], "stream": True}
        if self.agent:
            body["agent"] = self.agent
        headers = {"Accept": "text/event-stream", **c.MINIMAL}
        began = time.perf_counter()
        async with self.http.stream(
            "POST", f"/conversations/{self.tag}-{j}/runs", json=body, headers=headers
        ) as answer:
            if answer.status_code != 201:
                raise RuntimeError(f"run: {answer.status_code} {(await answer.aread())[:300]!r}")
            stream, last = await sse(answer, began, "delta")
        if last.get("status") != "completed":
            raise RuntimeError(f"run ended {last.get('status')}: {json.dumps(last)[:300]}")
        if stream.text_chars != self.expect:
            raise RuntimeError(f"the deltas held {stream.text_chars} chars, not {self.expect}")
        return stream


class Direct:
    """The fake called as Carryover calls it: the history it would send, streamed."""

    def __init__(self, http: httpx.AsyncClient, url: str, clients: int, start: int, answer: str):
        self.http, self.url, self.answer = http, url, answer
        first = [{"role": "system", "content": c.SYSTEM_PROMPT}]
        first += [
            {"role": m["type"], "content": m["content"][0]["text"]} for m in c.wire_messages(start)
        ]
        self.histories = [list(first) for _ in range(clients)]

    async def run(self, j: int, i: int) -> Stream:
        history = self.histories[j]
        history.append({"role": "user", "content": c.prompt(i)})
        body = {"model": "fake-model", "messages": history, "stream": True}
        body["stream_options"] = {"include_usage": True}
        began = time.perf_counter()
        async with self.http.stream("POST", self.url, json=body) as answer:
            if answer.status_code != 200:
                raise RuntimeError(f"fake: {answer.status_code}")
            stream, _ = await sse(answer, began, "openai")
        history.append({"role": "assistant", "content": self.answer})
        return stream


def agents_file(path: Path, fake: str) -> Path:
    lines = []
    for name, base in (("default", f"{fake}/v1"), ("whole", f"{fake}/whole/v1")):
        lines += [
            f"[agents.{name}]",
            'provider = "openai"',
            'model = "fake-model"',
            f'base_url = "{base}"',
            "context_window = 100000000",
            "",
        ]
    path.write_text("\n".join(lines))
    return path


async def marginal(server: c.Proc, start: int, runs: int, chars: int) -> dict[str, float]:
    """CPU per sequential run, split stream vs the same text whole: the deltas' own cost."""
    out = {}
    async with httpx.AsyncClient(base_url=server.url, timeout=TIMEOUT) as http:
        for agent in ("whole", "default"):
            tag = f"marginal-{agent}"
            await c.put_context(http, f"{tag}-0", start)
            caller = Carryover(http, tag, chars, "" if agent == "default" else agent)
            await caller.run(0, -1)  # warm
            before = c.cpu_seconds(server.pid)
            for i in range(runs):
                await caller.run(0, i)
            out[agent] = (c.cpu_seconds(server.pid) - before) / runs * 1000
    return out


def main() -> None:
    c.on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="1,16,64", help="concurrent streams, each level")
    parser.add_argument("--deltas", type=int, default=2000, help="pieces of the fake's answer")
    parser.add_argument("--chars", type=int, default=4, help="characters per piece")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="between the fake's pieces")
    parser.add_argument("--runs-per-level", type=int, default=32, help="shared out among clients")
    parser.add_argument("--min-runs-per-client", type=int, default=1)
    parser.add_argument("--marginal-runs", type=int, default=10, help="0: skip the split/whole")
    parser.add_argument("--start-messages", type=int, default=10)
    parser.add_argument("--engine", default="sqlite", choices=["sqlite", "postgresql"])
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--app-root", type=Path, default=c.ROOT, help="the checkout served")
    parser.add_argument("--json", type=Path, help="write the figures there")
    args = parser.parse_args()
    levels = [int(x) for x in args.clients.split(",")]
    expect = args.deltas * args.chars
    answer_text = "".join((f"w{i} " * args.chars)[: args.chars] for i in range(args.deltas))
    start = args.start_messages

    began = time.monotonic()
    print(f"streaming: {c.machine_note()}", flush=True)
    rows: list[Level] = []
    margin: dict[str, float] = {}
    with c.Procs() as procs, ExitStack() as db:
        fake = c.start_fake(
            procs, "stream", "--deltas", str(args.deltas), "--chars", str(args.chars),
            "--delay-ms", str(args.delay_ms),
        )  # fmt: skip
        root = fake.url.removesuffix("/v1")
        toml = agents_file(procs.workdir / "agents.toml", root)
        url = c.database(args.engine, db, procs.workdir, "streaming")
        env = c.server_env(url, "openai", fake.url, 1000, {"CARRYOVER_CONFIG_FILE": str(toml)})
        server = c.start_server(procs, env, workers=args.workers, app_root=args.app_root.resolve())

        if args.marginal_runs:
            margin = asyncio.run(marginal(server, start, args.marginal_runs, expect))
            per = (margin["default"] - margin["whole"]) * 1000 / max(1, args.deltas - 1)
            margin["marginal_us_per_delta"] = per
            print(
                f"  sequential: CPU {margin['default']:.1f} ms/run split into {args.deltas} "
                f"deltas, {margin['whole']:.1f} ms/run whole: {per:.1f} µs per delta",
                flush=True,
            )

        for level in levels:
            each = max(args.min_runs_per_client, math.ceil(args.runs_per_level / level))

            async def fake_level(level: int = level, each: int = each) -> Level:
                async with httpx.AsyncClient(timeout=TIMEOUT, limits=limits(level)) as http:
                    direct = Direct(http, f"{fake.url}/chat/completions", level, start, answer_text)
                    await direct.run(0, -1)
                    got = await drive(level, each, direct.run)
                return summarize("fake", level, got[0], got[1], got[2], got[3], None, args.deltas)

            async def ours(level: int = level, each: int = each) -> Level:
                tag = f"s{level}"
                async with httpx.AsyncClient(
                    base_url=server.url, timeout=TIMEOUT, limits=limits(level)
                ) as http:
                    for j in range(level):
                        await c.put_context(http, f"{tag}-{j}", start)
                    caller = Carryover(http, tag, expect)
                    await caller.run(0, -1)  # warm
                    before = c.cpu_seconds(server.pid)
                    got = await drive(level, each, caller.run)
                    cpu = c.cpu_seconds(server.pid) - before
                return summarize(
                    "carryover", level, got[0], got[1], got[2], got[3], cpu, args.deltas
                )

            base = asyncio.run(fake_level())
            mine = asyncio.run(ours())
            mine.added_first_byte_p50_ms = mine.first_byte_p50_ms - base.first_byte_p50_ms
            mine.added_first_delta_p50_ms = mine.first_delta_p50_ms - base.first_delta_p50_ms
            mine.added_total_p50_ms = mine.total_p50_ms - base.total_p50_ms
            rows += [base, mine]
            print(
                f"  {level:>3} streams: CPU {c.fmt(mine.cpu_us_per_delta)} µs/delta, first delta"
                f" p50 {mine.first_delta_p50_ms:.1f} ms (fake {base.first_delta_p50_ms:.1f}),"
                f" end p50 {mine.total_p50_ms:.1f} ms (fake {base.total_p50_ms:.1f}),"
                f" {mine.errors} errors",
                flush=True,
            )

    header = ["system", "streams", "runs", "runs/s", "first byte p50/p99 ms"]
    header += ["first delta p50/p99 ms", "end p50/p99 ms", "delta events/run"]
    header += ["CPU ms/run", "CPU µs/delta", "added first delta p50", "added end p50", "errors"]
    print()
    print(
        c.table(
            header,
            [
                [
                    r.system,
                    r.clients,
                    r.runs,
                    c.fmt(r.runs_per_s),
                    f"{c.fmt(r.first_byte_p50_ms)} / {c.fmt(r.first_byte_p99_ms)}",
                    f"{c.fmt(r.first_delta_p50_ms)} / {c.fmt(r.first_delta_p99_ms)}",
                    f"{c.fmt(r.total_p50_ms)} / {c.fmt(r.total_p99_ms)}",
                    c.fmt(r.delta_events_per_run),
                    c.fmt(r.cpu_ms_per_run),
                    c.fmt(r.cpu_us_per_delta),
                    c.fmt(r.added_first_delta_p50_ms),
                    c.fmt(r.added_total_p50_ms),
                    r.errors,
                ]
                for r in rows
            ],
        )
    )
    if margin:
        print(
            f"\nmarginal CPU per delta (sequential, split - whole): "
            f"{margin['marginal_us_per_delta']:.1f} µs ({margin['default']:.1f} - "
            f"{margin['whole']:.1f} ms per run over {args.deltas - 1} deltas)"
        )
    for r in rows:
        if r.first_error:
            print(f"\n{r.system}/{r.clients}: first error: {r.first_error}")
    took = time.monotonic() - began
    print(
        f"\n{args.deltas} deltas of {args.chars} chars, {args.delay_ms:g} ms apart; {took:.0f} s;"
    )
    print(c.machine_note())
    c.write_json(
        args.json,
        {
            "deltas": args.deltas,
            "chars": args.chars,
            "delay_ms": args.delay_ms,
            "engine": args.engine,
            "workers": args.workers,
            "levels": [asdict(r) for r in rows],
            "marginal": margin,
            "seconds": took,
        },
    )


if __name__ == "__main__":
    main()
