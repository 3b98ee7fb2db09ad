"""Where a run's server CPU goes: py-spy samples ``carryover serve`` during sequential runs.

docs/performance.md, "Where a run's time goes". A fresh ``carryover serve`` (SQLite in a temporary
directory) in front of the echo provider or a shared/bench fake, a context of ``--messages`` PUT,
warm runs, then ``--runs`` runs (``Prefer: return=minimal``) while ``py-spy record --gil`` samples
the server (only the thread holding the GIL: Python's CPU). It prints the server's CPU per run and
the samples by part of the stack (SQL, HTTP and framework, the agent and provider, ...), with the
milliseconds per run each share stands for. ``--raw PATH`` keeps py-spy's collapsed stacks.

py-spy is not a dependency of the project: install it anywhere (``python3 -m venv
/work/bench-venvs/tools && /work/bench-venvs/tools/bin/pip install py-spy``) and name it with
``--py-spy`` (default: that path, else ``py-spy`` on PATH). Sampling adds some CPU of its own
to the figure; compare two checkouts with ``--app-root``, one after the other.

    .venv/bin/python bench/run_profile.py                        # echo, 10 messages, 400 runs
    .venv/bin/python bench/run_profile.py --provider openai --app-root /tmp/before
    .venv/bin/python bench/run_profile.py --engine postgresql    # the shared server on 5432
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import time
from contextlib import ExitStack
from pathlib import Path

import _common as c  # bench/_common.py: a script's folder is on sys.path
import httpx

DEFAULT_PY_SPY = Path("/work/bench-venvs/tools/bin/py-spy")

#: (part, what marks a stack as that part), tried in order
BACKGROUND = ("LeaseKeeper._keep_leases", "WebhookWorker._loop", "RunQueue.sweep")
SQL_FILES = ("sqlalchemy", "aiosqlite", "greenlet", "asyncpg")
HTTP_FILES = ("uvicorn", "starlette", "fastapi", "httptools", "h11", "app/api")


def part(frames: list[str]) -> str:
    stack = ";".join(frames)
    found = re.search(r"\((.*?)(?::\d+)?\)$", frames[-1])
    leaf = found.group(1) if found else "?"
    if any(k in stack for k in BACKGROUND):
        return "background loops (leases, queue, webhooks)"
    if (
        "greenlet_spawn" in stack
        or leaf.startswith(SQL_FILES)
        or "_connection_worker_thread" in stack
        or leaf.startswith(("app/store/db.py", "app/store/sqlite_driver.py", "app/store/direct.py"))
    ):
        return "SQL: statements through SQLAlchemy and the driver"
    if "Agent.run" in stack:
        return "agent and provider (its HTTP client included)"
    if leaf.startswith(("asyncio", "selectors")):
        return "event loop"
    if leaf.startswith(HTTP_FILES) or "observability.py" in leaf:
        return "HTTP: uvicorn, FastAPI, middleware, routes"
    if leaf.startswith(("pydantic", "json")):
        return "pydantic and json (outside the agent)"
    if leaf.startswith("app/"):
        return "Carryover's store and service code"
    return "other (stdlib, metrics, logging)"


def idle(leaf: str) -> bool:
    return leaf.startswith("Runner.run") or not leaf.strip() or "(selectors" in leaf


def parts(raw: Path) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        if not line.strip():
            continue
        stack, n = line.rsplit(" ", 1)
        frames = stack.split(";")
        if not idle(frames[-1]):
            counts[part(frames)] += int(n)
    return counts


def main() -> None:
    c.on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--provider", default="echo", choices=["echo", "openai", "openai-responses", "anthropic"]
    )
    parser.add_argument("--messages", type=int, default=10)
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--engine", default="sqlite", choices=["sqlite", "postgresql"])
    parser.add_argument("--rate", type=int, default=500, help="py-spy samples per second")
    parser.add_argument("--py-spy", type=Path, default=None)
    parser.add_argument("--app-root", type=Path, default=c.ROOT, help="the checkout served")
    parser.add_argument("--raw", type=Path, help="keep py-spy's collapsed stacks there")
    args = parser.parse_args()
    spy = args.py_spy or (DEFAULT_PY_SPY if DEFAULT_PY_SPY.exists() else shutil.which("py-spy"))
    if spy is None:
        raise SystemExit("py-spy not found: see this script's docstring (--py-spy PATH)")

    print(f"run_profile: {c.machine_note()}", flush=True)
    with c.Procs() as procs, ExitStack() as stack:
        fake_url = c.start_fake(procs, args.provider).url if args.provider != "echo" else ""
        url = c.database(args.engine, stack, procs.workdir, "profile")
        env = c.server_env(url, args.provider, fake_url, max(args.messages, 1_000))
        server = c.start_server(procs, env, app_root=args.app_root.resolve())
        raw = args.raw or procs.workdir / "stacks.txt"
        with httpx.Client(base_url=server.url, timeout=120) as http:
            c.put_context_sync(http, "profiled", args.messages)
            for i in range(30):
                c.check_run(
                    http.post(
                        "/conversations/profiled/runs",
                        json={"prompts": [f"warm {i}"]},
                        headers=c.MINIMAL,
                    )
                )
            # the sampled runs on conversations of --messages messages (c.Conversations)
            convs = c.Conversations(http, "sampled", args.messages, args.runs)
            argv = [str(spy), "record", "-p", str(server.pid), "-r", str(args.rate)]
            argv += ["-f", "raw", "-o", str(raw), "--gil"]
            sampler = procs.start("py-spy", argv)
            time.sleep(1.5)  # attached
            before = c.cpu_seconds(server.pid)
            for i in range(args.runs):
                c.run_minimal(http, convs.next(), c.prompt(i))
            cpu_ms = (c.cpu_seconds(server.pid) - before) / args.runs * 1000
            sampler.popen.send_signal(2)  # py-spy writes its file on SIGINT
            sampler.popen.wait(60)
        counts = parts(raw)
    total = sum(counts.values()) or 1
    print(
        f"\n{args.provider}, {args.messages} messages, {args.engine}:"
        f" {cpu_ms:.2f} ms server CPU per run"
    )
    print(f"(py-spy attached; {total} samples of the thread holding the GIL)\n")
    print(
        c.table(
            ["part", "share", "ms per run"],
            [
                [name, f"{n / total:.1%}", f"{cpu_ms * n / total:.2f}"]
                for name, n in counts.most_common()
            ],
        )
    )
    print(f"\n{c.machine_note()}")


if __name__ == "__main__":
    main()
