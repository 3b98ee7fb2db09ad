"""Conversations as use cases (contract §4): create, list, get, delete; read and replace the
context; the transcript; compact now. Each takes parsed values and returns plain results."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from app.agent.messages import Context
from app.agent.offload import offload
from app.agent.pending import PendingCall
from app.agent.replay import ReplayError, validate_storable
from app.etag import ETagCondition, IfMatch, evaluate_conditions
from app.store.conversations import Search, cached_rows
from app.store.errors import PreconditionFailed, conversation_not_found
from app.store.listing import RunSummary
from app.store.metadata import KEEP
from app.store.stores import DumpedContext, Loaded, StoredRows, Stores
from app.store.tables import Conversation, TranscriptEntry
from app.store.versions import VersionInfo

from .bounds import size_bounds
from .errors import UnreplayableContext
from .pages import Page
from .pending import stored_pending_calls
from .runs import FinishedRun, RunManager

#: the detail of a refused PUT of the context
PUT_REFUSED = "the precondition does not hold for the stored context"


@dataclass(frozen=True)
class ConversationInfo:
    """A conversation's metadata and how many runs it has."""

    conversation: Conversation
    run_count: int
    metadata: dict[str, str] = field(default_factory=dict)
    #: the calls the stored context awaits (docs/tools.md)
    pending_tool_calls: tuple[PendingCall, ...] = ()


@dataclass(frozen=True)
class NotModified:
    """``If-None-Match`` named the current ETag."""

    etag: str


@dataclass(frozen=True)
class ContextWritten:
    etag: str
    created: bool  # the conversation was created with it (If-None-Match: *)
    body: bytes = b""  # the stored context's JSON, as GET context answers it


