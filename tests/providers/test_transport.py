"""The transport under both SDKs (aiohttp): each way a connection fails is reported as what it
is, through the providers' classification, never as another (a dropped connection is not a
timeout); a proxy from the environment is still used; a body arrives as it was sent."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import aiohttp
import httpx2
import pytest

from app.agent.messages import UserMessage
from app.agent.providers._sdk import timeout_error
from app.agent.providers._transport import LONG_BODY, ProviderHttpClient, transport_error
from app.agent.providers.anthropic import AnthropicProvider
from app.agent.providers.base import Provider, ProviderError, ProviderRequest, Timeouts
from app.agent.providers.openai import OpenAIProvider
from app.agent.providers.wire import Body
from tests.helpers import HANG_GUARD_SECONDS

SHORT = Timeouts(connect=5.0, idle=5.0)


def _providers(base: str) -> list[Provider]:
    return [
        OpenAIProvider(api_key="sk-x", base_url=base + "/v1", timeouts=SHORT),
        OpenAIProvider(api_key="sk-x", base_url=base + "/v1", timeouts=SHORT, stream=False),
        AnthropicProvider(api_key="sk-ant-x", base_url=base, timeouts=SHORT),
        AnthropicProvider(api_key="sk-ant-x", base_url=base, timeouts=SHORT, stream=False),
    ]


async def _text(provider: Provider) -> str:
    parts: list[str] = []

    async def consume() -> None:
        request = ProviderRequest(system_prompt="", messages=(UserMessage.text("x"),), model="m")
        async for event in provider.stream(request):
            text = getattr(event, "text", None)
            if isinstance(text, str):
                parts.append(text)

    await asyncio.wait_for(consume(), HANG_GUARD_SECONDS)
    return "".join(parts)


async def _fail(provider: Provider) -> ProviderError:
    with pytest.raises(ProviderError) as caught:
        await _text(provider)
    return caught.value


@pytest.fixture
async def hanging_up() -> AsyncIterator[str]:
    """A server that reads a request and closes the connection without a word."""

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(65536)
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


async def _connection_failures(base: str) -> list[ProviderError]:
    """Each provider's failure against ``base``: a failed connection, retryable, never
    called a timeout."""
    errors = []
    for provider in _providers(base):
        try:
            error = await _fail(provider)
        finally:
            await provider.aclose()
        assert error.kind == "retryable", error
        assert error.code != "timeout", error
        assert "connection failed" in error.message, error.message
        errors.append(error)
    return errors


async def test_a_server_that_hangs_up_is_a_dropped_connection_not_a_timeout(
    hanging_up: str,
) -> None:
    assert len(await _connection_failures(hanging_up)) == 4


@pytest.fixture
def closed_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]  # bound, never listening: connections are refused


async def test_a_refused_connection_names_the_address(closed_port: int) -> None:
    for error in await _connection_failures(f"http://127.0.0.1:{closed_port}"):
        assert f"127.0.0.1:{closed_port}" in error.message, error.message


def test_aiohttp_failures_map_onto_the_httpx_errors_the_sdks_classify() -> None:
    request = httpx2.Request("POST", "http://127.0.0.1:1/v1/chat/completions")
    connect = transport_error(aiohttp.ConnectionTimeoutError("connect timed out"), request)
    assert type(connect) is httpx2.ConnectTimeout and connect.request is request
    assert timeout_error("openai", connect, SHORT).message == (
        "openai: the provider could not connect within 5 s (connect_timeout)"
    )
    idle = transport_error(aiohttp.SocketTimeoutError("read timed out"), request)
    assert type(idle) is httpx2.ReadTimeout
    assert "(idle_timeout)" in timeout_error("openai", idle, SHORT).message
    assert type(transport_error(aiohttp.ServerDisconnectedError(), request)) is (
        httpx2.RemoteProtocolError
    )
    assert type(transport_error(aiohttp.ClientPayloadError("cut"), request)) is (
        httpx2.RemoteProtocolError
    )
    reset = aiohttp.ClientOSError(104, "Connection reset by peer")
    assert type(transport_error(reset, request)) is httpx2.ReadError


class _Proxy(BaseHTTPRequestHandler):
    """A forward proxy that answers every request itself, as the provider would, and keeps
    the request line it received (a proxied request names the whole URL)."""

    protocol_version = "HTTP/1.1"
    seen: list[str] = []
    bodies: list[Any] = []

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        type(self).bodies.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
        type(self).seen.append(self.requestline)
        body = json.dumps(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "through the proxy"},
                        "finish_reason": "stop",
                    }
                ],
            }
        ).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


async def test_a_proxy_from_the_environment_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = ThreadingHTTPServer(("127.0.0.1", 0), _Proxy)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    _Proxy.seen, _Proxy.bodies = [], []
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.server_address[1]}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    provider = OpenAIProvider(
        api_key="sk-x", base_url="http://api.example.invalid/v1", timeouts=SHORT, stream=False
    )
    # and a long conversation's request, whose body goes as its parts (wire.Body) through
    # httpx's own proxy transport
    texts = [f"message {i} " + "x" * 300 for i in range(1_500)]
    history = tuple(UserMessage.text(text) for text in texts)
    long = ProviderRequest(system_prompt="", messages=history, model="m")
    try:
        assert await _text(provider) == "through the proxy"
        async for _ in provider.stream(long):
            pass
    finally:
        await provider.aclose()
        proxy.shutdown()
        proxy.server_close()
    assert _Proxy.seen == ["POST http://api.example.invalid/v1/chat/completions HTTP/1.1"] * 2
    sent = _Proxy.bodies[1]["messages"]
    assert [m["content"] for m in sent] == texts


class _Echo(BaseHTTPRequestHandler):
    """Answers each POST with what it received: its body and two of its headers."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        if self.headers.get("transfer-encoding") == "chunked":
            body = b""
            while size := int(self.rfile.readline().strip(), 16):
                body += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
        else:
            body = self.rfile.read(int(self.headers["content-length"]))
        answer = json.dumps(
            {"body": body.decode(), "x-test": self.headers.get("x-test"), "path": self.path}
        ).encode()
        self.send_response(201)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)


