"""The server-sent events of a streamed run, read line by line (the chat's only parser of the
wire format)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ServerEvent:
    event: str
    data: Any


async def server_events(lines: AsyncIterator[str]) -> AsyncIterator[ServerEvent]:
    """The events of a ``text/event-stream`` body given line by line (WHATWG HTML §9.2.6:
    ``event:`` names it, ``data:`` lines are joined by newlines, a blank line dispatches, a
    line starting with ``:`` is a comment). Each event's data is JSON here."""
    name, data = "", list[str]()
    async for line in lines:
        if not line:
            if data:
                yield ServerEvent(name or "message", json.loads("\n".join(data)))
            name, data = "", []
            continue
        if line.startswith(":"):
            continue
        key, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if key == "event":
            name = value
        elif key == "data":
            data.append(value)
    if data:
        yield ServerEvent(name or "message", json.loads("\n".join(data)))