class ConversationService:
    def __init__(self, stores: Stores, runs: RunManager) -> None:
        self.stores = stores
        self.runs = runs

    def expiry(self, expires_at: datetime | None, ttl_seconds: int | None) -> datetime | None:
        """``expires_at`` as given, or ``ttl_seconds`` from now (the store's clock)."""
        if ttl_seconds is not None:
            return self.stores.clock.now() + timedelta(seconds=ttl_seconds)
        return expires_at

    async def create(
        self,
        tenant: str,
        conv_id: str | None = None,
        system_prompt: str = "",
        *,
        metadata: Mapping[str, str] | None = None,
        expires_at: datetime | None = None,
    ) -> ConversationInfo:
        """An empty conversation, with a generated id unless one is given."""
        conv_id = conv_id or f"conv_{uuid.uuid4().hex}"
        conv = await self.stores.conversations.create_conversation(
            tenant, conv_id, system_prompt, metadata=metadata, expires_at=expires_at
        )
        return ConversationInfo(conv, 0, dict(metadata or {}))

    async def list(
        self,
        tenant: str,
        *,
        after: tuple[datetime, str] | None = None,
        limit: int = 50,
        search: Search | None = None,
    ) -> Page[ConversationInfo]:
        """The tenant's conversations matching ``search``, by ``(updated_at, id)`` (newest
        first unless ``search`` says otherwise), after the keyset ``after``."""
        fetched = await self.stores.conversations.search_conversations(
            tenant, search or Search(), after=after, limit=limit + 1
        )
        page = Page.of(fetched, limit)
        return Page([*await self._infos(tenant, page.items)], page.more)

    async def _infos(
        self, tenant: str, convs: Sequence[Conversation]
    ) -> Sequence[ConversationInfo]:
        """Two statements for any number of conversations: their runs (count and latest
        profile) and their metadata; the pending calls are on the rows."""
        ids = [c.id for c in convs]
        summaries = await self.stores.conversations.run_summaries(tenant, ids)
        metadata = await self.stores.metadata.get_metadata(tenant, ids)
        return [self._info(c, summaries.get(c.id), metadata.get(c.id, {})) for c in convs]

    def _info(
        self, conv: Conversation, runs: RunSummary | None, metadata: dict[str, str]
    ) -> ConversationInfo:
        agent = runs.latest_agent if runs is not None else None
        return ConversationInfo(
            conv,
            runs.count if runs is not None else 0,
            metadata,
            stored_pending_calls(self.runs.agents, conv, agent),
        )

    async def get(self, tenant: str, conv_id: str) -> ConversationInfo:
        """One statement for a conversation without metadata, two with."""
        found = await self.stores.conversations.summarize_conversation(tenant, conv_id)
        if found is None:
            raise conversation_not_found(conv_id)
        return self._info(found.conversation, found.runs, found.metadata)

    async def patch(
        self,
        tenant: str,
        conv_id: str,
        metadata: Mapping[str, str | None] | None,
        *,
        expires_at: datetime | None = KEEP,
        max_keys: int,
    ) -> ConversationInfo:
        """Merge-patch the metadata (``None`` removes a key; ``metadata`` ``None`` every key)
        and set or clear ``expires_at``;
        the context and its ETag are untouched."""
        patched = await self.stores.metadata.patch_conversation(
            tenant, conv_id, metadata, expires_at=expires_at, max_keys=max_keys
        )
        [info] = await self._infos(tenant, [patched.conversation])
        return info

    async def fork(
        self,
        tenant: str,
        source_id: str,
        new_id: str | None = None,
        *,
        messages: int | None = None,
        metadata: Mapping[str, str] | None = None,
        if_match: IfMatch | None = None,
        version: int | None = None,
    ) -> ConversationInfo:
        """A new conversation from the source's context (or its first ``messages``), as it
        stands or as it stood at ``version``."""
        new_id = new_id or f"conv_{uuid.uuid4().hex}"
        conv = await self.stores.conversations.fork_conversation(
            tenant,
            source_id,
            new_id,
            messages=messages,
            metadata=metadata,
            if_match=if_match,
            bounds=size_bounds(self.runs.settings),
            version=version,
        )
        [info] = await self._infos(tenant, [conv])
        return info

    async def export(self, tenant: str, conv_id: str) -> AsyncIterator[tuple[str, Any]]:
        """The export document's parts (404 and 409 are raised before the first)."""
        return await self.stores.portability.export_parts(tenant, conv_id)

    async def import_document(
        self, tenant: str, conv_id: str | None, document: Mapping[str, Any]
    ) -> ConversationInfo:
        """Restore an export (validated by the caller) under ``conv_id`` (default: the
        document's id); 409 when it is taken, and then nothing is written."""
        conv_id = conv_id or document["conversation"]["id"]
        await self.stores.portability.import_conversation(
            tenant, conv_id, document, max_bytes=self.runs.settings.max_body_bytes
        )
        return await self.get(tenant, conv_id)

    async def sweep(self) -> int:
        """Delete expired conversations now (what the periodic sweep does)."""
        return await self.runs.keeper.sweep_retention()

    async def delete(self, tenant: str, conv_id: str, if_match: IfMatch | None = None) -> None:
        """Delete it and all its records; 404 before 412."""
        if not await self.stores.conversations.delete_conversation(tenant, conv_id, if_match):
            raise conversation_not_found(conv_id)

    async def get_context(
        self, tenant: str, conv_id: str, if_none_match: ETagCondition | None = None
    ) -> Loaded | NotModified:
        """The stored context; :class:`NotModified` when ``if_none_match`` names its ETag (told
        from the conversation row alone, without reading the messages)."""
        if if_none_match is not None:
            conv = await self.stores.conversations.get_conversation(tenant, conv_id)
            if conv is None:
                raise conversation_not_found(conv_id)
            outcome = evaluate_conditions(None, if_none_match, conv.etag, safe_method=True)
            if outcome == "not-modified":
                return NotModified(conv.etag)
        return await self.stores.conversations.load_context(tenant, conv_id)

    async def get_context_rows(
        self, tenant: str, conv_id: str, if_none_match: ETagCondition | None = None
    ) -> StoredRows | NotModified:
        """As :meth:`get_context`, undecoded: the stored rows, whose
        :meth:`~app.store.stores.StoredRows.context_json` is the wire format as stored.
        The conversation's row alone answers a condition, and a body the cache holds at its
        version (one statement); otherwise the context is read in a transaction."""
        bodies = self.runs.bodies
        store = self.stores.conversations
        rows = None
        if if_none_match is not None or bodies.holds(tenant, conv_id):
            conv = await store.get_conversation(tenant, conv_id)
            if conv is None:
                raise conversation_not_found(conv_id)
            if if_none_match is not None:
                outcome = evaluate_conditions(None, if_none_match, conv.etag, safe_method=True)
                if outcome == "not-modified":
                    return NotModified(conv.etag)
            rows = cached_rows(conv, bodies.lookup)
        if rows is None:
            rows = await store.load_context_rows(tenant, conv_id, cached=bodies.lookup)
        if rows.joined is not None and not rows.cached:  # read (and checked): kept
            joined = rows.joined if isinstance(rows.joined, bytes) else rows.joined.encode()
            conv = rows.conversation
            bodies.keep(tenant, conv_id, conv.incarnation, conv.version, joined)
            rows = dataclasses.replace(rows, joined=joined)
        return rows

    async def put_context(
        self,
        tenant: str,
        conv_id: str,
        context: Context,
        *,
        if_match: ETagCondition | None,
        if_none_match: ETagCondition | None,
        deleted: Sequence[str] = (),
    ) -> ContextWritten:
        """Replace the context (``if_match``) or create the conversation with it
        (``if_none_match`` ``*``, without ``if_match``). The context must be storable: replayable,
        or ending with pending calls (docs/tools.md). ``deleted``: the /v1 items this
        replacement deletes (recorded in the transcript; refused while a run holds it)."""
        if if_match is None and (if_none_match is None or not if_none_match.any):
            raise ValueError("give if_match, or if_none_match '*' to create")
        try:  # it may end with pending calls (docs/tools.md); a long one off the loop
            await offload(len(context.messages), validate_storable, context)
        except ReplayError as exc:
            raise UnreplayableContext(exc.index, str(exc)) from None
        if if_match is not None and if_none_match is not None:
            # RFC 9110 §13.2.2: If-Match, then If-None-Match. If-Match needs the conversation to
            # exist, and If-None-Match then fails when it names the current ETag (or is "*").
            conv = await self.stores.conversations.get_conversation(tenant, conv_id)
            if conv is None:
                raise conversation_not_found(conv_id)
            outcome = evaluate_conditions(if_match, if_none_match, conv.etag, safe_method=False)
            if outcome != "proceed":
                raise PreconditionFailed(PUT_REFUSED, current_etag=conv.etag)
        # Stored, a context may be larger than it was sent (every field written out): what a
        # GET of it would answer must be PUT-able back (max_body_bytes).
        max_bytes = self.runs.settings.max_body_bytes
        dumped = await DumpedContext.dump(context.system_prompt, context.summary, context.messages)
        try:
            if if_match is not None:
                etag = await self.stores.conversations.replace_context(
                    tenant,
                    conv_id,
                    context,
                    if_match=if_match,
                    max_bytes=max_bytes,
                    dumped=dumped,
                    deleted=deleted,
                )
                return ContextWritten(etag, created=False, body=dumped.body)
            etag = await self.stores.conversations.replace_context(
                tenant, conv_id, context, create=True, max_bytes=max_bytes, dumped=dumped
            )
            return ContextWritten(etag, created=True, body=dumped.body)
        except PreconditionFailed as exc:
            current = exc.current_etag
            if current is None:  # If-None-Match: * found the conversation
                conv = await self.stores.conversations.get_conversation(tenant, conv_id)
                current = conv.etag if conv is not None else None
            raise PreconditionFailed(PUT_REFUSED, current_etag=current) from None

    async def transcript(
        self, tenant: str, conv_id: str, *, after: int = 0, limit: int = 100
    ) -> Page[TranscriptEntry]:
        """The append-only transcript, by sequence number, after ``after``."""
        fetched = await self.stores.records.list_transcript(
            tenant, conv_id, after_seq=after, limit=limit + 1
        )
        return Page.of(fetched, limit)

    async def versions(
        self, tenant: str, conv_id: str, *, before: int | None = None, limit: int = 100
    ) -> Page[VersionInfo]:
        """The context's kept versions, newest first, before version ``before``."""
        fetched = await self.stores.versions.list_versions(
            tenant, conv_id, before=before, limit=limit + 1
        )
        return Page.of(fetched, limit)

    async def context_at(self, tenant: str, conv_id: str, version: int) -> StoredRows:
        """The context as it stood at ``version`` (404 never written, 410 past retention)."""
        return await self.stores.versions.load_version_rows(tenant, conv_id, version)

    async def compact(
        self, tenant: str, conv_id: str, agent: str = "default", if_match: IfMatch | None = None
    ) -> FinishedRun:
        """Fold all but the current turn into the summary now, as a run without prompts."""
        return await self.runs.compactor.compact(tenant, conv_id, agent, if_match)


__all__ = [
    "ContextWritten",
    "ConversationInfo",
    "ConversationService",
    "NotModified",
    "Page",
    "Search",
]