@pytest.fixture
def echo_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


async def test_the_client_sends_bytes_and_streamed_bodies_as_they_are(echo_server: str) -> None:
    async def pieces() -> AsyncIterator[bytes]:
        for piece in (b'{"a": ', b'"caf\xc3\xa9"', b"}"):
            yield piece

    async with ProviderHttpClient() as client:
        sent = await client.post(
            f"{echo_server}/v1/x?q=a%2Fb", content=b"built once", headers={"x-test": "1"}
        )
        streamed = await client.post(f"{echo_server}/v1/y", content=pieces())
    assert sent.status_code == 201
    assert sent.json() == {"body": "built once", "x-test": "1", "path": "/v1/x?q=a%2Fb"}
    assert streamed.json()["body"] == '{"a": "café"}'


async def test_a_long_body_is_sent_whole_and_not_copied_to_join_the_headers(
    echo_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a long conversation's request: ~1 MB. aiohttp joins the headers to the first write into
    # one new bytes; what it joined is counted (before: the whole body, copied per request)
    joined: list[int] = []
    original = aiohttp.http_writer.StreamWriter._send_headers_with_payload

    def counting(self: Any, chunk: Any, is_eof: bool) -> None:
        joined.append(len(chunk))
        original(self, chunk, is_eof)

    monkeypatch.setattr(aiohttp.http_writer.StreamWriter, "_send_headers_with_payload", counting)
    body = json.dumps([f"message {i}: " + "é" * (i % 97) for i in range(12_000)]).encode()
    assert len(body) > 1_000_000
    async with ProviderHttpClient() as client:
        for _ in range(2):  # and the connection is reused after it
            sent = await client.post(f"{echo_server}/v1/long", content=body)
            assert sent.status_code == 201
            assert sent.json()["body"].encode() == body
        short = await client.post(f"{echo_server}/v1/short", content=b"short")
        assert short.json()["body"] == "short"
    assert joined[:2] == [LONG_BODY, LONG_BODY]
    assert joined[2] == len(b"short")  # a short body still goes in one write with the headers


async def test_a_body_of_parts_is_sent_whole_with_its_length_and_each_part_as_it_is(
    echo_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a long conversation's body as the providers hand it over: its parts (the pieces' chunks,
    # app/agent/providers/wire.py), posted with their length declared; what aiohttp is given
    # to write is recorded: the parts themselves, none joined or copied
    written: list[Any] = []
    original = aiohttp.http_writer.StreamWriter.write

    async def recording(self: Any, chunk: Any, **kwargs: Any) -> None:
        written.append(chunk)
        await original(self, chunk, **kwargs)

    monkeypatch.setattr(aiohttp.http_writer.StreamWriter, "write", recording)
    parts = [b'{"messages":[', *(json.dumps(["é" * 1000] * 200).encode() for _ in range(4)), b"]}"]
    body = Body(parts)
    async with ProviderHttpClient() as client:
        for _ in range(2):  # and the connection is reused after it
            written.clear()
            sent = await client.post(
                f"{echo_server}/v1/parts",
                content=body,
                headers={"Content-Length": str(len(body))},
            )
            assert sent.status_code == 201
            assert sent.json()["body"].encode() == b"".join(parts)
            assert [memoryview(chunk).obj for chunk in written] == parts
        # a streamed body whose length is not declared is sent with its length too
        unknown = await client.post(f"{echo_server}/v1/unknown", content=Body(parts))
        assert unknown.json()["body"].encode() == b"".join(parts)
