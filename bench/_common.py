"""What the provider-path benches share (bench/provider_cost.py, concurrency.py, streaming.py,
vs_langgraph.py): free ports, the processes they start (``carryover serve`` with its environment,
the shared fakes of shared/bench, the floor app, any other command) and stop even on error, the
CPU of a process and its children from /proc, contexts PUT through the API, a fresh PostgreSQL
database, percentiles, a markdown table and the ``--json`` file.

Every address is 127.0.0.1; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
# shared/bench sits beside the checkout (/work/main, /work/wt-*): the yardsticks
SHARED = Path(os.environ.get("CARRYOVER_BENCH_SHARED", ROOT.parent / "shared" / "bench"))
PG_ADMIN = os.environ.get(
    "CARRYOVER_BENCH_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres"
)
TEXT_CHARS = 200
TICK = os.sysconf("SC_CLK_TCK")


def on_sigterm() -> None:
    """SIGTERM ends the bench like Ctrl-C does: through ``finally``, which stops what it
    started."""

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# --- /proc ------------------------------------------------------------------------------------


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (uvicorn's workers with ``--workers N``)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields:
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        one = todo.pop()
        out.append(one)
        todo += children.get(one, [])
    return out


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` and of its live descendants, in seconds."""
    total = 0
    for one in tree(pid):
        fields = _stat(one)
        if fields:
            total += int(fields[11]) + int(fields[12])
    return total / TICK


def rss_mib(pid: int) -> float:
    total = 0
    for one in tree(pid):
        try:
            found = re.search(r"^VmRSS:\s+(\d+) kB", Path(f"/proc/{one}/status").read_text(), re.M)
        except OSError:
            continue
        total += int(found.group(1)) if found else 0
    return total / 1024


