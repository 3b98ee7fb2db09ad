"""A conversation moved whole (contract §4): fork one, export it as one JSON document,
import such a document. Its routes are added to :mod:`app.api.routes.conversations`' router
after that module's own, so the document keeps its order of operations."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Response
from fastapi.responses import StreamingResponse

from app.agent.codec import compact_json, dump_message
from app.agent.replay import ReplayError, validate_storable

from ..deps import ConversationPath, IfMatchHeader, ServicesDep, TenantDep, if_match_value
from ..exports import EXPORT_FORMAT, ConversationExport
from ..headers import ETAG_HEADER, LOCATION_HEADER
from ..limits import check_context
from ..metadata import check_metadata
from ..problems import (
    CONVERSATION_EXISTS,
    PRECONDITION_FAILED,
    RUN_IN_PROGRESS,
    STORED_DATA_DAMAGED,
    UNSAFE_CUT,
    VERSION_EXPIRED,
    problem_responses,
    unreplayable_context,
)
from ..schemas import CONVERSATION_ID_PATTERN, Conversation, ConversationFork
from ..views import conversation_body

#: its routes are added to :data:`app.api.routes.conversations.router` (whose tag they carry)
router = APIRouter(tags=["conversations"])


@router.post(
    "/conversations/{conversation_id}/fork",
    status_code=201,
    response_model=Conversation,
    responses={
        201: {"headers": {"Location": LOCATION_HEADER, "ETag": ETAG_HEADER}},
        **problem_responses(
            400,
            404,
            CONVERSATION_EXISTS,
            VERSION_EXPIRED,
            PRECONDITION_FAILED,
            STORED_DATA_DAMAGED,
            UNSAFE_CUT,
            422,
        ),
    },
    operation_id="fork_conversation",
)
async def fork_conversation(
    svc: ServicesDep,
    tenant: TenantDep,
    conversation_id: ConversationPath,
    response: Response,
    body: Annotated[ConversationFork | None, Body()] = None,
    if_match: IfMatchHeader = None,
) -> Conversation:
    """A new conversation with this one's Context (or its first `messages`), its own ETag
    chain, and a transcript starting with a `forked` entry (source id, source ETag, N). The
    source is unchanged. `If-Match` forks only that version of the source; `version` forks
    the context as it stood at an earlier version (`GET …/versions`)."""
    body = body or ConversationFork()
    if body.metadata is not None:
        check_metadata(svc.settings, body.metadata, "body.metadata")
    info = await svc.conversations.fork(
        tenant,
        conversation_id,
        body.id,
        messages=body.messages,
        metadata=body.metadata,
        if_match=if_match_value(if_match),
        version=body.version,
    )
    response.headers["Location"] = f"/conversations/{info.conversation.id}"
    response.headers["ETag"] = info.conversation.etag
    return conversation_body(info)


def _dumps(value: Any) -> bytes:
    return compact_json(value).encode()


_SECTIONS = ("message", "transcript", "run")
_OPEN = (b',"messages":[', b',"transcript":[', b',"runs":[')
_CLOSE = (b"]}", b"]", b"]")  # the messages close the context object too


async def _export_stream(parts: AsyncIterator[tuple[str, Any]]) -> AsyncIterator[bytes]:
    """The export document as JSON, written part by part (never whole in memory)."""
    yield _dumps({"format": EXPORT_FORMAT, "format_version": 1})[:-1]
    open_at = -1  # the index of the open section (none yet)
    first = True

    def advance(to: int) -> bytes:
        nonlocal open_at, first
        out = b""
        while open_at < to:
            if open_at >= 0:
                out += _CLOSE[open_at]
            open_at += 1
            if open_at < len(_SECTIONS):
                out += _OPEN[open_at]
            first = True
        return out

    async for part, value in parts:
        if part == "conversation":
            yield b',"conversation":' + _dumps(value)
        elif part == "context":
            yield b',"context":' + _dumps(value)[:-1]  # its messages follow
        else:
            moved = advance(_SECTIONS.index(part))
            yield moved + (b"" if first else b",") + _dumps(value)
            first = False
    yield advance(len(_SECTIONS)) + b"}"


@router.get(
    "/conversations/{conversation_id}/export",
    response_model=ConversationExport,
    responses=problem_responses(404, RUN_IN_PROGRESS, STORED_DATA_DAMAGED, 422),
    operation_id="export_conversation",
)
async def export_conversation(
    svc: ServicesDep, tenant: TenantDep, conversation_id: ConversationPath
) -> StreamingResponse:
    """The whole conversation as one JSON document (format version, metadata, Context and
    its ETag version, transcript, run records), streamed from paged reads of one snapshot.
    409 while a run is in flight."""
    parts = await svc.conversations.export(tenant, conversation_id)
    return StreamingResponse(
        _export_stream(parts),
        media_type="application/json",
        headers={"Content-Disposition": f'attachment; filename="{conversation_id}.json"'},
    )


@router.post(
    "/conversations/import",
    status_code=201,
    response_model=Conversation,
    responses={
        201: {"headers": {"Location": LOCATION_HEADER, "ETag": ETAG_HEADER}},
        **problem_responses(CONVERSATION_EXISTS, 422),
    },
    operation_id="import_conversation",
)
async def import_conversation(
    svc: ServicesDep,
    tenant: TenantDep,
    response: Response,
    document: ConversationExport,
    id: Annotated[
        str | None,
        Query(
            pattern=CONVERSATION_ID_PATTERN,
            max_length=128,
            description="Import under this id instead of the document's",
        ),
    ] = None,
) -> Conversation:
    """Restore an export, under its own id or `id`; 409 when that id is taken. All of it is
    written, or nothing."""
    check_metadata(svc.settings, document.conversation.metadata, "body.conversation.metadata")
    check_context(svc.settings, document.context, "body.context")
    try:
        validate_storable(document.context)
    except ReplayError as exc:
        raise unreplayable_context(exc.index, str(exc)) from None
    data = document.model_dump()
    data["context"]["messages"] = [dump_message(m) for m in document.context.messages]
    for run, model in zip(data["runs"], document.runs, strict=True):
        run["prompts"] = [dump_message(m) for m in model.prompts]
        run["new_messages"] = [dump_message(m) for m in model.new_messages]
        run["final"] = None if model.final is None else dump_message(model.final)
        for stored, compaction in zip(run["compactions"], model.compactions, strict=True):
            stored["folded"] = [dump_message(m) for m in compaction.folded]
            stored["usage"] = compaction.usage.model_dump(mode="json")
    info = await svc.conversations.import_document(tenant, id, data)
    response.headers["Location"] = f"/conversations/{info.conversation.id}"
    response.headers["ETag"] = info.conversation.etag
    return conversation_body(info)
