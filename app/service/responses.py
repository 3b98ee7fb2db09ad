"""What the OpenAI-compatible surface (``/v1``, docs/openai.md) needs of the service beyond the
native use cases: runs found by id alone (a response id is ``resp_`` + a run id), the
transcript's messages with their place in their run (the stable identity of an item), and runs
that store nothing (``store: false``).

Everything else — creating conversations, starting and cancelling runs, leases, quotas, events,
webhooks — is the native :class:`~app.service.conversations.ConversationService` and
:class:`~app.service.runs.RunManager`, called as they are.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from app import telemetry
from app.agent.codec import load_message
from app.agent.events import EventSink
from app.agent.mcp import McpToolset
from app.agent.messages import AnyMessage, Context
from app.agent.records import Result
from app.errors import CarryoverError
from app.etag import parse_version_etag
from app.store._sql import decode
from app.store.stores import Loaded, RunRecord, Stores
from app.store.tables import Run, TranscriptEntry
from app.store.versions import VersionExpired

from . import pending
from .agents import AgentPool
from .bounds import RunDeadline, size_bounds
from .conversations import ConversationInfo, ConversationService
from .runs import RunManager
from .types import RunRequest


class ResponseNotFound(CarryoverError):
    """No run of this id for the caller's tenant (or it stored nothing)."""

    slug = "not-found"
    status = 404

    def __init__(self, run_id: str) -> None:
        super().__init__(f"no response with id 'resp_{run_id}' found", run_id=run_id)


class ForkUnavailable(CarryoverError):
    """The context right after a response is no longer kept: its version is past the version
    retention (docs/conversations.md, "Versions"), or the conversation was deleted and made
    again since."""

    slug = "validation-error"
    status = 422

    def __init__(self, run_id: str) -> None:
        super().__init__(
            f"the context right after response 'resp_{run_id}' is no longer kept: its version "
            "is past the version retention (CARRYOVER_VERSION_RETENTION_SECONDS)"
        )


@dataclass(frozen=True)
class StoredMessage:
    """One message of a conversation's transcript: the run that added it, its index in that
    run's ``new_messages`` (together its identity, stable across reads), and the message."""

    run_id: str
    index: int
    seq: int
    failed: bool  # an attempt that ended in error or abort: a run record, not context
    kind: str  # the transcript entry's kind (prompt, attempt, tool_result, client_result)
    message: AnyMessage


def _stored(entries: Sequence[TranscriptEntry], indexes: dict[int, int]) -> list[StoredMessage]:
    return [
        StoredMessage(
            run_id=e.run_id or "",
            index=indexes[e.seq],
            seq=e.seq,
            failed=e.failed,
            kind=e.kind,
            message=load_message(e.body),
        )
        for e in entries
    ]


