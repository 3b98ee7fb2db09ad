"""Configured limits (contract §6): body size (413), decoded image size, prompts per run, text
length, messages of an uploaded context and page sizes (422 ``limit-exceeded`` naming the
limit). Each refused request leaves the stored state exactly as it was. Image URLs are stored
and passed to the provider, never fetched by the server."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from app.config import AgentProfile, Settings
from tests.fakes.openai_fake import OpenAIFake, Reply
from tests.fakes.openai_fake import openai_fake as openai_fake

from ..helpers import assert_problem, until
from .conftest import AppClient, StartApp, http_client, snapshot

LIMITS = {
    "max_body_bytes": 4096,
    "max_image_bytes": 300,
    "max_prompts_per_run": 2,
    "max_text_chars": 100,
    "max_context_messages": 3,
    "max_page_size": 5,
    "default_page_size": 5,
}
CONV = "limited"


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def image(size: int) -> dict[str, Any]:
    data = base64.b64encode(b"\x89" * size).decode()
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}


def user(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"type": "user", "content": list(blocks)}


def assistant(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"type": "assistant", "content": list(blocks)}


def tool_turn(result: dict[str, Any]) -> list[dict[str, Any]]:
    call = {"type": "tool_call", "id": "call_1", "name": "time_now", "arguments": "{}"}
    return [
        user(text("time?")),
        assistant(call),
        {
            "type": "tool_result",
            "tool_call_id": "call_1",
            "tool_name": "time_now",
            "content": [result],
        },
    ]


@pytest.fixture
async def limited(start_app: StartApp) -> AsyncIterator[AppClient]:
    async with start_app(**LIMITS) as app:
        client = http_client(app)
        assert (await client.post("/conversations", json={"id": CONV})).status_code == 201
        ran = await client.post(f"/conversations/{CONV}/runs", json={"prompts": ["first"]})
        assert ran.status_code == 201
        yield client


Send = Callable[[AppClient], Any]


async def refused_without_a_write(
    client: AppClient, database_url: str, send: Send, status: int, slug: str
) -> dict[str, Any]:
    before = await snapshot(database_url)
    problem = assert_problem(await send(client), status, slug)
    assert await snapshot(database_url) == before
    return problem


# --- body size ------------------------------------------------------------------------------


async def test_a_body_over_max_body_bytes_is_413(limited: AppClient, database_url: str) -> None:
    big = {"prompts": ["x" * 5000]}

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it streams
        for _ in range(10):
            yield b" " * 500
        yield b'{"prompts": ["hi"]}'

    for send in (
        lambda c: c.post(f"/conversations/{CONV}/runs", json=big),
        lambda c: c.put(
            f"/conversations/{CONV}/context",
            json={"summary": "s" * 5000},
            headers={"If-Match": "*"},
        ),
        lambda c: c.post("/conversations", json={"system_prompt": "p" * 5000}),
        lambda c: c.post(
            f"/conversations/{CONV}/runs",
            content=chunks(),
            headers={"content-type": "application/json"},
        ),
    ):
        problem = await refused_without_a_write(
            limited, database_url, send, 413, "payload-too-large"
        )
        assert (problem["limit"], problem["maximum"]) == ("max_body_bytes", 4096)
        assert "4096 bytes" in problem["detail"]


# --- 422 limit-exceeded ---------------------------------------------------------------------

REFUSED: dict[str, tuple[str, Callable[[AppClient], Any], str | None]] = {
    "image in a prompt": (
        "max_image_bytes",
        lambda c: c.post(
            f"/conversations/{CONV}/runs", json={"prompts": [user(text("look"), image(301))]}
        ),
        "body.prompts[0].content[1].source.data",
    ),
    "image in a context": (
        "max_image_bytes",
        lambda c: c.put(
            f"/conversations/{CONV}/context",
            headers={"If-Match": "*"},
            json={"messages": [user(image(301))]},
        ),
        "body.messages[0].content[0].source.data",
    ),
    "image in a tool result": (
        "max_image_bytes",
        lambda c: c.put(
            f"/conversations/{CONV}/context",
            headers={"If-Match": "*"},
            json={"messages": tool_turn(image(301))},
        ),
        "body.messages[2].content[0].source.data",
    ),
    "prompts per run": (
        "max_prompts_per_run",
        lambda c: c.post(f"/conversations/{CONV}/runs", json={"prompts": ["a", "b", "c"]}),
        None,
    ),
    "text of a bare prompt": (
        "max_text_chars",
        lambda c: c.post(f"/conversations/{CONV}/runs", json={"prompts": ["x" * 101]}),
        "body.prompts[0].content[0].text",
    ),
    "text of a prompt block": (
        "max_text_chars",
        lambda c: c.post(
            f"/conversations/{CONV}/runs",
            json={"prompts": ["ok", user(text("fine"), text("y" * 101))]},
        ),
        "body.prompts[1].content[1].text",
    ),
    "system prompt of a new conversation": (
        "max_text_chars",
        lambda c: c.post("/conversations", json={"id": "new", "system_prompt": "s" * 101}),
        "body.system_prompt",
    ),
    "system prompt of a context": (
        "max_text_chars",
        lambda c: c.put(
            f"/conversations/{CONV}/context",
            headers={"If-Match": "*"},
            json={"system_prompt": "s" * 101},
        ),
        "body.system_prompt",
    ),
    "summary of a context": (
        "max_text_chars",
        lambda c: c.put(
            "/conversations/created/context",
            headers={"If-None-Match": "*"},
            json={"summary": "s" * 101},
        ),
        "body.summary",
    ),
    "a run's instructions": (
        "max_text_chars",
        lambda c: c.post(
            f"/conversations/{CONV}/runs", json={"prompts": ["q"], "instructions": "i" * 101}
        ),
        "body.instructions",
    ),
    "assistant text in a context": (
        "max_text_chars",
        lambda c: c.put(
            f"/conversations/{CONV}/context",
            headers={"If-Match": "*"},
            json={"messages": [user(text("q")), assistant(text("a" * 101))]},
        ),
        "body.messages[1].content[0].text",
    ),
    "tool result text in a context": (
        "max_text_chars",
        lambda c: c.put(
            f"/conversations/{CONV}/context",
            headers={"If-Match": "*"},
            json={"messages": tool_turn(text("r" * 101))},
        ),
        "body.messages[2].content[0].text",
    ),
    "messages of a context": (
        "max_context_messages",
        lambda c: c.put(
            f"/conversations/{CONV}/context",
            headers={"If-Match": "*"},
            json={"messages": [*tool_turn(text("r")), user(text("more"))]},
        ),
        None,
    ),
    "page of conversations": (
        "max_page_size",
        lambda c: c.get("/conversations", params={"limit": 6}),
        None,
    ),
    "page of runs": (
        "max_page_size",
        lambda c: c.get(f"/conversations/{CONV}/runs", params={"limit": 1_000_000}),
        None,
    ),
    "page of the transcript": (
        "max_page_size",
        lambda c: c.get(f"/conversations/{CONV}/transcript", params={"limit": 6}),
        None,
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
async def test_a_limit_exceeded_is_422_naming_it_and_writes_nothing(
    limited: AppClient, database_url: str, case: str
) -> None:
    limit, send, path = REFUSED[case]
    problem = await refused_without_a_write(limited, database_url, send, 422, "limit-exceeded")
    assert (problem["limit"], problem["maximum"]) == (limit, LIMITS[limit])
    assert problem["actual"] > LIMITS[limit]
    assert problem["detail"].startswith(f"{limit} is {LIMITS[limit]} (got ")
    assert problem.get("path") == path


async def test_everything_at_the_limits_is_accepted(limited: AppClient) -> None:
    at_most = image(300)
    ran = await limited.post(
        f"/conversations/{CONV}/runs",
        json={"prompts": ["x" * 100, user(at_most)], "instructions": "i" * 100},
    )
    assert ran.status_code == 201, ran.text
    current = (await limited.get(f"/conversations/{CONV}/context")).headers["etag"]
    put = await limited.put(
        f"/conversations/{CONV}/context",
        headers={"If-Match": current},
        json={"system_prompt": "s" * 100, "summary": "u" * 100, "messages": tool_turn(at_most)},
    )
    assert put.status_code == 200, put.text
    for url in (
        "/conversations",
        f"/conversations/{CONV}/runs",
        f"/conversations/{CONV}/transcript",
    ):
        assert (await limited.get(url, params={"limit": 5})).status_code == 200


def test_the_defaults_fit_production_use() -> None:
    settings = Settings()
    assert settings.max_body_bytes == 8 * 1024 * 1024
    assert settings.max_image_bytes == 5 * 1024 * 1024  # what the providers accept per image
    assert settings.max_prompts_per_run == 32
    assert settings.max_text_chars == 200_000
    assert settings.max_context_messages == 10_000
    assert (settings.max_page_size, settings.default_page_size) == (200, 50)
    # the largest image allowed fits a body, base64-encoded, with room for the rest
    assert settings.max_image_bytes * 4 // 3 < settings.max_body_bytes
    for name, bad in (
        ("max_body_bytes", 10),
        ("max_prompts_per_run", 0),
        ("max_page_size", 0),
        ("max_image_bytes", 7 * 1024 * 1024),
    ):
        with pytest.raises(ValueError, match=name):
            Settings(**{name: bad})


async def test_a_largest_image_under_the_default_limits_is_stored(
    start_app: StartApp,
) -> None:
    async with start_app() as app:
        client = http_client(app)
        await client.post("/conversations", json={"id": "big"})
        largest = image(5 * 1024 * 1024)
        ran = await client.post(
            "/conversations/big/runs", json={"prompts": [user(text("look"), largest)]}
        )
        assert ran.status_code == 201, ran.text[:300]
        one_more = image(5 * 1024 * 1024 + 1)
        refused = await client.post("/conversations/big/runs", json={"prompts": [user(one_more)]})
        assert assert_problem(refused, 422, "limit-exceeded")["limit"] == "max_image_bytes"
        stored = (await client.get("/conversations/big/context")).json()
        assert stored["messages"][0]["content"][1] == largest


# --- image URLs are never fetched --------------------------------------------------------------


class Listener:
    """A TCP listener on 127.0.0.1 that records every connection made to it.

    :meth:`settled` makes "nothing connected" a fact rather than a pause: it connects once itself
    (that connection is not counted) and waits until the listener has taken it. Connections are
    taken in the order they were made, so any connection made before that one is counted by
    then.
    """

    def __init__(self) -> None:
        self.peers: list[Any] = []
        self._probes: set[Any] = set()
        self.server: asyncio.Server | None = None
        self.url = ""
        self._address: tuple[str, int] = ("127.0.0.1", 0)

    @property
    def connections(self) -> int:
        return sum(1 for peer in self.peers if peer not in self._probes)

    async def settled(self) -> None:
        """Return once every connection made to the listener before this call is counted."""
        _, writer = await asyncio.open_connection(*self._address)
        probe = writer.get_extra_info("sockname")
        self._probes.add(probe)

        async def taken() -> bool | None:
            return True if probe in self.peers else None

        try:
            await until(taken, what="the listener to take its probe")
        finally:
            writer.close()
            await writer.wait_closed()

    async def __aenter__(self) -> Listener:
        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.peers.append(writer.get_extra_info("peername"))
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: image/png\r\ncontent-length: 0\r\n"
                b"connection: close\r\n\r\n"
            )
            await writer.drain()
            writer.close()

        self.server = await asyncio.start_server(accept, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self._address = ("127.0.0.1", port)
        self.url = f"http://127.0.0.1:{port}/cat.png"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


async def test_image_urls_are_stored_and_passed_on_never_fetched(
    start_app: StartApp,
    openai_fake: OpenAIFake,
) -> None:
    openai_fake.default = Reply(text="A cat.")
    profile = AgentProfile(
        provider="openai",
        model="gpt-fake",
        base_url=openai_fake.base_url,
        api_key=openai_fake.api_key,
    )
    async with Listener() as listener, start_app(agents={"gpt": profile}) as app:
        client = http_client(app)
        picture = {"type": "image", "source": {"type": "url", "url": listener.url}}
        created = await client.put(
            "/conversations/pics/context",
            headers={"If-None-Match": "*"},
            json={"messages": [user(text("earlier"), picture), assistant(text("Nice."))]},
        )
        assert created.status_code == 201, created.text
        for agent in ("default", "gpt"):  # echo, and a provider over HTTP
            ran = await client.post(
                "/conversations/pics/runs",
                json={"agent": agent, "prompts": [user(text("and this?"), picture)]},
            )
            assert ran.status_code == 201 and ran.json()["status"] == "completed", ran.text
        await listener.settled()  # a fetch, if anything had started one, has connected
        stored = (await client.get("/conversations/pics/context")).json()
        transcript = (await client.get("/conversations/pics/transcript")).json()
    assert listener.connections == 0
    images = [
        b
        for m in stored["messages"]
        if m["type"] == "user"
        for b in m["content"]
        if b["type"] == "image"
    ]
    assert images == [picture] * 3
    assert listener.url in str(transcript)
    sent = openai_fake.chat_requests[-1].json["messages"]
    urls = [
        part["image_url"]["url"]
        for message in sent
        if isinstance(message["content"], list)
        for part in message["content"]
        if part["type"] == "image_url"
    ]
    assert urls == [listener.url] * 3  # the provider gets the URL itself, to fetch or not


async def test_a_url_image_is_not_resolved_even_when_it_is_refused(
    limited: AppClient, database_url: str
) -> None:
    async with Listener() as listener:
        picture = {"type": "image", "source": {"type": "url", "url": listener.url}}
        await refused_without_a_write(
            limited,
            database_url,
            lambda c: c.post(
                f"/conversations/{CONV}/runs", json={"prompts": ["a", "b", user(picture)]}
            ),
            422,
            "limit-exceeded",
        )
        await listener.settled()
    assert listener.connections == 0


def test_limits_are_configurable_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in LIMITS.items():
        monkeypatch.setenv(f"CARRYOVER_{name.upper()}", str(value))
    settings = Settings()
    assert {name: getattr(settings, name) for name in LIMITS} == LIMITS
