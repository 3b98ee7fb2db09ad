"""Runs (contract §4): start one (JSON or server-sent events), list, get, cancel; compact now.

Each route parses the request, calls :class:`~app.service.runs.RunManager` (or the
conversation service) and renders its result with :mod:`app.api.views`; refusals are answered
by the one problem handler."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Body, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from app.service.runs import (
    ActiveRun,
    EndedUnrun,
    FinishedRun,
    Idempotency,
    QueuedRun,
    Replayed,
    RunManager,
)
from app.store.queue import ASYNC_ANSWER_KEY, async_answer
from app.store.records import RunRecord

from ..deps import (
    AcceptHeader,
    ConversationPath,
    CursorQuery,
    IdempotencyKeyHeader,
    IfMatchHeader,
    LimitQuery,
    PreferHeader,
    RunIdPath,
    ServicesDep,
    TenantDep,
    decode_cursor,
    encode_cursor,
    if_match_value,
    page_limit,
    parse_prefer,
    prefers_minimal,
)
from ..handlers import stream_problem
from ..headers import ETAG_HEADER, LOCATION_HEADER, RETRY_AFTER_HEADER
from ..limits import check_prompts
from ..problems import (
    BAD_HEADER,
    PRECONDITION_FAILED,
    RUN_IN_PROGRESS,
    RUN_NOT_ACTIVE,
    VALIDATION_ERROR,
    Problem,
    problem_responses,
)
from ..schemas import Run, RunCreate, RunPage
from ..views import record_view, request_hash, run_request, run_view
from .usage import QUOTA_RESPONSE

router = APIRouter(tags=["runs"])

SSE_DESCRIPTION = (
    'With `Accept: text/event-stream` or `"stream": true`: server-sent events `run.started`, '
    "`delta` (text, thinking and tool-call parts), `message` (each completed message), "
    "`tool.started`, `tool.finished`, `compaction`, `run.requires_action` (a run that paused: "
    "its `required_action`, right before `run.finished`), and last `run.finished` carrying "
    "the same body as the JSON answer — or, when the outcome could not be stored, `error` "
    "carrying the problem (e.g. `database-unavailable` with `stored: false`)."
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


def _location(conversation_id: str, run_id: str) -> str:
    return f"/conversations/{conversation_id}/runs/{run_id}"


def _minimal(prefer: str | None) -> bool:
    return prefers_minimal(prefer)  # 400 bad-header for a Prefer that breaks RFC 7240's grammar


def _preference_applied(minimal: bool) -> dict[str, str]:
    """RFC 7240 §3: say that ``return=minimal`` was honoured."""
    return {"Preference-Applied": "return=minimal"} if minimal else {}


def _idempotency_key(value: str | None) -> str | None:
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


@router.post(
    "/conversations/{conversation_id}/runs",
    status_code=201,
    response_model=Run,
    responses={
        201: {
            "description": "The run started and ended; its record. " + SSE_DESCRIPTION,
            "headers": {"Location": LOCATION_HEADER, "ETag": ETAG_HEADER},
            "content": {"text/event-stream": {"schema": SSE_EVENT}},
        },
        202: {
            "description": "With `Prefer: respond-async`: the run was accepted and goes on in "
            "the background; its record (`status` `running` or `queued`). Poll `Location`. "
            "A repeat with the same Idempotency-Key answers the record as it is then (200 "
            "once the run ended)",
            "headers": {
                "Location": LOCATION_HEADER,
                "Preference-Applied": {
                    "description": "`respond-async`",
                    "schema": {"type": "string"},
                },
            },
            "model": Run,
        },
        409: {
            "description": "Another run is in progress (`run-in-progress`), the first "
            "request with this Idempotency-Key still runs, or the conversation awaits "
            "results or approvals for its pending tool calls (`tool-results-required`, "
            "listing them in `pending_tool_calls`)",
            "headers": {"Retry-After": RETRY_AFTER_HEADER},
            "content": {
                "application/problem+json": {
                    "schema": {"$ref": "#/components/schemas/ProblemDetails"}
                }
            },
        },
        **problem_responses(400, 404, PRECONDITION_FAILED, 413, 422),
        **QUOTA_RESPONSE,
    },
    operation_id="create_run",
)
async def create_run(
    request: Request,
    svc: ServicesDep,
    tenant: TenantDep,
    conversation_id: ConversationPath,
    body: RunCreate,
    if_match: IfMatchHeader = None,
    prefer: PreferHeader = None,
    idempotency_key: IdempotencyKeyHeader = None,
    accept: AcceptHeader = None,
) -> Response:
    """Run the agent on new prompts and store the returned context conditionally."""
    request_ = run_request(body)
    check_prompts(svc.settings, (*request_.tool_results, *request_.prompts))
    stream = body.stream or "text/event-stream" in (accept or "")
    minimal = _minimal(prefer)
    respond_async = "respond-async" in parse_prefer(prefer)
    key = _idempotency_key(idempotency_key)
    idempotency = None
    if key is not None:

        def answer(finished: FinishedRun) -> tuple[int, dict[str, Any]]:
            if respond_async:  # repeats answer the record as it is then
                return 202, async_answer(finished.run.run_id)
            return 201, run_view(finished).body(minimal=minimal)

        idempotency = Idempotency(key, request_hash(body), answer)
    started = await svc.runs.start(
        tenant,
        conversation_id,
        request_,
        if_match=if_match_value(if_match),
        idempotency=idempotency,
        stream=stream,
        respond_async=respond_async,
    )

    if isinstance(started, Replayed):
        if started.body.get(ASYNC_ANSWER_KEY):
            return await _async_replay(svc.runs, tenant, conversation_id, started, minimal)
        replay = started.body
        headers = {"Idempotent-Replayed": "true"}
        if replay.get("etag"):
            headers["ETag"] = replay["etag"]
        if replay.get("run_id"):
            headers["Location"] = _location(conversation_id, replay["run_id"])
        return JSONResponse(replay, status_code=started.status_code, headers=headers)
    if isinstance(started, QueuedRun):
        return _accepted(RunRecord(started.run, (), None, ()), respond_async, minimal)
    if isinstance(started, EndedUnrun):  # cancelled while it was queued
        if stream:
            return _ended_stream(started.record, conversation_id)
        return JSONResponse(
            record_view(started.record).body(),
            status_code=201,
            headers={"Location": _location(conversation_id, started.record.run.run_id)},
        )
    if respond_async:
        run = started.started.run
        assert run is not None
        return _accepted(RunRecord(run, (), None, ()), True, minimal)

    location = _location(conversation_id, started.run_id)
    if stream:
        return StreamingResponse(
            _events(svc.runs, started, body.on_disconnect, minimal),
            status_code=201,
            media_type="text/event-stream",
            headers={
                "Location": location,
                "Cache-Control": "no-store",
                "X-Accel-Buffering": "no",
                **_preference_applied(minimal),
            },
        )
    finished = await svc.runs.wait(
        started, on_disconnect=body.on_disconnect, disconnected=request.is_disconnected
    )
    view = run_view(finished)
    headers = {"Location": location, **_preference_applied(minimal)}
    if view.etag:
        headers["ETag"] = view.etag
    return JSONResponse(view.body(minimal=minimal), status_code=201, headers=headers)


# --- background mode (docs/runs.md) ----------------------------------------------------------


def _accepted(record: RunRecord, respond_async: bool, minimal: bool) -> Response:
    """202 Accepted: the run (``running`` or ``queued``) goes on whatever the client does."""
    applied = ["respond-async"] if respond_async else []
    if minimal:
        applied.append("return=minimal")
    headers = {"Location": _location(record.run.conversation_id, record.run.run_id)}
    if applied:
        headers["Preference-Applied"] = ", ".join(applied)
    return JSONResponse(record_view(record).body(), status_code=202, headers=headers)


async def _async_replay(
    manager: RunManager, tenant: str, conversation_id: str, replay: Replayed, minimal: bool
) -> Response:
    """A repeat of a background request: the run's record as it is now — 202 while it is
    queued or running, 200 once it ended."""
    run_id = str(replay.body["run_id"])
    record = await manager.record(tenant, conversation_id, run_id)
    headers = {"Idempotent-Replayed": "true", "Location": _location(conversation_id, run_id)}
    if record.run.status in ("queued", "running"):
        response = _accepted(record, True, minimal)
        response.headers.update(headers)
        return response
    return JSONResponse(record_view(record).body(), status_code=200, headers=headers)


def _ended_stream(record: RunRecord, conversation_id: str) -> Response:
    """A streamed request whose queued run ended without running: only ``run.finished``."""

    async def events() -> AsyncIterator[bytes]:
        yield _sse("run.finished", record_view(record).body())

    return StreamingResponse(
        events(),
        status_code=201,
        media_type="text/event-stream",
        headers={"Location": _location(conversation_id, record.run.run_id)},
    )


def _sse(event: str, data: Any, seq: int | None = None) -> bytes:
    """One server-sent event; ``id`` is the run's event seq (issue 13: resume after it at
    ``GET …/runs/{id}/events`` with ``Last-Event-ID``)."""
    tail = f"id: {seq}\n" if seq is not None else ""
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n{tail}\n".encode()


async def _events(
    manager: RunManager, active: ActiveRun, on_disconnect: str, minimal: bool
) -> AsyncIterator[bytes]:
    """The run as server-sent events. A client that goes away cancels the run only with
    ``on_disconnect: cancel``; the run's task is separate from this response."""
    assert active.events is not None and active.recorder is not None
    try:
        # run.started (seq 1) and every event after it come numbered from the run's recorder
        while True:
            event = await active.events.get()
            if event is None:
                break
            yield _sse(event.event, event.data, event.seq)
        try:
            finished = await asyncio.shield(active.done)
            body = run_view(finished).body(minimal=minimal)
        except Exception as exc:  # the outcome could not be stored (or a bug): say so, end
            yield _sse(
                "error",
                stream_problem(exc, instance=_location(active.conversation_id, active.run_id)),
            )
            return
        yield _sse("run.finished", body, active.recorder.finished_seq)
    except asyncio.CancelledError:
        if on_disconnect == "cancel":
            manager.stop(active)
        raise


