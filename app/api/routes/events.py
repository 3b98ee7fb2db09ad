"""A run's events, resumable: ``GET /conversations/{id}/runs/{run_id}/events``.

The run's stored events as server-sent events, each with ``id: <seq>``, from the start or after
``Last-Event-ID`` (or ``?after=``), live while the run is in flight, ending after
``run.finished``; from any replica sharing the database (docs/runs.md, "Events and resume")."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header, Query
from fastapi.responses import Response, StreamingResponse

from app.service.events import EventFeed

from ..deps import ConversationPath, RunIdPath, ServicesDep, TenantDep
from ..problems import BAD_HEADER, EVENTS_EXPIRED, Problem, problem_responses
from ..sse import keepalive, sse_event
from ..views import record_view
from .runs import SSE_EVENT

log = logging.getLogger(__name__)

router = APIRouter(tags=["runs"])

#: what ``Last-Event-ID`` may hold: an event id (ASCII digits), optional blanks around it
LAST_EVENT_ID_PATTERN = r"^[ \t]*[0-9]{1,10}[ \t]*$"
_LAST_EVENT_ID = re.compile(LAST_EVENT_ID_PATTERN[:-1] + r"\Z")

LastEventIdHeader = Annotated[
    str | None,
    Header(
        alias="Last-Event-ID",
        description="Resume after this event (the `id` of the last event received); it wins "
        "over `after`",
        json_schema_extra={"pattern": LAST_EVENT_ID_PATTERN},
    ),
]
AfterQuery = Annotated[
    int | None,
    Query(ge=0, le=2**31 - 1, description="Stream the events whose id is greater than this"),
]

EVENTS_DESCRIPTION = (
    "The run's events as server-sent events (`text/event-stream`), the same ones and the same "
    "`id`s as the POST's stream: `run.started` (id 1), `delta` (text, thinking and tool-call "
    "parts, coalesced), `message`, `tool.started`, `tool.finished`, `compaction`, "
    "`run.requires_action` (a run that paused, docs/tools.md), and last "
    "`run.finished` with the run record (without `context`). Live while the run is in flight; "
    "the stream ends after `run.finished`. Kept `CARRYOVER_EVENT_RETENTION_SECONDS` after "
    "they were written. Quiet periods carry `: keep-alive` comments."
)


def _after(last_event_id: str | None, after: int | None) -> int:
    if last_event_id is None:
        return after or 0
    if _LAST_EVENT_ID.match(last_event_id) is None:  # ASCII digits only (not str.isdigit)
        raise Problem(
            BAD_HEADER,
            "Last-Event-ID must be the id of an event of this run (a non-negative integer)",
            header="Last-Event-ID",
        )
    return int(last_event_id.strip(" \t"))


@router.get(
    "/conversations/{conversation_id}/runs/{run_id}/events",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": EVENTS_DESCRIPTION,
            "content": {"text/event-stream": {"schema": SSE_EVENT}},
        },
        **problem_responses(400, 404, EVENTS_EXPIRED, 422),
    },
    operation_id="run_events",
)
async def run_events(
    svc: ServicesDep,
    tenant: TenantDep,
    conversation_id: ConversationPath,
    run_id: RunIdPath,
    after: AfterQuery = None,
    last_event_id: LastEventIdHeader = None,
) -> Response:
    """Stream a run's events (or resume them), during and after the run."""
    start = _after(last_event_id, after)
    feed = EventFeed(
        svc.stores,
        svc.runs.clock,
        svc.settings.event_retention_seconds,
        svc.settings.event_poll_seconds,
    )
    events = await feed.open(tenant, conversation_id, run_id, start)  # 404, 410 here

    async def stream() -> AsyncIterator[bytes]:
        try:
            async for event in events:
                data = event.data
                if event.event == "run.finished":
                    record = await feed.record(tenant, conversation_id, run_id)
                    data = record_view(record).body()
                yield sse_event(event.event, data, event.seq)
        except Exception:  # the database went away: end the stream; the client resumes
            log.exception("streaming the events of run %s failed", run_id)

    return StreamingResponse(
        keepalive(stream(), svc.settings.stream_keepalive_seconds),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


__all__ = ["router"]
