"""Runs (SPEC §4): start one (JSON or server-sent events), list, get, cancel; compact now.

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

from app.agent.codec import dump_message
from app.agent.events import (
    CompactionCompleted,
    Delta,
    MessageCompleted,
    RunEvent,
    ToolFinished,
    ToolStarted,
)
from app.agent.providers import base as provider_events
from app.service.runs import ActiveRun, FinishedRun, Idempotency, Replayed, RunManager

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
    prefers_minimal,
)
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
    "`tool.started`, `tool.finished`, `compaction`, and last `run.finished` carrying the same "
    "body as the JSON answer."
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
                "run.finished",
            ],
        },
        "data": {
            "type": "string",
            "contentMediaType": "application/json",
            "description": "The event's JSON payload; for run.finished, the Run",
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
        409: {
            "description": "Another run is in progress (`run-in-progress`), or the first "
            "request with this Idempotency-Key still runs",
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
    check_prompts(svc.settings, request_.prompts)
    stream = body.stream or "text/event-stream" in (accept or "")
    minimal = _minimal(prefer)
    key = _idempotency_key(idempotency_key)
    idempotency = None
    if key is not None:

        def answer(finished: FinishedRun) -> tuple[int, dict[str, Any]]:
            return 201, run_view(finished).body(minimal=minimal)

        idempotency = Idempotency(key, request_hash(body), answer)
    started = await svc.runs.start(
        tenant,
        conversation_id,
        request_,
        if_match=if_match_value(if_match),
        idempotency=idempotency,
        stream=stream,
    )

    if isinstance(started, Replayed):
        replay = started.body
        headers = {"Idempotent-Replayed": "true"}
        if replay.get("etag"):
            headers["ETag"] = replay["etag"]
        if replay.get("run_id"):
            headers["Location"] = _location(conversation_id, replay["run_id"])
        return JSONResponse(replay, status_code=started.status_code, headers=headers)

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


def _sse(event: str, data: Any) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def _event_payload(event: RunEvent) -> tuple[str, Any] | None:
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
            return "message", dump_message(message)
        case ToolStarted(call=call):
            return "tool.started", call.model_dump(mode="json")
        case ToolFinished(result=result):
            return "tool.finished", dump_message(result)
        case CompactionCompleted(compaction=compaction):
            return "compaction", compaction.model_dump(mode="json")
    return None


async def _events(
    manager: RunManager, active: ActiveRun, on_disconnect: str, minimal: bool
) -> AsyncIterator[bytes]:
    """The run as server-sent events. A client that goes away cancels the run only with
    ``on_disconnect: cancel``; the run's task is separate from this response."""
    assert active.events is not None
    try:
        run = active.started.run
        assert run is not None
        yield _sse(
            "run.started",
            {
                "run_id": active.run_id,
                "conversation_id": active.conversation_id,
                "base_etag": run.base_etag,
            },
        )
        while True:
            event = await active.events.get()
            if event is None:
                break
            payload = _event_payload(event)
            if payload is not None:
                yield _sse(*payload)
        finished = await asyncio.shield(active.done)
        yield _sse("run.finished", run_view(finished).body(minimal=minimal))
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
    second and is stored per its `on_failure`; this answers at once with its record."""
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