@router.get(
    "/conversations/{conversation_id}/runs",
    response_model=RunPage,
    responses=problem_responses(400, 404, 422),
    operation_id="list_runs",
)
async def list_runs(
    svc: ServicesDep,
    tenant: TenantDep,
    conversation_id: ConversationPath,
    cursor: CursorQuery = None,
    limit: LimitQuery = None,
) -> Response:
    """The conversation's runs, oldest first, as full records (without their context)."""
    page = await svc.runs.records(
        tenant,
        conversation_id,
        after=decode_cursor(cursor, str),
        limit=page_limit(svc.settings, limit),
    )
    # Records leave out ``context`` (not ``"context": null``), as a minimal POST answer does.
    return JSONResponse(
        {
            "items": [record_view(r).body() for r in page.items],
            "next_cursor": encode_cursor(page.items[-1].run.run_id) if page.more else None,
        }
    )


@router.get(
    "/conversations/{conversation_id}/runs/{run_id}",
    response_model=Run,
    responses=problem_responses(404, 422),
    operation_id="get_run",
)
async def get_run(
    svc: ServicesDep, tenant: TenantDep, conversation_id: ConversationPath, run_id: RunIdPath
) -> Response:
    """One run record: status, timings, usage, error, ETags, new messages, final, compactions."""
    record = await svc.runs.record(tenant, conversation_id, run_id)
    return JSONResponse(record_view(record).body())


