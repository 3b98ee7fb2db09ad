"""Helpers shared by the test packages: problem answers, message bodies, bounded waits.

- :func:`assert_problem`: an RFC 9457 problem answer of one status and type (contract §5), checked
  field by field; its body.
- :func:`user` / :func:`user_texts`: a user message as the API writes it, and the texts of the
  user messages of a list.
- :func:`until`: wait for a condition with a generous timeout that only guards against a hang
  (nothing is asserted on how long it took).
- :func:`free_port`: a loopback port for a server a test starts, never the same in two
  pytest-xdist workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
from sqlalchemy import text

from app.store.db import make_engine

T = TypeVar("T")

PROBLEM = "https://carryover.dev/problems/"

#: how long a wait may take before the test calls it a hang (never an assertion on speed)
HANG_GUARD_SECONDS = 60.0


def assert_problem(
    response: httpx.Response, status: int, slug: str, *, instance: bool = False
) -> dict[str, Any]:
    """``response`` is a problem answer of this status and type; its body.

    Every problem has the problem+json media type, ``type``, ``status`` and a non-empty
    ``title`` and ``detail``; its ``instance``, when there is one, is the path that was asked
    for. ``instance=True``: the member must be there (RFC 9457 makes it optional; today the
    413 of the body limit, the 422 of an unknown agent and the 412 of ``compact`` omit it).
    """
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json", response.text
    body: dict[str, Any] = response.json()
    assert body["type"] == PROBLEM + slug, body
    assert body["status"] == status, body
    assert isinstance(body["title"], str) and body["title"], body
    assert isinstance(body["detail"], str) and body["detail"], body
    if instance or "instance" in body:
        assert body["instance"] == response.request.url.path, body
    return body


def user(text: str) -> dict[str, Any]:
    """A user message of one text block, as the API reads and writes it."""
    return {"type": "user", "content": [{"type": "text", "text": text}]}


def user_texts(messages: Iterable[dict[str, Any]]) -> list[str]:
    """The text blocks of the user messages of ``messages``, in order."""
    return [
        block["text"]
        for m in messages
        if m["type"] == "user"
        for block in m["content"]
        if block["type"] == "text"
    ]


async def until(
    probe: Callable[[], Awaitable[T | None]],
    *,
    what: str = "condition",
    within: float = HANG_GUARD_SECONDS,
    interval: float = 0.01,
) -> T:
    """Poll ``probe`` until it returns something other than None; fail after ``within`` seconds
    (a hang guard: the test asserts on what ``probe`` returns, never on the time it took)."""

    async def poll() -> T:
        while True:
            value = await probe()
            if value is not None:
                return value
            await asyncio.sleep(interval)

    try:
        return await asyncio.wait_for(poll(), within)
    except TimeoutError:
        raise AssertionError(f"no {what} within {within}s (a hang)") from None


_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback TCP port that nothing listens on, for a server the test is about to start.

    The OS picks it (a bind to port 0). Under pytest-xdist each worker keeps only the ports of
    its own share (``port // 2 % workers == index``: Linux hands out ports of one parity first),
    so two workers never start servers on the same port between the moment one picks it and
    the moment its server binds it; one process never hands the same port out twice.
    """
    index, count = _worker()
    for _ in range(10_000):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if port // 2 % count == index and port not in _handed_out:
            _handed_out.add(port)
            return port
    raise AssertionError("no free loopback port")


def _worker() -> tuple[int, int]:
    """(index, count) of this pytest-xdist worker; (0, 1) when the tests run in one process."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if not name.startswith("gw") or count < 2:
        return 0, 1
    return int(name[2:]) % count, count


ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def served(directory: Path, **variables: str) -> Iterator[str]:
    """``carryover serve`` (``python -m app.cli`` of this checkout) on a free loopback port, with
    a fresh SQLite file in ``directory`` and ``variables`` (``CARRYOVER_…``) over an environment
    without the caller's own ``CARRYOVER_*`` and provider keys; its base URL until it is
    stopped. Its output goes to ``directory/server.log``, shown when it does not come up."""
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("CARRYOVER_") and k not in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")
    }
    env.update(
        {
            "CARRYOVER_DATABASE_URL": f"sqlite:///{directory / 'db.sqlite'}",
            "CARRYOVER_HOST": "127.0.0.1",
            "CARRYOVER_PORT": str(port),
            **variables,
        }
    )
    log = (directory / "server.log").open("w+", encoding="utf-8")
    process = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_ready(process, base_url, log)
        yield base_url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _wait_until_ready(process: subprocess.Popen[bytes], base_url: str, log: Any) -> None:
    import pytest

    deadline = time.monotonic() + HANG_GUARD_SECONDS * 2  # a hang guard, nothing asserted
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log.seek(0)
            pytest.fail(f"carryover serve exited with {process.returncode}:\n{log.read()}")
        try:
            if httpx.get(f"{base_url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    log.seek(0)
    pytest.fail(f"carryover serve never became ready:\n{log.read()}")


async def run_sql(url: str, sql: str) -> Any:
    """Run one SQL statement on the database at ``url`` in its own transaction, committed (a
    test reading or damaging rows behind the app's back): the first column of the first row
    when it returns rows, else the number of rows it changed."""
    engine = make_engine(url)
    try:
        async with engine.begin() as conn:
            result = await conn.execute(text(sql))
            return result.scalar() if result.returns_rows else result.rowcount
    finally:
        await engine.dispose()


@contextmanager
def server_calls(
    monkeypatch: Any, counted: Callable[[], bool] = lambda: True
) -> Iterator[list[str]]:
    """What asyncpg sends PostgreSQL inside the block, one entry per round trip: a prepared
    statement's execution (its first two words), an ``executemany``, a plain query
    (``BEGIN``, ``COMMIT``) or a statement prepared; only while ``counted()`` holds."""
    import asyncpg

    calls: list[str] = []
    recording = [True]
    fetch = asyncpg.prepared_stmt.PreparedStatement.fetch
    executemany = asyncpg.connection.Connection.executemany
    execute = asyncpg.connection.Connection.execute
    prepare = asyncpg.connection.Connection.prepare

    def words(query: str) -> str:
        return " ".join(query.split()[:2])

    async def counted_fetch(self: Any, *args: Any, **kwargs: Any) -> Any:
        if recording[0] and counted():
            calls.append(words(self.get_query()))
        return await fetch(self, *args, **kwargs)

    async def counted_executemany(self: Any, query: str, *args: Any, **kwargs: Any) -> Any:
        if recording[0] and counted():
            calls.append(f"many {words(query)}")
        return await executemany(self, query, *args, **kwargs)

    async def counted_execute(self: Any, query: str, *args: Any, **kwargs: Any) -> Any:
        if recording[0] and counted():
            calls.append(words(query).rstrip(";"))
        return await execute(self, query, *args, **kwargs)

    async def counted_prepare(self: Any, query: str, *args: Any, **kwargs: Any) -> Any:
        if recording[0] and counted():
            calls.append(f"prepare {words(query)}")
        return await prepare(self, query, *args, **kwargs)

    monkeypatch.setattr(asyncpg.prepared_stmt.PreparedStatement, "fetch", counted_fetch)
    monkeypatch.setattr(asyncpg.connection.Connection, "executemany", counted_executemany)
    monkeypatch.setattr(asyncpg.connection.Connection, "execute", counted_execute)
    monkeypatch.setattr(asyncpg.connection.Connection, "prepare", counted_prepare)
    try:
        yield calls
    finally:
        recording[0] = False
