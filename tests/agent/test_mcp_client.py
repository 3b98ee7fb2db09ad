"""The MCP client of the agent layer (app/agent/mcp/): a request's server is checked again at
each connection and connected to at the address checked (a name that resolves elsewhere a
moment later cannot redirect it); the listing cache is bounded and fetches once for callers
that ask together; approval policies read as OpenAI writes them."""

from __future__ import annotations

import asyncio
import ipaddress
from typing import Any

import httpx2
import pytest

from app.addresses import Target
from app.agent.mcp import ApprovalPolicy, ListedTool, Listing, ListingCache, McpClient, McpServer
from app.agent.mcp._wire import _Pinned
from app.agent.mcp.client import McpFailure
from app.clock import ManualClock

from ..fakes.mcp_server import ConnectionProbe, FakeMcp


class Recording(httpx2.AsyncBaseTransport):
    def __init__(self) -> None:
        self.seen: list[httpx2.Request] = []

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        self.seen.append(request)
        return httpx2.Response(204)


async def test_a_checked_server_is_connected_to_at_the_address_checked() -> None:
    ip = ipaddress.ip_address("93.184.216.34")
    target = Target("https://mcp.example.com:8443/mcp", "mcp.example.com", 8443, (ip,))
    inner = Recording()
    async with httpx2.AsyncClient(transport=_Pinned(inner, target)) as http:
        await http.post("https://mcp.example.com:8443/mcp", content=b"{}")
    [sent] = inner.seen
    assert sent.url.host == "93.184.216.34" and sent.url.port == 8443
    assert sent.headers["host"] == "mcp.example.com:8443"
    assert sent.extensions["sni_hostname"] == "mcp.example.com"


async def test_a_name_that_now_resolves_to_a_private_address_is_not_connected_to() -> None:
    async def loopback(host: str, port: int) -> list[Any]:
        return [ipaddress.ip_address("127.0.0.1")]

    with ConnectionProbe() as probe:
        server = McpServer(
            label="moved", url=f"http://mcp.example.com:{probe.port}/mcp", check_addresses=True
        )
        client = McpClient(resolver=loopback)
        with pytest.raises(McpFailure) as refused:
            await client.fetch_tools(server)
        assert "refused" in str(refused.value) and "loopback" in str(refused.value)
        assert probe.settled() == 0


async def test_the_listing_cache_is_bounded_and_fetches_once_for_callers_together() -> None:
    clock = ManualClock()
    cache = ListingCache(ttl=60, max_entries=2, clock=clock)
    listing = Listing.of((ListedTool("t", "", {"type": "object"}),))
    gate = asyncio.Event()

    async def fetch() -> Listing:
        await gate.wait()
        return listing

    waiting = [asyncio.create_task(cache.listing("a", fetch)) for _ in range(3)]
    await asyncio.sleep(0)
    gate.set()
    assert [await w for w in waiting] == [listing] * 3
    assert cache.fetches == 1
    for key in ("b", "c"):
        await cache.listing(key, fetch)
    assert len(cache) == 2 and cache.get("a") is None  # the oldest went first
    clock.advance(60)
    assert cache.get("c") is None  # past its age
    assert cache.bytes == listing.size  # "b" is still counted until read


async def test_a_listing_is_cached_under_its_url_and_headers() -> None:
    with FakeMcp("cached") as fake:
        client = McpClient()
        plain = McpServer(label="a", url=fake.url)
        other = McpServer(label="b", url=fake.url)  # same URL and headers: one listing
        keyed = McpServer(label="c", url=fake.url, headers={"Authorization": "Bearer k"})
        for server in (plain, other, keyed):
            found = await client.list_tools(server)
            assert {t.name for t in found.tools} >= {"lookup", "add"}
        assert client.cache.fetches == 2


@pytest.mark.parametrize(
    ("given", "asks", "quiet"),
    [
        (None, {"x", "y"}, set()),
        ("always", {"x", "y"}, set()),
        ("never", set(), {"x", "y"}),
        ({"never": {"tool_names": ["x"]}}, {"y"}, {"x"}),
        ({"always": {"tool_names": ["x"]}}, {"x"}, {"y"}),
    ],
)
def test_approval_policies_read_as_openai_writes_them(
    given: Any, asks: set[str], quiet: set[str]
) -> None:
    policy = ApprovalPolicy.parse(given)
    assert {n for n in ("x", "y") if policy.requires(n)} == asks
    assert {n for n in ("x", "y") if not policy.requires(n)} == quiet


@pytest.mark.parametrize(
    "given",
    [
        "sometimes",
        {},
        {"never": {"tool_names": ["x"]}, "always": {"tool_names": ["x"]}},
        {"never": {"tool_names": ["x"], "read_only": True}},
        {"never": {"tool_names": ["bad name"]}},
    ],
)
def test_an_approval_policy_that_is_not_one_is_refused(given: Any) -> None:
    with pytest.raises(ValueError):
        ApprovalPolicy.parse(given)
