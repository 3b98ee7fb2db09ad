"""The tools an MCP server lists, kept for a while (docs/tools.md, "Listings and their cache").

A run lists every MCP server it may use before its prompts are admitted; a conversation runs
many times, so the listings are kept per process: for ``ttl`` seconds, at most ``max_entries``
servers and ``max_bytes`` of listed schemas (estimated as their JSON length), the oldest
dropped first. Two runs that need the same server's listing at once wait for one listing, not
two. The key is the server's URL and a digest of its headers (:attr:`McpServer.identity`):
the headers are never kept. A listing that failed is not kept (the next run tries again).
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from app.clock import SYSTEM_CLOCK, Clock

DEFAULT_TTL = 60.0
DEFAULT_MAX_ENTRIES = 256
DEFAULT_MAX_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class ListedTool:
    """One tool as a server lists it (before ``allowed_tools`` filters it)."""

    name: str
    description: str
    input_schema: Mapping[str, Any]
    annotations: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Listing:
    """What one server lists, and the estimated bytes it holds."""

    tools: tuple[ListedTool, ...]
    size: int = field(default=0, compare=False)

    @classmethod
    def of(cls, tools: tuple[ListedTool, ...]) -> Listing:
        size = sum(
            len(t.name) + len(t.description) + len(json.dumps(t.input_schema, default=str))
            for t in tools
        )
        return cls(tools, size)


class ListingCache:
    """Listings by server identity, bounded in entries, bytes and age (see the module)."""

    def __init__(
        self,
        *,
        ttl: float = DEFAULT_TTL,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        max_bytes: int = DEFAULT_MAX_BYTES,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.clock = clock
        self._entries: OrderedDict[str, tuple[float, Listing]] = OrderedDict()
        self._bytes = 0
        self._inflight: dict[str, asyncio.Future[Listing]] = {}
        self._waiting: dict[asyncio.Future[Listing], int] = {}
        #: listings fetched (misses), for tests and metrics
        self.fetches = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        return self._bytes

    def get(self, key: str) -> Listing | None:
        found = self._entries.get(key)
        if found is None:
            return None
        at, listing = found
        if self.clock.monotonic() - at >= self.ttl:
            self._drop(key)
            return None
        return listing

    def put(self, key: str, listing: Listing) -> None:
        if self.ttl <= 0 or self.max_entries <= 0 or listing.size > self.max_bytes:
            return
        self._drop(key)
        self._entries[key] = (self.clock.monotonic(), listing)
        self._bytes += listing.size
        while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: str) -> None:
        found = self._entries.pop(key, None)
        if found is not None:
            self._bytes -= found[1].size

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0

    async def listing(self, key: str, fetch: Callable[[], Awaitable[Listing]]) -> Listing:
        """The kept listing of ``key``, or ``fetch``'s (kept), fetched once for every caller
        that asks while it is under way. A caller that is cancelled leaves the fetch to the
        others; when none is left, it is cancelled too."""
        found = self.get(key)
        if found is not None:
            return found
        running = self._inflight.get(key)
        if running is None:
            self.fetches += 1
            running = asyncio.ensure_future(fetch())
            self._inflight[key] = running
            running.add_done_callback(lambda done: self._settle(key, done))
        self._waiting[running] = self._waiting.get(running, 0) + 1
        try:
            return await asyncio.shield(running)
        finally:
            left = self._waiting[running] - 1
            if left:
                self._waiting[running] = left
            else:
                del self._waiting[running]
                if not running.done():
                    running.cancel()

    def _settle(self, key: str, done: asyncio.Future[Listing]) -> None:
        if self._inflight.get(key) is done:
            del self._inflight[key]
        if not done.cancelled() and done.exception() is None:
            self.put(key, done.result())


__all__ = ["ListedTool", "Listing", "ListingCache"]
