"""The append-only transcript (contract §4): never rewritten by compaction."""

from __future__ import annotations

from fastapi import APIRouter

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
from ..problems import problem_responses
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
    page = await svc.conversations.transcript(
        tenant,
        conversation_id,
        after=decode_cursor(cursor, int) or 0,
        limit=page_limit(svc.settings, limit),
    )
    return TranscriptPage(
        items=[TranscriptEntry.model_validate(row, from_attributes=True) for row in page.items],
        next_cursor=encode_cursor(page.items[-1].seq) if page.more else None,
    )