# --- processes --------------------------------------------------------------------------------


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    url: str = ""

    @property
    def pid(self) -> int:
        return self.popen.pid

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def stop(proc: Proc) -> None:
    """SIGTERM to the process's group (its own session), SIGKILL after 20 s."""
    if proc.popen.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            proc.popen.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.popen.wait()
    else:
        # the leader is gone; its group (a worker left behind) may not be
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class Procs:
    """The processes a bench started; ``with Procs() as procs`` stops them all at the end."""

    def __init__(self, workdir: Path | None = None) -> None:
        self._stack = ExitStack()
        self._own = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="carryover-bench-"))

    def __enter__(self) -> Procs:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._stack.close()
        finally:
            if self._own and not os.environ.get("CARRYOVER_BENCH_KEEP"):
                shutil.rmtree(self.workdir, ignore_errors=True)

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        ready: str | None = None,
        timeout: float = 120,
    ) -> Proc:
        """Start ``argv`` in its own session, output to a log file; wait until ``ready`` (a URL)
        answers anything but a connection error."""
        log = self.workdir / f"{name}.log"
        with open(log, "wb") as out:
            popen = subprocess.Popen(
                list(argv),
                env=env,
                cwd=cwd or self.workdir,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        proc = Proc(name, popen, log)
        self._stack.callback(stop, proc)
        if ready:
            wait_up(proc, ready, timeout)
        return proc

    def stop(self, proc: Proc) -> None:
        stop(proc)


def wait_up(proc: Proc, url: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited ({proc.popen.returncode}):\n{proc.tail()}")
        try:
            httpx.get(url, timeout=5)
            return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{proc.name} did not come up in {timeout:g} s:\n{proc.tail()}")
        time.sleep(0.2)


def start_fake(procs: Procs, kind: str = "openai", *args: str) -> Proc:
    """One of the fakes: ``openai`` / ``anthropic`` (shared/bench/fake_*.py), ``openai-responses``
    (bench/fake_responses.py) or ``stream`` (bench/fake_stream.py, its options in ``args``).
    ``url`` is the base URL a provider takes."""
    script = {
        "openai": SHARED / "fake_openai.py",
        "anthropic": SHARED / "fake_anthropic.py",
        "openai-responses": HERE / "fake_responses.py",
        "stream": HERE / "fake_stream.py",
    }[kind]
    if not script.exists():
        sys.exit(f"{script} is missing (set CARRYOVER_BENCH_SHARED to the shared/bench folder)")
    port = free_port()
    proc = procs.start(
        f"fake-{kind}-{port}",
        [sys.executable, str(script), str(port), *args],
        ready=f"http://127.0.0.1:{port}/",
    )
    proc.url = f"http://127.0.0.1:{port}" + ("" if kind == "anthropic" else "/v1")
    return proc


def server_env(
    database_url: str,
    provider: str = "echo",
    fake_url: str = "",
    largest: int = 20_000,
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    """The environment of a ``carryover serve`` for a bench: no CARRYOVER_* of the caller's, room
    for the largest context and no compaction, a quiet log, the provider pointed at a fake."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CARRYOVER_")}
    env.update(
        {
            "CARRYOVER_DATABASE_URL": database_url,
            "CARRYOVER_PROVIDER": provider,
            "CARRYOVER_LOG_LEVEL": "WARNING",
            "CARRYOVER_CONTEXT_WINDOW": str(100_000_000),
            "CARRYOVER_MAX_CONTEXT_MESSAGES": str(largest + 10_000),
            "CARRYOVER_MAX_BODY_BYTES": str(max(64, largest // 1000 + 8) * 1024 * 1024),
            # no key in the environment reaches a fake: these are placeholders
            "OPENAI_API_KEY": "sk-fake",
            "ANTHROPIC_API_KEY": "sk-ant-fake",
        }
    )
    if provider != "echo":
        env["CARRYOVER_MODEL"] = "fake-model"
        env["CARRYOVER_BASE_URL"] = fake_url
    env.update(extra or {})
    return env


def agents_toml(path: Path, provider: str, fake_url: str, **fields: Any) -> Path:
    """A CARRYOVER_CONFIG_FILE whose ``default`` profile is ``provider`` at ``fake_url`` with
    ``fields`` (e.g. ``stream=False``)."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        return json.dumps(v)

    lines = [
        "[agents.default]",
        f"provider = {value(provider)}",
        'model = "fake-model"',
        f"base_url = {value(fake_url)}",
        "context_window = 100000000",
    ]
    lines += [f"{k} = {value(v)}" for k, v in fields.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def start_server(
    procs: Procs,
    env: dict[str, str],
    *,
    workers: int = 1,
    app_root: Path = ROOT,
    name: str = "carryover",
    timeout: float = 180,
    wrapper: list[str] | None = None,
) -> Proc:
    """``carryover serve`` (``python -m app.cli`` of ``app_root``) on a free port; ``url`` set
    once ``/readyz`` answers 200. ``wrapper``: a command it runs under (valgrind, say)."""
    port = free_port()
    env = {**env, "PYTHONPATH": str(app_root)}
    argv = [*(wrapper or []), sys.executable, "-m", "app.cli", "serve", "--port", str(port)]
    if workers != 1:
        argv += ["--workers", str(workers)]
    proc = procs.start(f"{name}-{port}", argv, env=env, cwd=app_root)
    proc.url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while True:
        if proc.popen.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.popen.returncode}):\n{proc.tail()}")
        try:
            if httpx.get(f"{proc.url}/readyz", timeout=5).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server did not become ready:\n{proc.tail()}")
        time.sleep(0.2)


def start_floor(procs: Procs, wrapper: list[str] | None = None, timeout: float = 120) -> Proc:
    """shared/bench/floor_app.py served by uvicorn from this venv, as its README says.
    ``wrapper``: a command it runs under (valgrind, say)."""
    port = free_port()
    env = {**os.environ, "FLOOR_DB": str(procs.workdir / f"floor-{port}.db")}
    argv = [*(wrapper or []), sys.executable, "-m", "uvicorn", "floor_app:app"]
    argv += ["--app-dir", str(SHARED)]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    argv += ["--no-access-log"]
    ready = f"http://127.0.0.1:{port}/docs"
    proc = procs.start(f"floor-{port}", argv, env=env, ready=ready, timeout=timeout)
    proc.url = f"http://127.0.0.1:{port}"
    return proc


# --- contexts and runs ------------------------------------------------------------------------


def text(i: int, chars: int = TEXT_CHARS) -> str:
    head = f"message {i} "
    return head + "x" * (chars - len(head))


def wire_messages(n: int, chars: int = TEXT_CHARS) -> list[dict[str, Any]]:
    """``n`` alternating user/assistant text messages."""
    return [
        {
            "type": "user" if i % 2 == 0 else "assistant",
            "content": [{"type": "text", "text": text(i, chars)}],
        }
        for i in range(n)
    ]


def prompt(i: int, chars: int = TEXT_CHARS) -> str:
    head = f"run {i} "
    return head + "p" * (chars - len(head))


SYSTEM_PROMPT = "You are concise."


def put_context_sync(http: httpx.Client, conv: str, n: int) -> None:
    answer = http.put(
        f"/conversations/{conv}/context",
        headers={"If-None-Match": "*"},
        json={"system_prompt": SYSTEM_PROMPT, "summary": "", "messages": wire_messages(n)},
    )
    if answer.status_code not in (200, 201):
        raise RuntimeError(f"PUT context ({n} messages): {answer.status_code} {answer.text[:300]}")


class Conversations:
    """Conversations of ``n`` messages that a measurement's runs take turns on, so that its
    figure stays the figure at ``n``: each run appends two messages, and a thousand runs on one
    conversation of 10 would measure runs at up to 2,010 (with a provider, a request body 200
    times as long). ``runs`` runs are spread over as many conversations as keep each within
    ``slack`` messages of ``n`` (by default the larger of 20 and a tenth of ``n``); each is PUT
    and run ``warm`` times first (the process has run it before, as in the service's normal
    case), which the caller leaves out of what it measures."""

    def __init__(
        self,
        http: httpx.Client,
        prefix: str,
        n: int,
        runs: int,
        *,
        warm: int = 1,
        slack: int | None = None,
    ) -> None:
        slack = slack or max(20, n // 10)
        count = max(1, -(-2 * runs // slack))
        self.ids = [f"{prefix}-{i}" for i in range(count)]
        self._next = 0
        for conv in self.ids:
            put_context_sync(http, conv, n)
            for w in range(warm):
                run_minimal(http, conv, f"warm {w}")

    def next(self) -> str:
        """The conversation the next run goes to (in turn)."""
        conv = self.ids[self._next % len(self.ids)]
        self._next += 1
        return conv


async def put_context(http: httpx.AsyncClient, conv: str, n: int) -> None:
    answer = await http.put(
        f"/conversations/{conv}/context",
        headers={"If-None-Match": "*"},
        json={"system_prompt": SYSTEM_PROMPT, "summary": "", "messages": wire_messages(n)},
    )
    if answer.status_code not in (200, 201):
        raise RuntimeError(f"PUT context ({n} messages): {answer.status_code} {answer.text[:300]}")


def check_run(answer: httpx.Response) -> None:
    if answer.status_code != 201 or answer.json().get("status") != "completed":
        raise RuntimeError(f"run: {answer.status_code} {answer.text[:500]}")


MINIMAL = {"Prefer": "return=minimal"}


def run_minimal(http: httpx.Client, conversation: str, prompt: str) -> None:
    """One run on ``conversation`` answered with ``Prefer: return=minimal``, checked
    (:func:`check_run`)."""
    check_run(
        http.post(
            f"/conversations/{conversation}/runs", json={"prompts": [prompt]}, headers=MINIMAL
        )
    )


class HealthProbe:
    """A thread that GETs ``/healthz`` every ``every`` seconds while it is on: the worst answer
    time says how long the server's event loop was held."""

    def __init__(self, url: str, every: float = 0.05) -> None:
        import threading

        self.url, self.every = url, every
        self.worst = 0.0
        self.count = 0
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        with httpx.Client(timeout=120) as http:
            while not self._stop.is_set():
                began = time.perf_counter()
                try:
                    http.get(f"{self.url}/healthz").raise_for_status()
                except httpx.HTTPError:
                    self.failed += 1
                self.worst = max(self.worst, time.perf_counter() - began)
                self.count += 1
                self._stop.wait(self.every)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=150)


# --- PostgreSQL -------------------------------------------------------------------------------


def _pg(statements: list[str]) -> None:
    import asyncpg  # the service's own driver

    async def go() -> None:
        conn = await asyncpg.connect(PG_ADMIN, timeout=30)
        try:
            for sql in statements:
                await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(go())


@contextmanager
def pg_database(prefix: str = "carryover_bench") -> Iterator[str]:
    """A fresh database on the local PostgreSQL, dropped afterwards (never ``test``)."""
    name = f"{prefix}_{os.getpid()}_{int(time.time() * 1000) % 100_000_000}"
    assert name != "test"
    _pg([f'DROP DATABASE IF EXISTS "{name}"', f'CREATE DATABASE "{name}"'])
    try:
        yield PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    finally:
        _pg([f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'])


def database(engine: str, stack: ExitStack, workdir: Path, tag: str) -> str:
    """The URL of a fresh ``sqlite`` file under ``workdir`` or ``postgresql`` database."""
    if engine == "sqlite":
        return f"sqlite:///{workdir}/{tag}.db"
    if engine == "postgresql":
        return stack.enter_context(pg_database())
    raise SystemExit(f"unknown engine {engine!r} (sqlite, postgresql)")


# --- figures ----------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def fmt(value: float | None, digits: int = 1) -> str:
    if value is None or value != value:  # None or NaN
        return "—"
    return f"{value:,.{digits}f}"


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_json(path: Path | None, payload: dict[str, Any]) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "argv": sys.argv,
        "load_average": os.getloadavg(),
        "cpus": os.cpu_count(),
    }
    path.write_text(json.dumps({"meta": meta, **payload}, indent=2) + "\n")
    print(f"\nfigures: {path}")


def machine_note() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.1f} / {five:.1f} / {fifteen:.1f} on {os.cpu_count()} CPUs"
