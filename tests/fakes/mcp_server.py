"""A real MCP server for the tests: the ``mcp`` package's ``MCPServer`` on streamable HTTP, served
by uvicorn in a thread of its own on a free loopback port.

Its tools (every one records its calls in :attr:`FakeMcp.calls`):

- ``lookup(word)`` answers ``definition of WORD``;
- ``add(a, b)`` answers the sum;
- ``explode(reason)`` raises (the server answers an ``is_error`` result);
- ``hold(label)`` waits at a gate the test opens (:meth:`FakeMcp.gate`): it sets
  ``arrived[label]`` when the call is in, ``cancelled[label]`` when its request is cancelled (the
  client went away), and answers ``released LABEL`` once ``gates[label]`` is set.

Every HTTP request's headers are recorded (:attr:`FakeMcp.headers`), so a test can see what the
server was sent. ``extra_tools`` adds tools (e.g. one named like a tool of another server).

:class:`ConnectionProbe` is a TCP listener that only counts connections: a URL the service must
never contact points at it.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from mcp.server.mcpserver import MCPServer

from ..helpers import HANG_GUARD_SECONDS, free_port


class FakeMcp:
    """See the module. ``stateless``/``json_response``: the transport's modes."""

    def __init__(
        self,
        name: str = "fake",
        *,
        stateless: bool = False,
        json_response: bool = False,
        extra_tools: dict[str, Callable[..., Any]] | None = None,
    ) -> None:
        self.name = name
        self.stateless = stateless
        self.json_response = json_response
        self.extra_tools = extra_tools or {}
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.headers: list[dict[str, str]] = []
        self.gates: dict[str, threading.Event] = {}
        self.arrived: dict[str, threading.Event] = {}
        self.cancelled: dict[str, threading.Event] = {}
        self.port = free_port()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def tool_names(self) -> list[str]:
        return ["lookup", "add", "explode", "hold", *self.extra_tools]

    def gate(self, label: str) -> threading.Event:
        for table in (self.gates, self.arrived, self.cancelled):
            table.setdefault(label, threading.Event())
        return self.gates[label]

    def called(self, name: str) -> list[dict[str, Any]]:
        return [args for tool, args in self.calls if tool == name]

    def _server_app(self) -> Any:
        server = MCPServer(self.name, log_level="WARNING")
        fake = self

        @server.tool()
        async def lookup(word: str) -> str:
            """Look a word up."""
            fake.calls.append(("lookup", {"word": word}))
            return f"definition of {word}"

        @server.tool()
        async def add(a: int, b: int) -> int:
            """Add two integers."""
            fake.calls.append(("add", {"a": a, "b": b}))
            return a + b

        @server.tool()
        async def explode(reason: str = "boom") -> str:
            """Always fails."""
            fake.calls.append(("explode", {"reason": reason}))
            raise RuntimeError(f"exploded: {reason}")

        @server.tool()
        async def hold(label: str) -> str:
            """Waits until the test lets it answer."""
            fake.calls.append(("hold", {"label": label}))
            fake.gate(label)
            fake.arrived[label].set()
            try:
                # the gate is a thread's event (the test's loop is another one)
                while not fake.gates[label].is_set():  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                fake.cancelled[label].set()
                raise
            return f"released {label}"

        for name, fn in self.extra_tools.items():
            server.tool(name=name)(fn)

        app = server.streamable_http_app(
            stateless_http=self.stateless, json_response=self.json_response
        )

        async def recording(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                fake.headers.append(
                    {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
                )
            await app(scope, receive, send)

        return recording

    def start(self) -> FakeMcp:
        config = uvicorn.Config(
            self._server_app(),
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            lifespan="on",
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + HANG_GUARD_SECONDS  # a hang guard, nothing asserted
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the fake MCP server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        for gate in self.gates.values():
            gate.set()
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=HANG_GUARD_SECONDS)
        self._server = self._thread = None

    def __enter__(self) -> FakeMcp:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def wait_for(event: threading.Event, what: str) -> None:
    """Wait for a server thread's event without blocking the loop (a hang guard, no timing)."""
    if not await asyncio.to_thread(event.wait, HANG_GUARD_SECONDS):
        raise AssertionError(f"{what} never happened")


def wait_for_thread(event: threading.Event, what: str) -> None:
    """As :func:`wait_for`, for a test without an event loop (a hang guard, no timing)."""
    if not event.wait(HANG_GUARD_SECONDS):
        raise AssertionError(f"{what} never happened")


class ConnectionProbe:
    """A TCP listener that counts the connections made to it (and answers nothing).

    :meth:`settled` makes the count a fact, not a race: it connects to the listener itself and
    waits until that connection is accepted — connections are accepted in order, so every one
    made before it has been counted (the ``Listener`` of tests/security/test_limits.py does the
    same)."""

    def __init__(self) -> None:
        self.connections = 0
        self._peers: list[Any] = []  # the address of each connection accepted, in order
        self._own: set[Any] = set()  # those :meth:`settled` made
        self._seen = threading.Condition()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self._sock.settimeout(0.05)
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, peer = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            with self._seen:
                self.connections += 1
                self._peers.append(peer)
                self._seen.notify_all()
            conn.close()

    def settled(self) -> int:
        """The connections made to it so far by others (see the class)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=HANG_GUARD_SECONDS) as own:
            mine = own.getsockname()
            with self._seen:
                if not self._seen.wait_for(lambda: mine in self._peers, HANG_GUARD_SECONDS):
                    raise AssertionError("the probe's own connection was never accepted")
                self._own.add(mine)
                return sum(1 for p in self._peers if p not in self._own)

    def url(self, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}/mcp"

    def __enter__(self) -> ConnectionProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=HANG_GUARD_SECONDS)
        self._sock.close()


@contextmanager
def mcp_servers(*fakes: FakeMcp) -> Iterator[tuple[FakeMcp, ...]]:
    """Start several fakes, stop them all."""
    started: list[FakeMcp] = []
    try:
        for fake in fakes:
            started.append(fake.start())
        yield tuple(started)
    finally:
        for fake in started:
            fake.stop()
