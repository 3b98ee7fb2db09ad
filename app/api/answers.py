"""How a run request is answered (docs/runs.md): the event-stream description of the document,
the small header helpers, the 202 answers of background mode and the server-sent events of a
streamed run. Used by :mod:`app.api.routes.runs`; it declares no route."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse, Response, StreamingResponse

from app.service.live import ReaderBehind
from app.service.runs import ActiveRun, Replayed, RunManager
from app.store.records import IN_FLIGHT, RunRecord
from app.store.tables import Dumped

from .deps import prefers_minimal
from .handlers import stream_problem
from .problems import BAD_HEADER, STREAM_READER_BEHIND, Problem
from .sse import sse_event
from .views import record_view, run_view

SSE_DESCRIPTION = (
    'With `Accept: text/event-stream` or `"stream": true`: server-sent events `run.started`, '
    "`delta` (text, thinking and tool-call parts), `message` (each completed message), "
    "`tool.started`, `tool.finished`, `compaction`, `run.requires_action` (a run that paused: "
    "its `required_action`, right before `run.finished`), and last `run.finished` carrying "
    "the same body as the JSON answer — or, when the outcome could not be stored, `error` "
    "carrying the problem (e.g. `database-unavailable` with `stored: false`, or "
    "`stream-reader-behind`: the reader fell too far behind, the run goes on and the stream "
    "resumes at `GET …/runs/{run_id}/events`). Quiet periods carry `: keep-alive` comments."
)


#: one server-sent event, as OpenAPI 3.1 describes an event stream (the schema of each event)
SSE_EVENT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "event": {
            "type": "string",
            "enum": [
                "run.started",
                "delta",
                "message",
                "tool.started",
                "tool.finished",
                "compaction",
                "run.requires_action",
                "run.finished",
                "error",
            ],
        },
        "id": {
            "type": "string",
            "pattern": "^[1-9][0-9]*$",
            "description": "The event's sequence number in its run (1 for run.started), as SSE "
            "sends every field: as text. "
            "resume after it at GET …/runs/{run_id}/events with Last-Event-ID (an error "
            "event has none)",
        },
        "data": {
            "type": "string",
            "contentMediaType": "application/json",
            "description": "The event's JSON payload; for run.finished, the Run; for "
            "run.requires_action, the RequiredAction; for error (instead of run.finished, when "
            "the run's outcome could not be stored), a problem",
        },
    },
    "required": ["event", "data"],
}


def run_location(conversation_id: str, run_id: str) -> str:
    return f"/conversations/{conversation_id}/runs/{run_id}"


def wants_minimal(prefer: str | None) -> bool:
    return prefers_minimal(prefer)  # 400 bad-header for a Prefer that breaks RFC 7240's grammar


def preference_applied(minimal: bool) -> dict[str, str]:
    """RFC 7240 §3: say that ``return=minimal`` was honoured."""
    return {"Preference-Applied": "return=minimal"} if minimal else {}


def idempotency_key_of(value: str | None) -> str | None:
    if value is None:
        return None
    key = value.strip()
    if key.startswith('"') and key.endswith('"') and len(key) >= 2:
        key = key[1:-1]  # the draft defines the key as an sf-string
    if not key or not all(0x20 <= ord(c) < 0x7F for c in key):
        raise Problem(
            BAD_HEADER,
            "Idempotency-Key must be a non-empty string of visible ASCII",
            header="Idempotency-Key",
        )
    return key


# --- background mode (docs/runs.md) ----------------------------------------------------------


def accepted(record: RunRecord, respond_async: bool, minimal: bool) -> Response:
    """202 Accepted: the run (``running`` or ``queued``) goes on whatever the client does."""
    applied = ["respond-async"] if respond_async else []
    if minimal:
        applied.append("return=minimal")
    headers = {"Location": run_location(record.run.conversation_id, record.run.run_id)}
    if applied:
        headers["Preference-Applied"] = ", ".join(applied)
    return JSONResponse(record_view(record).body(), status_code=202, headers=headers)


async def async_replay(
    manager: RunManager, tenant: str, conversation_id: str, replay: Replayed, minimal: bool
) -> Response:
    """A repeat of a background request: the run's record as it is now — 202 while it is
    queued or running, 200 once it ended."""
    run_id = str(replay.body["run_id"])
    record = await manager.record(tenant, conversation_id, run_id)
    headers = {"Idempotent-Replayed": "true", "Location": run_location(conversation_id, run_id)}
    if record.run.status in IN_FLIGHT:
        response = accepted(record, True, minimal)
        response.headers.update(headers)
        return response
    return JSONResponse(record_view(record).body(), status_code=200, headers=headers)


def ended_stream(record: RunRecord, conversation_id: str) -> Response:
    """A streamed request whose queued run ended without running: only ``run.finished``."""

    async def events() -> AsyncIterator[bytes]:
        yield sse_event("run.finished", record_view(record).body())

    return StreamingResponse(
        events(),
        status_code=201,
        media_type="text/event-stream",
        headers={"Location": run_location(conversation_id, record.run.run_id)},
    )


def _behind(active: ActiveRun, behind: ReaderBehind, last: int) -> dict[str, Any]:
    """The ``error`` event of a stream cut because its reader fell behind."""
    location = run_location(active.conversation_id, active.run_id)
    return Problem(
        STREAM_READER_BEHIND,
        f"this stream's reader fell more than {behind.max_bytes} bytes of events behind the "
        f"run, so the stream ends here; the run goes on and keeps every event: resume with "
        f"GET {location}/events and Last-Event-ID: {last}",
        run_id=active.run_id,
        events=f"{location}/events",
        last_event_id=last,
    ).body(instance=location)


async def sse_events(
    manager: RunManager, active: ActiveRun, on_disconnect: str, minimal: bool
) -> AsyncIterator[bytes]:
    """The run as server-sent events. A client that goes away cancels the run only with
    ``on_disconnect: cancel``; the run's task is separate from this response."""
    assert active.events is not None and active.recorder is not None
    last = 0
    try:
        # run.started (seq 1) and every event after it come numbered from the run's recorder
        while True:
            try:
                event = await active.events.get()
            except ReaderBehind as behind:  # cut (app/service/live.py): the run goes on
                yield sse_event("error", _behind(active, behind, last))
                return
            if event is None:
                break
            yield sse_event(event.event, event.data, event.seq)
            last = event.seq
        try:
            finished = await asyncio.shield(active.done)
            # a long compaction's folded messages encoded in pieces (RunView.render)
            body = Dumped((await run_view(finished).render(minimal=minimal)).decode())
        except Exception as exc:  # the outcome could not be stored (or a bug): say so, end
            yield sse_event(
                "error",
                stream_problem(exc, instance=run_location(active.conversation_id, active.run_id)),
            )
            return
        yield sse_event("run.finished", body, active.recorder.finished_seq)
    except asyncio.CancelledError:
        if on_disconnect == "cancel":
            manager.stop(active)
        raise
