"""Real ``carryover serve`` processes for the lifecycle tests, and small client helpers.

A :class:`Server` is a ``python -m app.cli serve`` subprocess in a session (process group) of
its own, on a free loopback port, so that a signal reaches the uvicorn supervisor and every
worker it started. :class:`Servers` starts them (several at once), and kills every one it
started when the test ends, pass or fail.

The fixtures of the tests that start servers (tests/lifecycle and tests/faults import them into
their conftest.py): ``servers`` (a :class:`Servers` for the test), ``sqlite_url`` (a SQLite file
of the test's own) and ``gate`` (the gated OpenAI fake of tests/fakes/gated_http.py: start
servers with ``**gate.settings()`` and run with its profile).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from ..fakes.gated_http import GatedOpenAI
from ..helpers import free_port, until

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")

#: the lease every lifecycle server uses: short, so dead processes are found quickly
LEASE_SECONDS = 2.0


def server_env(database_url: str, port: int, **settings: Any) -> dict[str, str]:
    """The environment of a server: nothing inherited from CARRYOVER_* but what is given."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("CARRYOVER_") and k != "PROMETHEUS_MULTIPROC_DIR"
    }
    values: dict[str, Any] = {
        "database_url": database_url,
        "port": port,
        "host": "127.0.0.1",
        "lease_seconds": LEASE_SECONDS,
        # a ceiling, not a measure: 16 waiting runs answered one after the other on a loaded
        # machine took longer than 60 s
        "busy_wait_seconds": 180,
        "log_level": "WARNING",
    }
    values.update(settings)
    env.update({f"CARRYOVER_{k.upper()}": str(v) for k, v in values.items() if v is not None})
    env["PYTHONUNBUFFERED"] = "1"
    # the servers import the same app as the tests, wherever the tree is
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


@dataclass
class Server:
    """One ``carryover serve`` process group."""

    name: str
    port: int
    env: dict[str, str]
    log_path: Path
    workers: int = 1
    proc: subprocess.Popen[bytes] | None = None
    _log: Any = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spawn(self) -> None:
        argv = [sys.executable, "-m", "app.cli", "serve", "--port", str(self.port)]
        if self.workers != 1:
            argv += ["--workers", str(self.workers)]
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            argv,
            env=self.env,
            cwd=self.log_path.parent,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-6000:]
        except OSError:
            return ""

    async def wait_ready(self, within: float = 60.0) -> None:
        deadline = time.monotonic() + within
        async with httpx.AsyncClient(base_url=self.url, timeout=2.0) as http:
            while True:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    raise AssertionError(
                        f"server {self.name} exited ({self.proc.returncode}):\n{self.log()}"
                    )
                try:
                    if (await http.get("/readyz")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"server {self.name} not ready in {within}s:\n{self.log()}"
                    )
                await asyncio.sleep(0.1)

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the whole process group (supervisor and workers)."""
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def pids(self) -> list[int]:
        """The supervisor and its children (the workers), from /proc."""
        assert self.proc is not None
        found = [self.proc.pid]
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    stat = (entry / "stat").read_text()
                except OSError:
                    continue
                # pid (comm) state ppid pgrp ...: the group id is the session leader's pid
                fields = stat.rsplit(")", 1)[1].split()
                if int(fields[2]) == self.proc.pid and int(entry.name) != self.proc.pid:
                    found.append(int(entry.name))
        return found

    def kill(self) -> None:
        """SIGKILL the process group and reap the supervisor (as a crash would leave it)."""
        if self.proc is None:
            return
        self.signal(signal.SIGKILL)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a zombie we cannot reap
            pass

    async def terminate(self, within: float = 30.0) -> int:
        """SIGTERM (a graceful stop) and wait for the exit status."""
        assert self.proc is not None
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + within
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"server {self.name} did not stop on SIGTERM in {within}s:\n{self.log()}"
                )
            await asyncio.sleep(0.05)
        return self.proc.returncode

    def stop(self) -> None:
        self.kill()
        if self._log is not None:
            self._log.close()
            self._log = None


class Servers:
    """Starts servers for one test and kills them all at its end."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.started: list[Server] = []

    async def start(
        self, database_url: str, count: int = 1, *, workers: int = 1, **settings: Any
    ) -> list[Server]:
        servers = []
        for _ in range(count):
            port = free_port()
            name = f"server{len(self.started) + 1}"
            server = Server(
                name,
                port,
                server_env(database_url, port, **settings),
                self.directory / f"{name}.log",
                workers=workers,
            )
            self.started.append(server)
            server.spawn()
            servers.append(server)
        await asyncio.gather(*(s.wait_ready() for s in servers))
        return servers

    async def restart(self, server: Server) -> Server:
        """Start a killed server again: same port, same environment."""
        server.stop()
        server.spawn()
        await server.wait_ready()
        return server

    def close(self) -> None:
        for server in self.started:
            server.stop()


