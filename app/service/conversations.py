"""Conversations as use cases (SPEC §4): create, list, get, delete; read and replace the
context; the transcript; compact now. Each takes parsed values and returns plain results."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from app.agent.messages import Context
from app.agent.replay import ReplayError, validate_context
from app.etag import ETagCondition, IfMatch, evaluate_conditions
from app.store.errors import PreconditionFailed, conversation_not_found
from app.store.repository import Loaded, Repository, StoredRows
from app.store.tables import Conversation, TranscriptEntry

from .errors import UnreplayableContext
from .pages import Page
from .runs import FinishedRun, RunManager

#: the detail of a refused PUT of the context
PUT_REFUSED = "the precondition does not hold for the stored context"


@dataclass(frozen=True)
class ConversationInfo:
    """A conversation's metadata and how many runs it has."""

    conversation: Conversation
    run_count: int


@dataclass(frozen=True)
class NotModified:
    """``If-None-Match`` named the current ETag."""

    etag: str


@dataclass(frozen=True)
class ContextWritten:
    etag: str
    created: bool  # the conversation was created with it (If-None-Match: *)


class ConversationService:
    def __init__(self, repo: Repository, runs: RunManager) -> None:
        self.repo = repo
        self.runs = runs

    async def create(
        self, tenant: str, conv_id: str | None = None, system_prompt: str = ""
    ) -> ConversationInfo:
        """An empty conversation, with a generated id unless one is given."""
        conv_id = conv_id or f"conv_{uuid.uuid4().hex}"
        conv = await self.repo.create_conversation(tenant, conv_id, system_prompt)
        return ConversationInfo(conv, 0)

    async def list(
        self, tenant: str, *, after: str | None = None, limit: int = 50
    ) -> Page[ConversationInfo]:
        """The tenant's conversations ordered by id, after the id ``after``."""
        fetched = await self.repo.list_conversations(tenant, after_id=after, limit=limit + 1)
        page = Page.of(fetched, limit)
        counts = await self.repo.run_counts(tenant, [c.id for c in page.items])
        return Page([ConversationInfo(c, counts.get(c.id, 0)) for c in page.items], page.more)

    async def get(self, tenant: str, conv_id: str) -> ConversationInfo:
        conv = await self.repo.get_conversation(tenant, conv_id)
        if conv is None:
            raise conversation_not_found(conv_id)
        counts = await self.repo.run_counts(tenant, [conv.id])
        return ConversationInfo(conv, counts.get(conv.id, 0))

    async def delete(self, tenant: str, conv_id: str, if_match: IfMatch | None = None) -> None:
        """Delete it and all its records; 404 before 412."""
        if not await self.repo.delete_conversation(tenant, conv_id, if_match):
            raise conversation_not_found(conv_id)

    async def get_context(
        self, tenant: str, conv_id: str, if_none_match: ETagCondition | None = None
    ) -> Loaded | NotModified:
        """The stored context; :class:`NotModified` when ``if_none_match`` names its ETag (told
        from the conversation row alone, without reading the messages)."""
        if if_none_match is not None:
            conv = await self.repo.get_conversation(tenant, conv_id)
            if conv is None:
                raise conversation_not_found(conv_id)
            outcome = evaluate_conditions(None, if_none_match, conv.etag, safe_method=True)
            if outcome == "not-modified":
                return NotModified(conv.etag)
        return await self.repo.load_context(tenant, conv_id)

    async def get_context_rows(
        self, tenant: str, conv_id: str, if_none_match: ETagCondition | None = None
    ) -> StoredRows | NotModified:
        """As :meth:`get_context`, undecoded: the stored rows, whose
        :meth:`~app.store.repository.StoredRows.context_json` is the wire format as stored."""
        if if_none_match is not None:
            conv = await self.repo.get_conversation(tenant, conv_id)
            if conv is None:
                raise conversation_not_found(conv_id)
            outcome = evaluate_conditions(None, if_none_match, conv.etag, safe_method=True)
            if outcome == "not-modified":
                return NotModified(conv.etag)
        return await self.repo.load_context_rows(tenant, conv_id)

    async def put_context(
        self,
        tenant: str,
        conv_id: str,
        context: Context,
        *,
        if_match: ETagCondition | None,
        if_none_match: ETagCondition | None,
    ) -> ContextWritten:
        """Replace the context (``if_match``) or create the conversation with it
        (``if_none_match`` ``*``, without ``if_match``). The context must be replayable."""
        if if_match is None and (if_none_match is None or not if_none_match.any):
            raise ValueError("give if_match, or if_none_match '*' to create")
        try:
            validate_context(context)
        except ReplayError as exc:
            raise UnreplayableContext(exc.index, str(exc)) from None
        if if_match is not None and if_none_match is not None:
            # RFC 9110 §13.2.2: If-Match, then If-None-Match. If-Match needs the conversation to
            # exist, and If-None-Match then fails when it names the current ETag (or is "*").
            conv = await self.repo.get_conversation(tenant, conv_id)
            if conv is None:
                raise conversation_not_found(conv_id)
            outcome = evaluate_conditions(if_match, if_none_match, conv.etag, safe_method=False)
            if outcome != "proceed":
                raise PreconditionFailed(PUT_REFUSED, current_etag=conv.etag)
        try:
            if if_match is not None:
                etag = await self.repo.replace_context(tenant, conv_id, context, if_match=if_match)
                return ContextWritten(etag, created=False)
            etag = await self.repo.replace_context(tenant, conv_id, context, create=True)
            return ContextWritten(etag, created=True)
        except PreconditionFailed as exc:
            current = exc.current_etag
            if current is None:  # If-None-Match: * found the conversation
                conv = await self.repo.get_conversation(tenant, conv_id)
                current = conv.etag if conv is not None else None
            raise PreconditionFailed(PUT_REFUSED, current_etag=current) from None

    async def transcript(
        self, tenant: str, conv_id: str, *, after: int = 0, limit: int = 100
    ) -> Page[TranscriptEntry]:
        """The append-only transcript, by sequence number, after ``after``."""
        fetched = await self.repo.list_transcript(tenant, conv_id, after_seq=after, limit=limit + 1)
        return Page.of(fetched, limit)

    async def compact(
        self, tenant: str, conv_id: str, agent: str = "default", if_match: IfMatch | None = None
    ) -> FinishedRun:
        """Fold all but the current turn into the summary now, as a run without prompts."""
        return await self.runs.compact(tenant, conv_id, agent, if_match)


__all__ = [
    "ContextWritten",
    "ConversationInfo",
    "ConversationService",
    "NotModified",
    "Page",
]
