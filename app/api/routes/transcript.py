"""The append-only transcript (SPEC §4): never rewritten by compaction."""

from __future__ import annotations

from fastapi import APIRouter

from app.store.errors import NotFound

from ..deps import (
    ConversationPath,
    LimitQuery,
    SeqCursorQuery,
    ServicesDep,
    TenantDep,
    decode_cursor,
    encode_cursor,
    page_limit,
)
from ..problems import conversation_not_found, problem_responses
from ..schemas import TranscriptEntry, TranscriptPage

router = APIRouter(tags=["transcript"])


@router.get(
    "/conversations/{conversation_id}/transcript",
    response_model=TranscriptPage,
    responses=problem_responses(400, 404, 422),
    operation_id="get_transcript",
)
async def get_transcript(
    svc: ServicesDep,
    tenant: TenantDep,
    conversation_id: ConversationPath,
    cursor: SeqCursorQuery = None,
    limit: LimitQuery = None,
) -> TranscriptPage:
    """Every admitted prompt, assistant attempt (failed ones flagged), tool result, compaction
    and context replacement, in order, each with its run id, sequence number and time."""
    size = page_limit(svc.settings, limit)
    after = decode_cursor(cursor, int) or 0
    try:
        rows = await svc.repo.list_transcript(
            tenant, conversation_id, after_seq=after, limit=size + 1
        )
    except NotFound:
        raise conversation_not_found(conversation_id) from None
    more = len(rows) > size
    rows = rows[:size]
    return TranscriptPage(
        items=[TranscriptEntry.model_validate(row, from_attributes=True) for row in rows],
        next_cursor=encode_cursor(rows[-1].seq) if more else None,
    )