# --- fixtures ---------------------------------------------------------------------------------


@pytest.fixture
async def servers(tmp_path: Path) -> AsyncIterator[Servers]:
    """Start servers with ``await servers.start(url, ...)``; all are killed when the test ends."""
    started = Servers(tmp_path)
    try:
        yield started
    finally:
        started.close()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'carryover.db'}"


@pytest.fixture
def gate() -> Iterator[GatedOpenAI]:
    """An OpenAI-compatible fake that holds each request until the test releases it."""
    with GatedOpenAI() as fake:
        yield fake


# --- client helpers ---------------------------------------------------------------------------


def client(server: Server, **kwargs: Any) -> httpx.AsyncClient:
    kwargs.setdefault("timeout", 60.0)
    return httpx.AsyncClient(base_url=server.url, **kwargs)


async def eventually(
    probe: Callable[[], Awaitable[T | None]],
    *,
    within: float = 20.0,
    interval: float = 0.05,
    what: str = "condition",
) -> T:
    """Poll ``probe`` until it returns something other than None (or fail after ``within``,
    a hang guard)."""
    return await until(probe, within=within, interval=interval, what=what)


async def create_conversation(http: httpx.AsyncClient, **body: Any) -> tuple[str, str]:
    """A new conversation: (id, etag)."""
    created = await http.post("/conversations", json=body)
    assert created.status_code == 201, created.text
    return created.json()["id"], created.headers["etag"]


async def active_run(http: httpx.AsyncClient, conv: str) -> str | None:
    found = await http.get(f"/conversations/{conv}")
    assert found.status_code == 200, found.text
    active: str | None = found.json()["active_run_id"]
    return active


async def run_record(http: httpx.AsyncClient, conv: str, run_id: str) -> dict[str, Any]:
    found = await http.get(f"/conversations/{conv}/runs/{run_id}")
    assert found.status_code == 200, found.text
    record: dict[str, Any] = found.json()
    return record


async def run_ends(
    http: httpx.AsyncClient, conv: str, run_id: str, *, within: float = 20.0
) -> dict[str, Any]:
    """The run record once the run is no longer ``running``."""

    async def probe() -> dict[str, Any] | None:
        record = await run_record(http, conv, run_id)
        return None if record["status"] == "running" else record

    return await eventually(probe, within=within, what=f"run {run_id} to end")


async def all_pages(http: httpx.AsyncClient, path: str) -> list[dict[str, Any]]:
    """Every item of a cursor-paged listing."""
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 200}
        if cursor:
            params["cursor"] = cursor
        page = await http.get(path, params=params)
        assert page.status_code == 200, page.text
        items += page.json()["items"]
        cursor = page.json()["next_cursor"]
        if not cursor:
            return items


async def all_runs(http: httpx.AsyncClient, conv: str) -> list[dict[str, Any]]:
    return await all_pages(http, f"/conversations/{conv}/runs")


async def all_transcript(http: httpx.AsyncClient, conv: str) -> list[dict[str, Any]]:
    return await all_pages(http, f"/conversations/{conv}/transcript")


async def stored_context(
    http: httpx.AsyncClient, conv: str, *, allow_open_batch: bool = False
) -> tuple[dict[str, Any], str]:
    """The stored context, checked replayable with the agent's own validator, and its ETag.

    ``allow_open_batch``: the one exception contract §1 allows, a tool batch cut short by a failure
    or cancellation (the next run closes it).
    """
    from app.agent.codec import load_context
    from app.agent.replay import validate_context

    found = await http.get(f"/conversations/{conv}/context")
    assert found.status_code == 200, found.text
    body: dict[str, Any] = found.json()
    validate_context(load_context(body), allow_open_batch=allow_open_batch)
    return body, found.headers["etag"]


async def sse_events(response: httpx.Response) -> AsyncIterator[tuple[str, Any]]:
    """(event, data) pairs of a text/event-stream response, as they arrive."""
    event, data = "message", []
    async for line in response.aiter_lines():
        if line == "":
            if data:
                yield event, json.loads("\n".join(data))
            event, data = "message", []
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())


def background_run(
    server: Server, conv: str, prompt: str, **extra: Any
) -> asyncio.Task[httpx.Response]:
    """POST a run without waiting for it; the task ends with the answer or a transport error.
    ``headers=`` go with the request, everything else into the body."""
    headers = extra.pop("headers", {})

    async def post() -> httpx.Response:
        async with client(server) as http:
            return await http.post(
                f"/conversations/{conv}/runs", headers=headers, json={"prompts": [prompt], **extra}
            )

    return asyncio.create_task(post())


async def started_run(http: httpx.AsyncClient, conv: str) -> str:
    """The id of the run in progress on ``conv``, once there is one."""
    return await eventually(lambda: active_run(http, conv), what=f"a run on {conv} to start")
