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
import os
import socket
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import httpx

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
