"""Conversations and their context (SPEC §4): create, list, get, delete; GET/PUT context."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Body, Response
from fastapi.responses import JSONResponse

from app.agent.messages import Context
from app.agent.replay import ReplayError, validate_context
from app.store import tables

from ..deps import (
    ConversationPath,
    CursorQuery,
    IfMatchHeader,
    IfNoneMatchHeader,
    LimitQuery,
    ServicesDep,
    TenantDep,
    decode_cursor,
    encode_cursor,
    if_match_value,
    page_limit,
)
from ..etags import evaluate_preconditions, parse_condition
from ..headers import ETAG_HEADER, LOCATION_HEADER
from ..limits import check_context, check_text
from ..problems import (
    CONVERSATION_EXISTS,
    PRECONDITION_FAILED,
    PRECONDITION_REQUIRED,
    Problem,
    conversation_not_found,
    problem_responses,
    unreplayable_context,
)
from ..schemas import Conversation, ConversationCreate, ConversationPage

router = APIRouter(tags=["conversations"])


def conversation_body(conv: tables.Conversation, run_count: int) -> Conversation:
    return Conversation(
        id=conv.id,
        etag=conv.etag,
        system_prompt=conv.system_prompt,
        has_summary=bool(conv.summary),
        message_count=conv.message_count,
        run_count=run_count,
        transcript_count=conv.transcript_seq,
        active_run_id=conv.active_run_id,
        created_at=conv.created_at,
        updated_at=conv.updated_at,
    )


@router.post(
    "/conversations",
    status_code=201,
    response_model=Conversation,
    responses={
        201: {"headers": {"Location": LOCATION_HEADER, "ETag": ETAG_HEADER}},
        **problem_responses(CONVERSATION_EXISTS, 422),
    },
    operation_id="create_conversation",
)
async def create_conversation(
    svc: ServicesDep,
    tenant: TenantDep,
    response: Response,
    body: Annotated[ConversationCreate | None, Body()] = None,
) -> Conversation:
    """Create an empty conversation, with a generated id unless the body names one."""
    body = body or ConversationCreate()
    check_text(svc.settings, body.system_prompt, "body.system_prompt")
    conv_id = body.id or f"conv_{uuid.uuid4().hex}"
    from app.store.errors import AlreadyExists

    try:
        conv = await svc.repo.create_conversation(tenant, conv_id, body.system_prompt)
    except AlreadyExists:
        raise Problem(CONVERSATION_EXISTS, f"conversation {conv_id!r} already exists") from None
    response.headers["Location"] = f"/conversations/{conv.id}"
    response.headers["ETag"] = conv.etag
    return conversation_body(conv, 0)


@router.get(
    "/conversations",
    response_model=ConversationPage,
    responses=problem_responses(400, 422),
    operation_id="list_conversations",
)
async def list_conversations(
    svc: ServicesDep, tenant: TenantDep, cursor: CursorQuery = None, limit: LimitQuery = None
) -> ConversationPage:
    """The caller's conversations, ordered by id."""
    size = page_limit(svc.settings, limit)
    after = decode_cursor(cursor, str)
    page = await svc.repo.list_conversations(tenant, after_id=after, limit=size + 1)
    more = len(page) > size
    page = page[:size]
    counts = await svc.repo.run_counts(tenant, [c.id for c in page])
    return ConversationPage(
        items=[conversation_body(c, counts.get(c.id, 0)) for c in page],
        next_cursor=encode_cursor(page[-1].id) if more else None,
    )


@router.get(
    "/conversations/{conversation_id}",
    response_model=Conversation,
    responses={200: {"headers": {"ETag": ETAG_HEADER}}, **problem_responses(404, 422)},
    operation_id="get_conversation",
)
async def get_conversation(
    svc: ServicesDep, tenant: TenantDep, conversation_id: ConversationPath, response: Response
) -> Conversation:
    """Metadata: ETag, counts, timestamps and the active run. Never the context itself."""
    conv = await svc.repo.get_conversation(tenant, conversation_id)
    if conv is None:
        raise conversation_not_found(conversation_id)
    counts = await svc.repo.run_counts(tenant, [conv.id])
    response.headers["ETag"] = conv.etag
    return conversation_body(conv, counts.get(conv.id, 0))


@router.delete(
    "/conversations/{conversation_id}",
    status_code=204,
    responses=problem_responses(400, 404, PRECONDITION_FAILED, 422),
    operation_id="delete_conversation",
)
async def delete_conversation(
    svc: ServicesDep,
    tenant: TenantDep,
    conversation_id: ConversationPath,
    if_match: IfMatchHeader = None,
) -> Response:
    """Delete the conversation and all its records. Honours If-Match."""
    from app.store.errors import PreconditionFailed

    try:
        deleted = await svc.repo.delete_conversation(
            tenant, conversation_id, if_match_value(if_match)
        )
    except PreconditionFailed as exc:
        raise Problem(
            PRECONDITION_FAILED,
            "If-Match does not match the stored context",
            current_etag=exc.current_etag,
        ) from None
    if not deleted:
        raise conversation_not_found(conversation_id)
    return Response(status_code=204)