class ResponseService:
    """Runs as responses, messages as items, and unstored runs."""

    def __init__(
        self, stores: Stores, runs: RunManager, conversations: ConversationService
    ) -> None:
        self.stores = stores
        self.runs = runs
        self.conversations = conversations

    @property
    def agents(self) -> AgentPool:
        return self.runs.agents

    async def find(self, tenant: str, run_id: str) -> Run:
        """The tenant's run of this id (any conversation); 404 when there is none."""
        found = await self.stores.records.find_run(tenant, run_id)
        if found is None or found.response_deleted_at is not None:
            raise ResponseNotFound(run_id)
        return found

    async def delete(self, tenant: str, run: Run) -> bool:
        """Delete ``run`` as a response (``/v1`` no longer finds it; its run record, the
        transcript and the context stay); False while it is queued or running."""
        return await self.stores.records.delete_response(tenant, run.run_id)

    async def record_of(self, tenant: str, run: Run) -> RunRecord:
        """The full record (new messages, final) of a run :meth:`find` found: its row is not
        read again."""
        return await self.stores.records.record_of(tenant, run)

    async def run_messages(
        self, tenant: str, conversation_id: str, run_id: str
    ) -> list[StoredMessage]:
        """The messages one run added to the transcript, in order."""
        entries = await self.stores.records.run_message_entries(tenant, conversation_id, [run_id])
        return _stored(entries, {e.seq: i for i, e in enumerate(entries)})

    async def deleted_items(self, tenant: str, conv_id: str) -> set[str]:
        """The ids of the items deleted from the conversation (``DELETE …/items/…``)."""
        return await self.stores.records.deleted_items(tenant, conv_id)

    async def messages(
        self,
        tenant: str,
        conversation_id: str,
        *,
        from_seq: int | None,
        descending: bool,
        limit: int,
    ) -> list[StoredMessage]:
        """A page of the conversation's transcript messages (from ``from_seq``, inclusive),
        each with its place in its run: one more read for the runs on the page."""
        entries = await self.stores.records.message_entries(
            tenant, conversation_id, from_seq=from_seq, descending=descending, limit=limit
        )
        run_ids = sorted({e.run_id for e in entries if e.run_id})
        indexes: dict[int, int] = {}
        counted: dict[str, int] = {}
        for e in await self.stores.records.run_message_entries(tenant, conversation_id, run_ids):
            key = e.run_id or ""
            indexes[e.seq] = counted.get(key, 0)
            counted[key] = indexes[e.seq] + 1
        return _stored([e for e in entries if e.seq in indexes], indexes)

    async def _version(self, tenant: str, run: Run) -> int:
        """The version ``run`` stored (it stored one); :class:`ForkUnavailable` when the
        conversation it stored it in is not the one of that id now (deleted and made again)."""
        parsed = parse_version_etag(run.result_etag or "")
        info = await self.conversations.get(tenant, run.conversation_id)
        if parsed is None or parsed[0] != info.conversation.incarnation:
            raise ForkUnavailable(run.run_id)
        return parsed[1]

    async def fork_at(self, tenant: str, run: Run) -> ConversationInfo:
        """A new conversation holding the context as it stood right after ``run`` (the version
        it stored: through compactions and replaces since, with any calls it left unanswered
        still pending), transcript starting with ``forked``; the conversation it forks from is
        not changed. :class:`ForkUnavailable` when that version is past the retention."""
        version = await self._version(tenant, run)
        try:
            return await self.conversations.fork(tenant, run.conversation_id, version=version)
        except VersionExpired:
            raise ForkUnavailable(run.run_id) from None

    async def context_at(self, tenant: str, run: Run, *, latest: bool) -> Context:
        """The context as it stood right after ``run`` (``latest``: it is its conversation's
        latest response, so that is the stored context), read and not copied."""
        if latest:
            loaded = await self.conversations.get_context(tenant, run.conversation_id)
            assert isinstance(loaded, Loaded)  # asked without If-None-Match
            return loaded.context
        version = await self._version(tenant, run)
        try:
            rows = await self.stores.versions.load_version_rows(
                tenant, run.conversation_id, version
            )
        except VersionExpired:
            raise ForkUnavailable(run.run_id) from None
        return (await decode(rows)).context

    async def prepare_unstored(
        self, request: RunRequest, context: Context
    ) -> tuple[RunRequest, McpToolset | None]:
        """What a run that stores nothing checks before anything runs, as a stored run does:
        its own MCP servers (allowed, public), their listings (a name found twice: 422), and
        its tools and answers on ``context``. The request as checked, and its MCP tools."""
        agent = self.agents.for_run(request)
        request = await self.runs.state.mcp.admit(request, queued=False)
        toolset = await self.runs.state.mcp.prelist(agent, request)
        pending.checker(agent, request, toolset)(context, None)
        return request, toolset

    async def run_unstored(
        self,
        tenant: str,
        run_id: str,
        request: RunRequest,
        context: Context,
        on_event: EventSink | None = None,
        *,
        toolset: McpToolset | None = None,
    ) -> Result:
        """Run the agent on ``context`` and store nothing (``store: false``): no conversation,
        so no lease to take; the same agent, checks, bounds, deadline and span as a stored run,
        and its tokens count in the tenant's usage (:meth:`admit_unstored` first).
        :meth:`prepare_unstored` first: ``toolset`` is what it listed."""
        agent = self.agents.for_run(request)
        agent_input = pending.run_input(
            context, request, size_bounds(self.runs.settings), toolset=toolset
        )
        pending.checker(agent, request, toolset)(context, None)
        with telemetry.agent_span(request.agent, "", run_id) as span:
            task = asyncio.ensure_future(agent.run(agent_input, on_event=on_event))
            with RunDeadline(self.runs.settings.run_deadline_seconds, task.cancel) as deadline:
                result = await task
            result = deadline.settle(result)
            telemetry.record_run(span, result.status, result.usage)
        await self.stores.quotas.settle_unstored(tenant, result.usage)
        return result

    async def admit_unstored(self, tenant: str) -> None:
        """Admit a response that will store nothing, under the tenant's quota (429 when it is
        spent), before anything of it is answered."""
        await self.stores.quotas.admit_unstored(tenant)


__all__ = ["ForkUnavailable", "ResponseNotFound", "ResponseService", "StoredMessage"]
