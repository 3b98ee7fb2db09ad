"""A run's events, durable and resumable.

:class:`EventRecorder` takes the events of one run of this process as the agent reports them,
numbers them (``seq`` from 1), coalesces text, thinking and tool-argument deltas (a block's
first parts, those that arrive in one turn of the event loop, are one event sent at the end of
that turn; after them, the parts arriving within :data:`COALESCE_SECONDS` of the first of them
become one event), hands each numbered event to the run's live stream (the POST's SSE), and
writes them in batches: every :data:`FLUSH_SECONDS` while the run goes, and the rest with the
``run.finished`` marker in the transaction that records the run's outcome. So a run costs one
event statement per :data:`FLUSH_SECONDS` of its duration plus none at its end (the last batch
rides along), never one per token; a run shorter than the flush interval writes its events in
its finish.

:class:`EventFeed` reads them back for ``GET …/runs/{id}/events`` from any replica: from the
database, after a ``seq``, polling every ``event_poll_seconds`` while the run is in flight (short
polling: see docs/runs.md), until ``run.finished``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from app.agent.codec import dump_message, dumps_json, dumps_message, model_value
from app.agent.events import (
    CompactionCompleted,
    Delta,
    MessageCompleted,
    RunEvent,
    ToolFinished,
    ToolStarted,
)
from app.agent.providers import base as provider_events
from app.clock import Clock
from app.errors import CarryoverError
from app.store.errors import run_not_found
from app.store.events import EventRow, EventStore
from app.store.records import IN_FLIGHT
from app.store.stores import RunRecord, Stores
from app.store.tables import Dumped

from .live import LiveStream, StreamedEvent

log = logging.getLogger(__name__)

#: delta parts of one block arriving within this many seconds of its first are one event
#: (a block's first parts excepted: they are sent at the end of the loop's turn they came in)
COALESCE_SECONDS = 0.05
#: how often a running run's events are written (the rest are written with its outcome)
FLUSH_SECONDS = 0.25
#: events read per query
READ_BATCH = 256
#: deltas that are parts of one block, coalesced
_COALESCED = ("text", "thinking", "tool_call_arguments")


class EventsExpired(CarryoverError):
    """The run's events are no longer kept (past their retention, or never recorded)."""

    slug = "events-expired"
    status = 410

    def __init__(self, run_id: str, retention_seconds: int) -> None:
        super().__init__(
            f"the events of run {run_id} are no longer kept (they are kept "
            f"{retention_seconds} s after they were written); its record still is",
            run_id=run_id,
        )


def event_payload(event: RunEvent) -> tuple[str, Any] | None:
    """A run event as its SSE event name and JSON payload (None: not streamed)."""
    match event:
        case Delta(event=provider_events.TextDelta(index=i, text=text)):
            return "delta", {"kind": "text", "index": i, "text": text}
        case Delta(event=provider_events.ThinkingDelta(index=i, thinking=text)):
            return "delta", {"kind": "thinking", "index": i, "text": text}
        case Delta(event=provider_events.ToolCallStart(index=i, id=call_id, name=name)):
            return "delta", {"kind": "tool_call", "index": i, "id": call_id, "name": name}
        case Delta(event=provider_events.ToolCallDelta(index=i, arguments=args)):
            return "delta", {"kind": "tool_call_arguments", "index": i, "text": args}
        case Delta():
            return None
        case MessageCompleted(message=message):
            # the message's stored text (the context's rows and the records share it): one
            # dump per message, and the event's text is that text, byte for byte
            return "message", Dumped(dumps_message(message))
        case ToolStarted(call=call):
            return "tool.started", call.model_dump(mode="json")
        case ToolFinished(result=result):
            return "tool.finished", dump_message(result)
        case CompactionCompleted(compaction=compaction):
            return "compaction", compaction.model_dump(mode="json")
    return None


@dataclass
class _Pending:
    kind: str
    index: int
    since: float
    parts: list[str] = field(default_factory=list)