@router.get(
    "/conversations/{conversation_id}/context",
    response_model=Context,
    responses={
        200: {"headers": {"ETag": ETAG_HEADER}},
        304: {
            "description": "Not modified: the ETag in If-None-Match is current",
            "headers": {"ETag": ETAG_HEADER},
        },
        **problem_responses(400, 404, 422),
    },
    operation_id="get_context",
)
async def get_context(
    svc: ServicesDep,
    tenant: TenantDep,
    conversation_id: ConversationPath,
    if_none_match: IfNoneMatchHeader = None,
) -> Response:
    """The stored Context, with its ETag; `If-None-Match` answers 304 when unchanged."""
    parse_condition(if_none_match, "If-None-Match")
    if if_none_match is not None:
        # Answer 304 from the conversation row alone, without reading the messages.
        conv = await svc.repo.get_conversation(tenant, conversation_id)
        if conv is None:
            raise conversation_not_found(conversation_id)
        outcome = evaluate_preconditions(
            if_match=None, if_none_match=if_none_match, current=conv.etag, safe_method=True
        )
        if outcome == "not-modified":
            return Response(status_code=304, headers={"ETag": conv.etag})
    from app.store.errors import NotFound

    try:
        loaded = await svc.repo.load_context(tenant, conversation_id)
    except NotFound:
        raise conversation_not_found(conversation_id) from None
    return JSONResponse(loaded.context.model_dump(mode="json"), headers={"ETag": loaded.etag})


@router.put(
    "/conversations/{conversation_id}/context",
    status_code=200,
    responses={
        200: {"description": "Replaced", "headers": {"ETag": ETAG_HEADER}},
        201: {
            "description": "Created (If-None-Match: *)",
            "headers": {"ETag": ETAG_HEADER, "Location": LOCATION_HEADER},
        },
        **problem_responses(400, 404, PRECONDITION_FAILED, 422, PRECONDITION_REQUIRED),
    },
    operation_id="put_context",
)
async def put_context(
    svc: ServicesDep,
    tenant: TenantDep,
    conversation_id: ConversationPath,
    context: Context,
    if_match: IfMatchHeader = None,
    if_none_match: IfNoneMatchHeader = None,
) -> Response:
    """Replace the Context (`If-Match`) or create the conversation with it
    (`If-None-Match: *`). Without either: 428. The context must be replayable (422)."""
    match = if_match_value(if_match)
    none_match = parse_condition(if_none_match, "If-None-Match")
    if match is None and none_match is None:
        raise Problem(
            PRECONDITION_REQUIRED,
            "send If-Match with the current ETag to replace the context, or "
            "If-None-Match: * to create the conversation",
        )
    if match is None and none_match is not None and not none_match.any:
        raise Problem(
            PRECONDITION_REQUIRED,
            "If-None-Match on PUT only supports '*' (create if absent); use If-Match to replace",
        )
    check_context(svc.settings, context)
    try:
        validate_context(context)
    except ReplayError as exc:
        raise unreplayable_context(exc.index, str(exc)) from None
    from app.store.errors import NotFound, PreconditionFailed

    async def precondition_failed(current_etag: str | None) -> Problem:
        if current_etag is None:  # If-None-Match: * found the conversation
            conv = await svc.repo.get_conversation(tenant, conversation_id)
            current_etag = conv.etag if conv is not None else None
        return Problem(
            PRECONDITION_FAILED,
            "the precondition does not hold for the stored context",
            current_etag=current_etag,
        )

    if match is not None and none_match is not None:
        # RFC 9110 §13.2.2: If-Match, then If-None-Match. If-Match needs the conversation to
        # exist, and If-None-Match then fails when it names the current ETag (or is "*").
        conv = await svc.repo.get_conversation(tenant, conversation_id)
        if conv is None:
            raise conversation_not_found(conversation_id)
        outcome = evaluate_preconditions(
            if_match=if_match, if_none_match=if_none_match, current=conv.etag, safe_method=False
        )
        if outcome != "proceed":
            raise await precondition_failed(conv.etag)
    try:
        if match is not None:
            etag = await svc.repo.replace_context(tenant, conversation_id, context, if_match=match)
            return JSONResponse(context.model_dump(mode="json"), headers={"ETag": etag})
        etag = await svc.repo.replace_context(tenant, conversation_id, context, create=True)
    except NotFound:
        raise conversation_not_found(conversation_id) from None
    except PreconditionFailed as exc:
        raise await precondition_failed(exc.current_etag) from None
    return JSONResponse(
        context.model_dump(mode="json"),
        status_code=201,
        headers={"ETag": etag, "Location": f"/conversations/{conversation_id}"},
    )
