"""Conversations and their context (SPEC §4): create, list, get, delete; GET/PUT context.

Each route parses the request, calls :class:`~app.service.conversations.ConversationService`
and renders its result; refusals are answered by the one problem handler."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Response
from fastapi.responses import JSONResponse

from app.agent.messages import Context
from app.service.conversations import NotModified

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
    if_none_match_value,
    page_limit,
)
from ..headers import ETAG_HEADER, LOCATION_HEADER
from ..limits import check_context, check_text
from ..problems import (
    CONVERSATION_EXISTS,
    PRECONDITION_FAILED,
    PRECONDITION_REQUIRED,
    Problem,
    problem_responses,
)
from ..schemas import Conversation, ConversationCreate, ConversationPage
from ..views import conversation_body

router = APIRouter(tags=["conversations"])


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
    info = await svc.conversations.create(tenant, body.id, body.system_prompt)
    response.headers["Location"] = f"/conversations/{info.conversation.id}"
    response.headers["ETag"] = info.conversation.etag
    return conversation_body(info)


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
    page = await svc.conversations.list(
        tenant, after=decode_cursor(cursor, str), limit=page_limit(svc.settings, limit)
    )
    return ConversationPage(
        items=[conversation_body(info) for info in page.items],
        next_cursor=encode_cursor(page.items[-1].conversation.id) if page.more else None,
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
    info = await svc.conversations.get(tenant, conversation_id)
    response.headers["ETag"] = info.conversation.etag
    return conversation_body(info)


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
    await svc.conversations.delete(tenant, conversation_id, if_match_value(if_match))
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
    found = await svc.conversations.get_context_rows(
        tenant, conversation_id, if_none_match_value(if_none_match)
    )
    if isinstance(found, NotModified):
        return Response(status_code=304, headers={"ETag": found.etag})
    # The stored message texts are the wire format already: sent as they are, not decoded.
    return Response(
        found.context_json(),
        media_type="application/json",
        headers={"ETag": found.conversation.etag},
    )


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
    none_match = if_none_match_value(if_none_match)
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
    written = await svc.conversations.put_context(
        tenant, conversation_id, context, if_match=match, if_none_match=none_match
    )
    if not written.created:
        return JSONResponse(context.model_dump(mode="json"), headers={"ETag": written.etag})
    return JSONResponse(
        context.model_dump(mode="json"),
        status_code=201,
        headers={"ETag": written.etag, "Location": f"/conversations/{conversation_id}"},
    )