@router.post(
    "/conversations/{conversation_id}/runs/{run_id}/cancel",
    status_code=202,
    response_model=Run,
    responses=problem_responses(404, RUN_NOT_ACTIVE, 422),
    operation_id="cancel_run",
)
async def cancel_run(
    svc: ServicesDep, tenant: TenantDep, conversation_id: ConversationPath, run_id: RunIdPath
) -> Response:
    """Ask an in-flight run to stop, from any replica. It ends `cancelled` within about a
    second and is stored per its `on_failure`; this answers at once with its record. A queued
    run ends `cancelled` at once, without running."""
    record = await svc.runs.cancel(tenant, conversation_id, run_id)
    return JSONResponse(record_view(record).body(), status_code=202)


class CompactRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent: str = Field(
        default="default",
        min_length=1,
        max_length=64,
        description="The agent profile whose provider writes the summary",
    )


@router.post(
    "/conversations/{conversation_id}/compact",
    status_code=201,
    response_model=Run,
    responses={
        201: {
            "description": "The compaction's run record (no compaction when there was "
            "nothing to fold)",
            "headers": {"Location": LOCATION_HEADER, "ETag": ETAG_HEADER},
        },
        409: {
            "description": "Another run is in progress",
            "headers": {"Retry-After": RETRY_AFTER_HEADER},
            "content": {
                "application/problem+json": {
                    "schema": {"$ref": "#/components/schemas/ProblemDetails"}
                }
            },
        },
        **problem_responses(400, 404, PRECONDITION_FAILED, 422),
        **QUOTA_RESPONSE,
    },
    operation_id="compact_conversation",
)
async def compact(
    svc: ServicesDep,
    tenant: TenantDep,
    conversation_id: ConversationPath,
    body: Annotated[CompactRequest | None, Body()] = None,
    if_match: IfMatchHeader = None,
    prefer: PreferHeader = None,
) -> Response:
    """Fold all but the current turn into the summary now."""
    body = body or CompactRequest()
    minimal = _minimal(prefer)
    finished = await svc.conversations.compact(
        tenant, conversation_id, body.agent, if_match_value(if_match)
    )
    view = run_view(finished)
    headers = {
        "Location": _location(conversation_id, view.model.run_id),
        **_preference_applied(minimal),
    }
    if view.etag:
        headers["ETag"] = view.etag
    return JSONResponse(view.body(minimal=minimal), status_code=201, headers=headers)


__all__ = ["RUN_IN_PROGRESS", "VALIDATION_ERROR", "router"]
