"""The live events of a streamed run, between the run and its reader, held within a bound.

A run streamed to the client that started it (``POST …/runs`` with SSE) hands each numbered
event to a :class:`LiveStream`; the response takes them out as fast as the client reads. A
client that stops reading (or reads slower than the run produces) would make the run's events
pile up in memory without end, so the stream holds at most ``max_bytes`` of them (their JSON
size, estimated; at least the one event being handed over). An event that would pass the bound
*cuts* the stream: what it held is dropped at once, the reader gets :class:`ReaderBehind` when
it next asks (the response then ends with an ``error`` event saying where to resume), and
nothing more is kept for it. The run goes on unaffected — its events are stored as always, so
the client resumes at ``GET …/runs/{id}/events`` after the last ``id`` it received
(``Last-Event-ID``) and loses nothing.

The interface is the part of :class:`asyncio.Queue` the run uses: :meth:`put_nowait` (``None``
ends the stream) and :meth:`get`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

#: what one event costs beyond its payload (name, id, framing), in the estimate
EVENT_OVERHEAD = 32


@dataclass(frozen=True)
class StreamedEvent:
    """One numbered event of a run: ``event`` is the SSE event name, ``data`` its payload
    (``None`` for ``run.finished``, which is rendered from the run's record or outcome)."""

    seq: int
    event: str
    data: Any


class ReaderBehind(Exception):
    """The reader fell further behind than the bound allows: its live stream was cut."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(f"the reader fell more than {max_bytes} bytes of events behind")
        self.max_bytes = max_bytes


def approx_size(data: Any) -> int:
    """About how many bytes ``data`` takes as JSON (strings by their length): cheap, no
    encoding."""
    if isinstance(data, str):
        return len(data) + 2
    if isinstance(data, dict):
        return 2 + sum(approx_size(k) + approx_size(v) + 2 for k, v in data.items())
    if isinstance(data, list | tuple):
        return 2 + sum(approx_size(v) + 1 for v in data)
    return 8


class LiveStream:
    """A bounded hand-over of a run's events to its reader (see the module's docstring)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: deque[tuple[StreamedEvent, int]] = deque()
        self._bytes = 0
        self._ended = False
        self._ready = asyncio.Event()
        self.cut = False
        #: the most it held at once (bytes, estimated)
        self.high_water = 0

    @property
    def held_bytes(self) -> int:
        return self._bytes

    def put_nowait(self, item: StreamedEvent | None) -> None:
        """Hand over one event (``None``: the run's live events end here)."""
        if item is None:
            self._ended = True
        elif not self.cut and not self._ended:
            size = approx_size(item.data) + len(item.event) + EVENT_OVERHEAD
            if self._items and self._bytes + size > self.max_bytes:
                self.cut = True
                self._items.clear()
                self._bytes = 0
                log.info(
                    "a stream's reader fell more than %d bytes behind at event %d: its live "
                    "stream is cut (it may resume from the stored events)",
                    self.max_bytes,
                    item.seq,
                )
            else:
                self._items.append((item, size))
                self._bytes += size
                self.high_water = max(self.high_water, self._bytes)
        self._ready.set()

    async def get(self) -> StreamedEvent | None:
        """The next event; ``None`` once the live events ended; :class:`ReaderBehind` once
        the stream was cut."""
        while True:
            if self.cut:
                raise ReaderBehind(self.max_bytes)
            if self._items:
                item, size = self._items.popleft()
                self._bytes -= size
                return item
            if self._ended:
                return None
            self._ready.clear()
            await self._ready.wait()

    def qsize(self) -> int:
        return len(self._items)


__all__ = ["EVENT_OVERHEAD", "LiveStream", "ReaderBehind", "approx_size"]
