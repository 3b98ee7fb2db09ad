"""Keep-alives for every event stream the service sends (docs/runs.md, "Keep-alives").

A stream that sends nothing for a while — a provider thinking for minutes, a run waiting for a
tool — is cut by any proxy with an idle timeout (60 s is common). :func:`keepalive` wraps a
stream's chunks and, whenever ``interval`` seconds pass without one, sends an SSE comment,
``: keep-alive`` and a blank line, which every SSE client ignores (WHATWG HTML §9.2.6: a line
starting with a colon). The interval is ``CARRYOVER_STREAM_KEEPALIVE_SECONDS`` (default 15).

The wrapped stream's next chunk is awaited in a task of its own, so that waiting for it can be
interrupted by the timer; cancelling the response cancels that task inside the wrapped stream
(where it awaits), as it would without the wrapper.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from app.agent.codec import compact_json
from app.store.tables import Dumped

#: the comment sent when a stream has been quiet for an interval
KEEPALIVE = b": keep-alive\n\n"

#: characters JSON leaves as they are inside a string, where line readers that follow Python's
#: ``str.splitlines`` (httpx's ``aiter_lines`` among them) end a line: escaped in an event's
#: data, which stays the same JSON value on one line
_LINE_ENDS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def _event_data(text: str) -> str:
    """A JSON text as an event's ``data`` line: :data:`_LINE_ENDS` escaped (WHATWG HTML
    §9.2.6 ends a line only at CR and LF; some clients end one at these too)."""
    if "\u2028" in text or "\u2029" in text or "\x85" in text:
        return text.translate(_LINE_ENDS)
    return text


def sse_event(name: str, data: Any, seq: int | None = None) -> bytes:
    """One server-sent event of a run's stream, live or stored: ``data`` as compact JSON,
    UTF-8 as it is (a :class:`~app.store.tables.Dumped` text, a message's or a compaction's,
    as it is), and ``id`` the run's event seq (resume after it with ``Last-Event-ID``)."""
    body = _event_data(data if isinstance(data, Dumped) else compact_json(data))
    tail = f"id: {seq}\n" if seq is not None else ""
    return f"event: {name}\ndata: {body}\n{tail}\n".encode()


async def keepalive(
    source: AsyncIterator[bytes],
    interval: float,
    *,
    timer: Callable[[], Awaitable[Any]] | None = None,
) -> AsyncIterator[bytes]:
    """``source``'s chunks, with :data:`KEEPALIVE` after every ``interval`` seconds without
    one. ``timer`` (for tests): an awaitable per quiet period instead of ``interval``."""
    wait = timer or (lambda: asyncio.sleep(interval))
    chunks = source.__aiter__()
    pending: asyncio.Future[bytes] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(chunks.__anext__())
            tick = asyncio.ensure_future(wait())
            try:
                await asyncio.wait({pending, tick}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                tick.cancel()
            if not pending.done():
                yield KEEPALIVE
                continue
            done, pending = pending, None
            try:
                chunk = done.result()
            except StopAsyncIteration:
                return
            yield chunk
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()


__all__ = ["KEEPALIVE", "keepalive"]
