"""Runs (contract §4): start one (JSON or server-sent events), list, get, cancel; compact now.

Each route parses the request, calls :class:`~app.service.runs.RunManager` (or the
conversation service) and renders its result with :mod:`app.api.views`; refusals are answered
by the one problem handler."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from app.service.runs import EndedUnrun, FinishedRun, Idempotency, QueuedRun, Replayed
from app.store.queue import ASYNC_ANSWER_KEY, async_answer
from app.store.records import RunRecord

from ..answers import (
    SSE_DESCRIPTION,
    SSE_EVENT,
    accepted,
    async_replay,
    ended_stream,
    idempotency_key_of,
    preference_applied,
    run_location,
    sse_events,
    wants_minimal,
)
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
)
from ..fingerprint import legacy_fingerprint, request_fingerprint
from ..headers import ETAG_HEADER, LOCATION_HEADER, RETRY_AFTER_HEADER
from ..lean import LeanRoute
from ..limits import check_prompts, check_text
from ..problems import (
    PRECONDITION_FAILED,
    RUN_IN_PROGRESS,
    RUN_NOT_ACTIVE,
    VALIDATION_ERROR,
    problem_responses,
)
from ..schemas import Run, RunCreate, RunPage
from ..sse import keepalive
from ..views import record_view, run_request, run_view
from .usage import QUOTA_RESPONSE

router = APIRouter(tags=["runs"], route_class=LeanRoute)


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
            "listing them in `pending_tool_calls`), or a stored message of it is damaged "
            "(`stored-data-damaged`, no Retry-After: repair it with PUT …/context)",
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
    request_ = run_request(body, svc.settings)
    check_prompts(svc.settings, (*request_.tool_results, *request_.prompts))
    if body.instructions is not None:  # this run's system prompt: a system prompt's limit
        check_text(svc.settings, body.instructions, "body.instructions")
    stream = body.stream or "text/event-stream" in (accept or "")
    minimal = wants_minimal(prefer)
    respond_async = "respond-async" in parse_prefer(prefer)
    key = idempotency_key_of(idempotency_key)
    idempotency = None
    if key is not None:

        def answer(finished: FinishedRun) -> tuple[int, dict[str, Any]]:
            if respond_async:  # repeats answer the record as it is then
                return 202, async_answer(finished.run.run_id)
            return 201, run_view(finished).body(minimal=minimal)

        idempotency = Idempotency(
            key,
            request_fingerprint(await request.body()),  # what the client sent
            answer,
            legacy_hash=legacy_fingerprint(body),  # keys stored before that form
        )
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
            return await async_replay(svc.runs, tenant, conversation_id, started, minimal)
        replay = started.body
        headers = {"Idempotent-Replayed": "true"}
        if replay.get("etag"):
            headers["ETag"] = replay["etag"]
        if replay.get("run_id"):
            headers["Location"] = run_location(conversation_id, replay["run_id"])
        return JSONResponse(replay, status_code=started.status_code, headers=headers)
    if isinstance(started, QueuedRun):
        return accepted(RunRecord(started.run, (), None, ()), respond_async, minimal)
    if isinstance(started, EndedUnrun):  # cancelled while it was queued
        if stream:
            return ended_stream(started.record, conversation_id)
        return JSONResponse(
            record_view(started.record).body(),
            status_code=201,
            headers={"Location": run_location(conversation_id, started.record.run.run_id)},
        )
    if respond_async:
        run = started.started.run
        assert run is not None
        return accepted(RunRecord(run, (), None, ()), True, minimal)

    location = run_location(conversation_id, started.run_id)
    if stream:
        return StreamingResponse(
            keepalive(
                sse_events(svc.runs, started, body.on_disconnect, minimal),
                svc.settings.stream_keepalive_seconds,
            ),
            status_code=201,
            media_type="text/event-stream",
            headers={
                "Location": location,
                "Cache-Control": "no-store",
                "X-Accel-Buffering": "no",
                **preference_applied(minimal),
            },
        )
    finished = await svc.runs.wait(
        started, on_disconnect=body.on_disconnect, disconnected=request.is_disconnected
    )
    view = run_view(finished)
    headers = {"Location": location, **preference_applied(minimal)}
    if view.etag:
        headers["ETag"] = view.etag
    rendered = await view.render(minimal=minimal)  # a long compaction's folded messages in pieces
    return Response(rendered, status_code=201, headers=headers, media_type="application/json")


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
            "description": "Another run is in progress (`run-in-progress`), or a stored "
            "message of the conversation is damaged (`stored-data-damaged`, no Retry-After)",
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
    minimal = wants_minimal(prefer)
    finished = await svc.conversations.compact(
        tenant, conversation_id, body.agent, if_match_value(if_match)
    )
    view = run_view(finished)
    headers = {
        "Location": run_location(conversation_id, view.model.run_id),
        **preference_applied(minimal),
    }
    if view.etag:
        headers["ETag"] = view.etag
    rendered = await view.render(minimal=minimal)  # the folded messages in pieces
    return Response(rendered, status_code=201, headers=headers, media_type="application/json")


__all__ = ["RUN_IN_PROGRESS", "SSE_EVENT", "VALIDATION_ERROR", "router"]
