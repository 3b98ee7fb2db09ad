"""A small real HTTP/1.1 server on 127.0.0.1 for the fake providers.

It runs ``http.server.ThreadingHTTPServer`` in a daemon thread, so it serves real sockets to
the SDKs' async clients from inside any event loop (pytest-asyncio or not). A fake provider
subclasses :class:`FakeServer` and implements :meth:`FakeServer.handle`, which returns a
:class:`JSONAnswer` or an :class:`SSEAnswer`. SSE bodies go out with chunked transfer
encoding, one chunk per event, so a test can

- ``cut_after=N``: drop the TCP connection after N events, without the terminating chunk
  (the client sees a broken body, like a crashed server or a network cut), or
- ``end_after=N``: end the body cleanly after N events (a well-formed HTTP answer whose
  stream simply stops before its final event), or
- ``malformed_at=N``: send event N cut in the middle of its JSON (``data: {"id": "x", …"bro``)
  and go on with the rest, like a proxy that mangled one chunk.

A :class:`RawHTTP` answer sends any status, content type and body (an HTML error page of a
proxy, a 200 that is not an event stream); :func:`html_page` builds a realistic one.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class RecordedRequest:
    """One request the fake received (headers with lower-case names)."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any  # parsed JSON, or the raw text when it is not JSON

    @property
    def json(self) -> dict[str, Any]:
        assert isinstance(self.body, dict), self.body
        return self.body


@dataclass
class JSONAnswer:
    status: int
    body: Any
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass
class SSEAnswer:
    events: Sequence[bytes]  # each one complete, "event: ...\ndata: ...\n\n"
    headers: Mapping[str, str] = field(default_factory=dict)
    cut_after: int | None = None
    end_after: int | None = None
    delay: float = 0.0  # seconds before each event
    malformed_at: int | None = None  # this event goes out with its JSON cut in the middle


@dataclass
class RawHTTP:
    """Any answer at all: a status, a content type and a body, sent as they are."""

    status: int
    body: str | bytes
    content_type: str = "text/html; charset=utf-8"
    headers: Mapping[str, str] = field(default_factory=dict)


def html_page(status: int = 502, title: str = "502 Bad Gateway") -> RawHTTP:
    """The kind of page a reverse proxy answers when the API behind it is down."""
    body = (
        "<!DOCTYPE html>\n<html>\n<head><title>"
        f"{title}</title>\n<style>body {{ font-family: sans-serif; }}</style></head>\n"
        f"<body>\n<center><h1>{title}</h1></center>\n<hr><center>nginx/1.25.3</center>\n"
        + "<!-- a padding comment to make the page as long as real ones are -->\n" * 8
        + "</body>\n</html>\n"
    )
    return RawHTTP(status, body)


def malformed(event: bytes) -> bytes:
    """``event`` with its ``data:`` JSON cut in the middle (the event itself stays framed)."""
    head, _, data = event.rstrip(b"\n").rpartition(b"data: ")
    return head + b"data: " + data[: max(1, len(data) // 2)] + b"\n\n"


def sse(data: Any, event: str | None = None) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n".encode()


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that timed out, was cancelled or closed a kept-alive connection resets
        # the socket; that is normal for a test server, anything else is reported.
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            return
        super().handle_error(request, client_address)


class FakeServer:
    """Base of the fake providers: a scriptable queue of answers and a request log."""

    def __init__(self) -> None:
        self.requests: list[RecordedRequest] = []
        #: TCP connections accepted so far (a client reusing its kept-alive connection opens
        #: no new one)
        self.connections = 0
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> FakeServer:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def setup(self) -> None:  # once per accepted connection
                with fake._lock:
                    fake.connections += 1
                super().setup()

            def do_GET(self) -> None:
                fake._serve(self)

            def do_POST(self) -> None:
                fake._serve(self)

        httpd = _QuietServer(("127.0.0.1", 0), Handler)
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def origin(self) -> str:
        assert self._httpd is not None, "the fake server is not started"
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    # --- to override -------------------------------------------------------------------

    def handle(self, request: RecordedRequest) -> JSONAnswer | SSEAnswer | RawHTTP:
        raise NotImplementedError

    # --- plumbing ----------------------------------------------------------------------

    def _serve(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("content-length") or 0)
        raw = h.rfile.read(length) if length else b""
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        request = RecordedRequest(
            method=h.command,
            path=h.path,
            headers={k.lower(): v for k, v in h.headers.items()},
            body=body,
        )
        with self._lock:
            self.requests.append(request)
            answer = self.handle(request)
        if isinstance(answer, JSONAnswer):
            self._send_json(h, answer)
        elif isinstance(answer, RawHTTP):
            self._send_raw(h, answer)
        else:
            self._send_sse(h, answer)

    @staticmethod
    def _send_raw(h: BaseHTTPRequestHandler, answer: RawHTTP) -> None:
        data = answer.body.encode() if isinstance(answer.body, str) else answer.body
        h.send_response(answer.status)
        h.send_header("content-type", answer.content_type)
        h.send_header("content-length", str(len(data)))
        for name, value in answer.headers.items():
            h.send_header(name, value)
        h.end_headers()
        h.wfile.write(data)
        h.wfile.flush()

    @staticmethod
    def _send_json(h: BaseHTTPRequestHandler, answer: JSONAnswer) -> None:
        data = json.dumps(answer.body, ensure_ascii=False).encode()
        h.send_response(answer.status)
        h.send_header("content-type", "application/json")
        h.send_header("content-length", str(len(data)))
        for name, value in answer.headers.items():
            h.send_header(name, value)
        h.end_headers()
        h.wfile.write(data)
        h.wfile.flush()

    @staticmethod
    def _send_sse(h: BaseHTTPRequestHandler, answer: SSEAnswer) -> None:
        h.send_response(200)
        h.send_header("content-type", "text/event-stream; charset=utf-8")
        h.send_header("cache-control", "no-cache")
        h.send_header("transfer-encoding", "chunked")
        for name, value in answer.headers.items():
            h.send_header(name, value)
        h.end_headers()
        h.wfile.flush()
        try:
            for n, event in enumerate(answer.events):
                if answer.cut_after is not None and n >= answer.cut_after:
                    h.wfile.flush()
                    h.close_connection = True
                    # Abort: no terminating chunk; the client sees the body break off.
                    h.connection.shutdown(socket.SHUT_RDWR)
                    return
                if answer.end_after is not None and n >= answer.end_after:
                    break
                if answer.delay:
                    time.sleep(answer.delay)
                if n == answer.malformed_at:
                    event = malformed(event)
                h.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                h.wfile.flush()
            if answer.cut_after is not None and answer.cut_after >= len(answer.events):
                h.close_connection = True
                h.connection.shutdown(socket.SHUT_RDWR)
                return
            h.wfile.write(b"0\r\n\r\n")
            h.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            h.close_connection = True  # the client went away (cancelled): fine


def pieces(text: str, size: int) -> Iterator[str]:
    """``text`` cut into chunks of ``size`` characters, as a stream would deliver it."""
    size = max(1, size)
    for start in range(0, len(text), size):
        yield text[start : start + size]
