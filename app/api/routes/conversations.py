"""Conversations and their context (contract §4): create, list, get, patch, delete; GET/PUT
context. Fork, export and import are in :mod:`app.api.routes.portability` (included here), the
metadata limits and filters in :mod:`app.api.metadata`.

Each route parses the request, calls :class:`~app.service.conversations.ConversationService`
and renders its result; refusals are answered by the one problem handler."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Query, Request, Response

from app.agent.messages import MAX_SAFE_INTEGER, NO_NUL_PATTERN, Context
from app.agent.offload import offload
from app.etag import evaluate_conditions
from app.service.conversations import NotModified, Search
from app.store.metadata import KEEP

from ..deps import (
    ConversationPath,
    IfMatchHeader,
    IfNoneMatchHeader,
    LimitQuery,
    SeqCursorQuery,
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
from ..metadata import check_metadata, document_metadata, metadata_filters
from ..problems import (
    BAD_CURSOR,
    CONVERSATION_EXISTS,
    PRECONDITION_FAILED,
    PRECONDITION_REQUIRED,
    RUN_IN_PROGRESS,
    STORED_DATA_DAMAGED,
    UNSUPPORTED_MEDIA_TYPE,
    VERSION_EXPIRED,
    Problem,
    problem_responses,
)
from ..schemas import (
    METADATA_KEY_PATTERN,
    ContextVersion,
    ContextVersionPage,
    Conversation,
    ConversationCreate,
    ConversationPage,
    ConversationPatch,
    Timestamp,
)
from ..views import conversation_body
from . import portability

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
    check_metadata(svc.settings, body.metadata, "body.metadata")
    info = await svc.conversations.create(
        tenant,
        body.id,
        body.system_prompt,
        metadata=body.metadata,
        expires_at=svc.conversations.expiry(body.expires_at, body.ttl_seconds),
    )
    response.headers["Location"] = f"/conversations/{info.conversation.id}"
    response.headers["ETag"] = info.conversation.etag
    return conversation_body(info)


#: a listing's cursor: the keyset (updated_at in microseconds since the epoch, id) of the last
#: item of the page before. Any cursor of this grammar is a position (of either order).
LIST_CURSOR_PATTERN = r"^at\.([0-9]{1,18})\.([A-Za-z0-9][A-Za-z0-9._:-]{0,127})$"
_LIST_CURSOR = re.compile(LIST_CURSOR_PATTERN.removesuffix("$") + r"\Z")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: positions past the last representable time are that time (nothing is updated later)
_LATEST = (datetime.max.replace(tzinfo=UTC) - _EPOCH) // timedelta(microseconds=1)


def _list_cursor(updated_at: datetime, conv_id: str) -> str:
    micros = (updated_at - _EPOCH) // timedelta(microseconds=1)
    return f"at.{micros}.{conv_id}"


def _parse_list_cursor(cursor: str | None) -> tuple[datetime, str] | None:
    if cursor is None:
        return None
    found = _LIST_CURSOR.match(cursor)
    if found is None:
        raise Problem(BAD_CURSOR, "the cursor is not one this API issued")
    micros = min(int(found.group(1)), _LATEST)
    return _EPOCH + timedelta(microseconds=micros), found.group(2)


ListCursorQuery = Annotated[
    str | None,
    Query(
        max_length=512,
        description="`next_cursor` of the previous page (a position in the order)",
        json_schema_extra={"pattern": LIST_CURSOR_PATTERN},
    ),
]


@router.get(
    "/conversations",
    response_model=ConversationPage,
    responses=problem_responses(400, 422),
    operation_id="list_conversations",
    openapi_extra={
        "parameters": [
            {
                "name": "metadata.KEY",
                "in": "query",
                "required": False,
                "description": "Filter by metadata: `metadata.user=u-17` keeps the "
                "conversations whose metadata has `user` = `u-17`. Repeatable with "
                "different keys; all must match. (The parameter name is `metadata.` "
                "followed by a key matching " + METADATA_KEY_PATTERN + ".)",
                "schema": {"type": "string", "maxLength": 1024, "pattern": NO_NUL_PATTERN},
            }
        ]
    },
)
async def list_conversations(
    svc: ServicesDep,
    tenant: TenantDep,
    request: Request,
    cursor: ListCursorQuery = None,
    limit: LimitQuery = None,
    order: Annotated[
        Literal["asc", "desc"],
        Query(description="By `updated_at` (then id): newest first (`desc`) or oldest first"),
    ] = "desc",
    updated_after: Annotated[
        Timestamp | None,
        Query(description="Only conversations updated after this time (RFC 3339 with offset)"),
    ] = None,
    updated_before: Annotated[
        Timestamp | None,
        Query(description="Only conversations updated before this time (RFC 3339 with offset)"),
    ] = None,
    active: Annotated[
        bool | None, Query(description="true: only those with a run in flight; false: none")
    ] = None,
    has_pending_action: Annotated[
        bool | None,
        Query(
            description="true: only those whose stored context awaits tool results or "
            "approvals (non-empty `pending_tool_calls`); false: only those that await nothing"
        ),
    ] = None,
) -> ConversationPage:
    """The caller's conversations, ordered by `updated_at` (newest first unless
    `order=asc`), filtered by metadata, update time, activity and pending tool calls; cursor
    paged (pass the same filters with `cursor`)."""
    search = Search(
        metadata=tuple(metadata_filters(request)),
        updated_after=updated_after,
        updated_before=updated_before,
        active=active,
        has_pending_action=has_pending_action,
        descending=order == "desc",
    )
    page = await svc.conversations.list(
        tenant,
        after=_parse_list_cursor(cursor),
        limit=page_limit(svc.settings, limit),
        search=search,
    )
    last = page.items[-1].conversation if page.items else None
    return ConversationPage(
        items=[conversation_body(info) for info in page.items],
        next_cursor=_list_cursor(last.updated_at, last.id)
        if page.more and last is not None
        else None,
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
    responses=problem_responses(400, 404, RUN_IN_PROGRESS, PRECONDITION_FAILED, 422),
    operation_id="delete_conversation",
)
async def delete_conversation(
    svc: ServicesDep,
    tenant: TenantDep,
    conversation_id: ConversationPath,
    if_match: IfMatchHeader = None,
) -> Response:
    """Delete the conversation and all its records. Honours If-Match. While a run is in
    progress on it: 409 `run-in-progress` naming the run (cancel it, or let it end, first)."""
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
        **problem_responses(400, 404, VERSION_EXPIRED, STORED_DATA_DAMAGED, 422),
    },
    operation_id="get_context",
)
async def get_context(
    svc: ServicesDep,
    tenant: TenantDep,
    conversation_id: ConversationPath,
    if_none_match: IfNoneMatchHeader = None,
    version: Annotated[
        int | None,
        Query(
            ge=1,
            le=MAX_SAFE_INTEGER,
            description="The context as it stood at this version (`GET …/versions`), with "
            "that version's ETag: 404 for a version it never had, 410 `version-expired` past "
            "the version retention",
        ),
    ] = None,
) -> Response:
    """The stored Context, with its ETag; `If-None-Match` answers 304 when unchanged. With
    `version`, the context as it stood at that version."""
    if version is not None:
        at = await svc.conversations.context_at(tenant, conversation_id, version)
        if (
            if_none_match is not None
            and evaluate_conditions(
                None, if_none_match_value(if_none_match), at.conversation.etag, safe_method=True
            )
            == "not-modified"
        ):
            return Response(status_code=304, headers={"ETag": at.conversation.etag})
        return Response(
            at.context_json(),
            media_type="application/json",
            headers={"ETag": at.conversation.etag},
        )
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


@router.get(
    "/conversations/{conversation_id}/versions",
    response_model=ContextVersionPage,
    responses=problem_responses(400, 404, 422),
    operation_id="list_context_versions",
)
async def list_context_versions(
    svc: ServicesDep,
    tenant: TenantDep,
    conversation_id: ConversationPath,
    cursor: SeqCursorQuery = None,
    limit: LimitQuery = None,
) -> ContextVersionPage:
    """The context's kept versions, newest first: each one's number, ETag, message count,
    what wrote it and when. Read one with `GET …/context?version=N`; fork from one with
    `"version": N`. Earlier versions are kept `CARRYOVER_VERSION_RETENTION_SECONDS` after
    they were written; the current one always."""
    page = await svc.conversations.versions(
        tenant,
        conversation_id,
        before=decode_cursor(cursor, int),
        limit=page_limit(svc.settings, limit),
    )
    return ContextVersionPage(
        items=[ContextVersion.model_validate(v, from_attributes=True) for v in page.items],
        next_cursor=encode_cursor(page.items[-1].version) if page.more else None,
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
    await offload(len(context.messages), check_context, svc.settings, context)  # long: a thread
    written = await svc.conversations.put_context(
        tenant, conversation_id, context, if_match=match, if_none_match=none_match
    )
    # the answer is the context as stored, built from the texts the write dumped (the same
    # bytes a JSONResponse of it would send, without dumping it again)
    if not written.created:
        return Response(written.body, media_type=JSON, headers={"ETag": written.etag})
    return Response(
        written.body,
        status_code=201,
        media_type=JSON,
        headers={"ETag": written.etag, "Location": f"/conversations/{conversation_id}"},
    )


JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"


@router.patch(
    "/conversations/{conversation_id}",
    response_model=Conversation,
    responses={
        200: {"headers": {"ETag": ETAG_HEADER}},
        **problem_responses(404, UNSUPPORTED_MEDIA_TYPE, 422),
    },
    operation_id="patch_conversation",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                MERGE_PATCH: {"schema": {"$ref": "#/components/schemas/ConversationPatch"}}
            },
        }
    },
)
async def patch_conversation(
    svc: ServicesDep,
    tenant: TenantDep,
    conversation_id: ConversationPath,
    request: Request,
    response: Response,
    body: Annotated[ConversationPatch, Body(media_type=MERGE_PATCH)],
) -> Conversation:
    """Change the metadata and expiry with an RFC 7396 merge patch
    (`Content-Type: application/merge-patch+json`): `null` removes a key. The Context and
    its ETag are not changed; `updated_at` is."""
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != MERGE_PATCH:
        raise Problem(UNSUPPORTED_MEDIA_TYPE, f"PATCH takes {MERGE_PATCH}, not {media or 'none'}")
    metadata = body.metadata
    if metadata is None and "metadata" not in body.model_fields_set:
        metadata = {}  # left out: unchanged (null: every key removed)
    if metadata:
        check_metadata(svc.settings, metadata, "body.metadata", count=False)
    expires: Any = KEEP
    if body.ttl_seconds is not None or "expires_at" in body.model_fields_set:
        expires = svc.conversations.expiry(body.expires_at, body.ttl_seconds)
    info = await svc.conversations.patch(
        tenant,
        conversation_id,
        metadata,
        expires_at=expires,
        max_keys=svc.settings.max_metadata_keys,
    )
    response.headers["ETag"] = info.conversation.etag
    return conversation_body(info)


# Fork, export and import are this router's routes, after those above as they were declared
# (the document's order of operations): the route objects themselves, not an included router,
# so ``router.routes`` lists every conversation route.
router.routes.extend(portability.router.routes)

__all__ = ["_list_cursor", "_parse_list_cursor", "check_metadata", "document_metadata", "router"]