class EventRecorder:
    """The events of one run of this process: numbered, coalesced, streamed live, stored."""

    def __init__(
        self,
        store: EventStore,
        clock: Clock,
        tenant: str,
        conversation_id: str,
        run_id: str,
        live: LiveStream | None = None,
        *,
        coalesce_seconds: float = COALESCE_SECONDS,
        flush_seconds: float = FLUSH_SECONDS,
    ) -> None:
        self.store = store
        self.clock = clock
        self.key = (tenant, conversation_id, run_id)
        self.live = live
        self.coalesce_seconds = coalesce_seconds
        self.flush_seconds = flush_seconds
        self.seq = 0
        self.finished_seq: int | None = None
        self._pending: _Pending | None = None
        #: the block (kind, index) of the last delta event, while no other event followed it
        self._block: tuple[str, int] | None = None
        self._unwritten: list[EventRow] = []
        self._lock = asyncio.Lock()
        #: the next look at the pending delta and the batch (a timer, not a task: most runs
        #: end before their first batch is due)
        self._timer: asyncio.TimerHandle | None = None
        self._last_write = 0.0
        #: the batch being written, when one is due while the run goes
        self._task: asyncio.Task[None] | None = None
        self._paused: Any = None  # the required_action of a run that paused (close_paused)

    def start(self, data: dict[str, Any], *, background: bool = True) -> None:
        """``run.started`` (seq 1); with ``background``, the writer of batches starts."""
        self._emit("run.started", data)
        if background:
            self._last_write = self.clock.monotonic()
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.coalesce_seconds, self._tick, loop)

    def add(self, event: RunEvent) -> None:
        if type(event) is Delta and type(event.event) is provider_events.TextDelta:
            self._part("text", event.event.index, event.event.text)  # most events: text
            return
        payload = event_payload(event)
        if payload is None:
            return
        name, data = payload
        if name == "delta" and data["kind"] in _COALESCED:
            self._part(data["kind"], data["index"], data["text"])
            return
        self._seal()
        self._emit(name, data)

    def _part(self, kind: str, index: int, text: str) -> None:
        """A part of block ``index``: joins the pending delta of that block while its window
        is open, else seals it and starts one. A block's first delta is sealed at the end of
        the event loop's turn it began in, not when its window closes: what a client waits
        for first is sent as soon as it arrived, and the parts that came with it (a provider's
        chunks read at once, the echo provider's words) still make one event."""
        now = self.clock.monotonic()
        pending = self._pending
        if (
            pending is not None
            and pending.kind == kind
            and pending.index == index
            and now - pending.since < self.coalesce_seconds
        ):
            pending.parts.append(text)
            return
        self._seal()
        self._pending = pending = _Pending(kind, index, now, [text])
        if (kind, index) != self._block:
            with contextlib.suppress(RuntimeError):  # no loop: its window seals it
                asyncio.get_running_loop().call_soon(self._lead, pending)

    def _lead(self, pending: _Pending) -> None:
        """The end of the turn a block's first delta began in: sealed, unless it already was."""
        if self._pending is pending:
            self._seal()

    def record(self, event: RunEvent) -> Awaitable[None] | None:
        """:meth:`add` (an :data:`~app.agent.events.EventSink`): at once, but a compaction,
        whose payload is encoded as JSON text a few hundred folded messages at a time, the
        event loop running between them (a compaction of a long context folds thousands: one
        ``model_dump`` of it, then one ``json.dumps`` when it is written, would stall the loop
        for tens of milliseconds each); for it, an awaitable. Its ``data`` is then a
        :class:`~app.store.tables.Dumped` text, stored as it is and streamed as it is."""
        if isinstance(event, CompactionCompleted):
            return self._record_compaction(event)
        self.add(event)
        return None

    async def _record_compaction(self, event: CompactionCompleted) -> None:
        c = event.compaction
        data = Dumped((await dumps_json(model_value(c, folded=c.folded))).decode())
        self._seal()
        self._emit("compaction", data)

    def emit(self, name: str, data: Any) -> None:
        """An event the service adds itself."""
        self._seal()
        self._emit(name, data)

    def seal_if_due(self) -> None:
        """Emit a coalesced delta whose window has passed (the writer calls it)."""
        pending = self._pending
        if pending is not None and self.clock.monotonic() - pending.since >= self.coalesce_seconds:
            self._seal()

    def _seal(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            text = "".join(pending.parts)
            self._emit("delta", {"kind": pending.kind, "index": pending.index, "text": text})
            self._block = (pending.kind, pending.index)

    def _emit(self, name: str, data: Any, *, live: bool = True) -> int:
        self._block = None  # a delta event sets it again (_seal)
        self.seq += 1
        tenant, conversation_id, run_id = self.key
        self._unwritten.append(
            EventRow(tenant, conversation_id, run_id, self.seq, name, data, self.clock.now())
        )
        if live and self.live is not None:
            self.live.put_nowait(StreamedEvent(self.seq, name, data))
        return self.seq

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        """Every ``coalesce_seconds`` while the run goes: seal a delta whose window has passed,
        and every ``flush_seconds`` write a batch (in a task, one at a time)."""
        self.seal_if_due()
        writing = self._task
        if (writing is None or writing.done()) and (
            self.clock.monotonic() - self._last_write >= self.flush_seconds
        ):
            self._last_write = self.clock.monotonic()
            self._task = loop.create_task(self.write(), name=f"events-{self.key[2]}")
        self._timer = loop.call_later(self.coalesce_seconds, self._tick, loop)

    async def write(self) -> None:
        """Write the events not written yet, as one batch (kept for later when it fails)."""
        async with self._lock:
            rows, self._unwritten = self._unwritten, []
            if not rows:
                return
            try:
                await self.store.append_events(rows)
            except Exception as exc:  # the database may be away: they go with the outcome
                log.warning("writing events of run %s failed (%s)", self.key[2], exc)
                self._unwritten = rows + self._unwritten

    async def close(self) -> list[EventRow]:
        """Stop writing in the background, and return the events not yet written, ending with
        the ``run.finished`` marker: the run's finish writes them with its outcome."""
        if self.finished_seq is None:
            await self._stop()
            self.finished_seq = self._emit("run.finished", None, live=False)
        return list(self._unwritten)

    async def close_paused(self, action: Any) -> tuple[list[EventRow], list[EventRow]]:
        """:meth:`close` for a run that paused (``action``: its ``required_action``).

        ``run.requires_action`` is said only if the pause is *stored*: a run whose save ends
        ``conflicted`` never asked anything of the client. So two endings, and the finish
        writes the one its outcome calls for: the events ending with ``run.finished`` (any
        other outcome), and the same with ``run.requires_action`` right before it (the run
        was stored ``requires_action``). Neither is streamed yet: :meth:`settle` does, once the
        outcome is recorded."""
        await self._stop()
        tenant, conversation_id, run_id = self.key
        now = self.clock.now()

        def row(offset: int, name: str, data: Any) -> EventRow:
            return EventRow(tenant, conversation_id, run_id, self.seq + offset, name, data, now)

        self._paused = action
        ended = [*self._unwritten, row(1, "run.finished", None)]
        paused = [
            *self._unwritten,
            row(1, "run.requires_action", action),
            row(2, "run.finished", None),
        ]
        return ended, paused

    def settle(self, status: str) -> None:
        """The run's outcome is recorded (``status``): after :meth:`close_paused`, number its
        end as it was written, and stream ``run.requires_action`` live if the pause was
        stored. (After :meth:`close`, nothing to do.)"""
        if self.finished_seq is not None:
            return
        if self._paused is not None and status == "requires_action":
            self._emit("run.requires_action", self._paused)
        self.finished_seq = self._emit("run.finished", None, live=False)

    async def _stop(self) -> None:
        """Stop the writer of batches (never in the middle of one) and seal a pending delta."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        async with self._lock:  # never cancel a batch being written; one not begun, yes
            if self._task is not None:
                self._task.cancel()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._seal()

    def abandon(self) -> None:
        """The run ended without a finish (a bug or a cancelled loop): stop the writer."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._task is not None:
            self._task.cancel()
            self._task = None


class EventFeed:
    """``GET …/runs/{id}/events``: a run's stored events after a seq, live until its end (a
    queued run's from when its turn comes)."""

    def __init__(
        self,
        stores: Stores,
        clock: Clock,
        retention_seconds: int,
        poll: float,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ):
        self.stores = stores
        self.clock = clock
        self.retention_seconds = retention_seconds
        self.poll = poll
        self.sleep = sleep  # between two reads that found nothing new
        #: the record of the run read by :meth:`open`, when it had ended then (it is final)
        self._ended: RunRecord | None = None

    async def open(
        self, tenant: str, conversation_id: str, run_id: str, after: int
    ) -> AsyncIterator[StreamedEvent]:
        """Check (404 for no such run, 410 for events no longer kept), then the events.

        The checks run before the first event is produced, so that a refusal is a problem
        answer and not a broken stream."""
        record = await self.stores.records.get_run(tenant, conversation_id, run_id)
        if record is None:
            raise run_not_found(conversation_id, run_id)
        bounds = await self.stores.events.event_bounds(tenant, conversation_id, run_id)
        finished_at = record.run.finished_at
        cutoff = self.clock.now() - timedelta(seconds=self.retention_seconds)
        ended = record.run.status not in IN_FLIGHT
        self._ended = record if ended else None
        # a run that ended before it ran (cancelled while queued) never had events: its stream
        # is its end alone, not a refusal
        never_ran = record.run.started_at is None
        if (bounds is not None and bounds[0] > after + 1) or (
            ended
            and (
                (bounds is None and not never_ran)
                or (finished_at is not None and finished_at < cutoff)
            )
        ):
            raise EventsExpired(run_id, self.retention_seconds)
        return self._follow(tenant, conversation_id, run_id, after)

    async def _follow(
        self, tenant: str, conversation_id: str, run_id: str, after: int
    ) -> AsyncIterator[StreamedEvent]:
        last = after
        while True:
            rows = await self.stores.events.read_events(
                tenant, conversation_id, run_id, after=last, limit=READ_BATCH
            )
            for row in rows:
                yield StreamedEvent(row.seq, row.event, row.data)
                last = row.seq
                if row.event == "run.finished":
                    return
            if rows:
                continue
            # Nothing new. The run's status first, then the events once more: an outcome
            # commits with the run's last events and marker, so after a finished status the
            # next read has them all.
            status = await self.stores.records.run_status(tenant, conversation_id, run_id)
            if status is None:
                return  # the conversation was deleted meanwhile
            if status in IN_FLIGHT:
                await self.sleep(self.poll)
                continue
            rows = await self.stores.events.read_events(
                tenant, conversation_id, run_id, after=last, limit=READ_BATCH
            )
            for row in rows:
                yield StreamedEvent(row.seq, row.event, row.data)
                last = row.seq
                if row.event == "run.finished":
                    return
            if rows:
                continue
            # Ended without its own finish (interrupted: its process died): the end is said
            # here, numbered after the last stored event.
            bounds = await self.stores.events.event_bounds(tenant, conversation_id, run_id)
            stored_end = bounds[1] if bounds else 0
            if last >= stored_end:
                tail = await self.stores.events.read_events(
                    tenant, conversation_id, run_id, after=stored_end - 1, limit=1
                )
                if tail and tail[0].event == "run.finished":
                    return  # the reader had it all already
            if last <= stored_end:
                yield StreamedEvent(stored_end + 1, "run.finished", None)
            return

    async def record(self, tenant: str, conversation_id: str, run_id: str) -> RunRecord:
        """The run's record for its ``run.finished`` event (a feed follows the one run it
        opened): as :meth:`open` read it when the run had ended then (an ended run's record no
        longer changes), else read now."""
        if self._ended is not None:
            return self._ended
        record = await self.stores.records.get_run(tenant, conversation_id, run_id)
        if record is None:
            raise run_not_found(conversation_id, run_id)
        return record


__all__ = [
    "COALESCE_SECONDS",
    "FLUSH_SECONDS",
    "EventFeed",
    "EventRecorder",
    "EventsExpired",
    "StreamedEvent",
    "event_payload",
]
