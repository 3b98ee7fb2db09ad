"""What the ``/v1`` routes share: the response service, runs of the native run manager waited
for, tool names of a conversation's pending calls, and ``item_reference`` resolution."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from typing import Annotated, Any

from fastapi import Depends

from app.agent.messages import AnyMessage, AssistantMessage, ToolCallBlock, ToolResultMessage
from app.agent.pending import Approval
from app.service.responses import ResponseService, StoredMessage
from app.service.runs import ActiveRun, FinishedRun, RunRequest
from app.store.changes import pending_blocks
from app.store.errors import conversation_not_found

from ..deps import Services, ServicesDep
from ..problems import PROBLEM_TYPES
from ..schemas import CONVERSATION_ID_PATTERN
from ..views import run_problem
from .errors import OpenAIError, bad_request, openai_status
from .items import Parsed, calls_by_item, items_of, parse_item_id
from .mcp_items import ItemView


async def response_service(svc: ServicesDep) -> ResponseService:
    return ResponseService(svc.stores, svc.runs, svc.conversations)


ResponsesDep = Annotated[ResponseService, Depends(response_service)]
log = logging.getLogger(__name__)

_CONVERSATION_ID = re.compile(CONVERSATION_ID_PATTERN)


def conversation_id_of(value: str) -> str:
    """``value`` as a conversation id. One that no conversation can have (outside the native
    ids' grammar: a NUL, a space, more than 128 characters) is not found, without a query: a
    PostgreSQL text parameter cannot even hold a NUL."""
    if not _CONVERSATION_ID.fullmatch(value):
        raise conversation_not_found(value)
    return value


def _conversation_path(conversation_id: str) -> str:
    return conversation_id_of(conversation_id)


#: a ``{conversation_id}`` path parameter of ``/v1``, checked by :func:`conversation_id_of`
ConversationIdPath = Annotated[str, Depends(_conversation_path)]


async def run_to_end(
    svc: Services,
    tenant: str,
    conversation_id: str,
    request: RunRequest,
    param: str = "items",
    **options: Any,
) -> FinishedRun:
    """Start a native run that only appends ``request.append`` (refusals raise) and wait for
    its outcome. A run that stored nothing (its messages would pass the stored-context limits,
    the database went away) raises: the items were not added, and the answer must not say
    they were."""
    started = await svc.runs.start(tenant, conversation_id, request, if_match=None, **options)
    if not isinstance(started, ActiveRun):  # a replay, a queued run: /v1 asks for neither
        raise OpenAIError("The run could not be started.", status=500)
    finished = await svc.runs.wait(started, on_disconnect="continue", disconnected=None)
    if not finished.outcome.stored:
        problem = run_problem(finished.result.error, finished.outcome.status)
        slug = problem.type.rsplit("/", 1)[-1] if problem is not None else "run-internal-error"
        detail = problem.detail if problem is not None else "the run stored nothing"
        raise OpenAIError(
            f"The items were not added: {detail}",
            status=openai_status(PROBLEM_TYPES[slug].status),
            param=param,
            code=slug.replace("-", "_"),
        )
    return finished


async def discard_conversation(svc: Services, tenant: str, conversation_id: str) -> None:
    """Delete a conversation made for a request that was then refused; what made the refusal
    is what the client hears, so a failure here is only logged (the conversation stays)."""
    try:
        await svc.conversations.delete(tenant, conversation_id)
    except Exception:
        log.warning("a conversation made for a refused request was kept: %s", conversation_id)


def no_pending_calls(call_id: str) -> str | None:
    """No call is pending (a new conversation)."""
    return None


async def pending_names(
    svc: Services, tenant: str, conversation_id: str | None
) -> Callable[[str], str | None]:
    """The tool a ``function_call_output`` answers, among the conversation's pending calls
    (one read of the conversation's row; none without a conversation)."""
    if conversation_id is None:
        return no_pending_calls
    conv = await svc.stores.conversations.get_conversation(tenant, conversation_id)
    if conv is None:
        raise conversation_not_found(conversation_id)
    names = {c["id"]: c["name"] for c in conv.pending_calls or ()}
    return names.get


def added_items(finished: FinishedRun, messages: Sequence[AnyMessage]) -> list[dict[str, Any]]:
    """The items a run that only added ``messages`` stored, with their ids."""
    run_id = finished.run.run_id
    view = ItemView.of(messages)
    return [item for i, m in enumerate(messages) for item in items_of(m, run_id, i, view)]


#: messages read on either side of a page of items, for the results and calls of the server
#: calls on it (a call and its result are next to each other: the same run, or the next)
NEIGHBOURS = 64


async def item_view(
    svc: Services,
    responses: ResponseService,
    tenant: str,
    conversation_id: str,
    page: Sequence[StoredMessage],
) -> ItemView:
    """What rendering a page of the conversation's messages needs of the others: the results
    of its server calls and the calls of its server results (read beside the page when they
    are not on it), and the calls still awaiting approval."""
    messages = [s.message for s in page if not s.failed]
    known = ItemView.of(messages)
    calls = {
        c.id: s.seq
        for s in page
        if isinstance(s.message, AssistantMessage) and not s.failed
        for c in s.message.tool_calls
        if c.server_label is not None
    }
    unresolved = [seq for call_id, seq in calls.items() if call_id not in known.results]
    orphans = [
        s.seq
        for s in page
        if isinstance(s.message, ToolResultMessage)
        and s.kind == "tool_result"
        and s.message.tool_call_id not in calls
    ]
    extra: list[AnyMessage] = []
    if unresolved:
        after = await responses.messages(
            tenant,
            conversation_id,
            from_seq=min(unresolved) + 1,
            descending=False,
            limit=NEIGHBOURS,
        )
        extra += [s.message for s in after if not s.failed]
    if orphans:
        before = await responses.messages(
            tenant,
            conversation_id,
            from_seq=max(orphans) - 1,
            descending=True,
            limit=NEIGHBOURS,
        )
        extra += [s.message for s in before if not s.failed]
    conv = await svc.stores.conversations.get_conversation(tenant, conversation_id)
    pending = frozenset(
        c.id
        for c in pending_blocks(conv.pending_calls if conv is not None else None)
        if c.server_label is not None
    )
    return ItemView.of([*extra, *messages], pending)


async def find_item(
    svc: Services,
    responses: ResponseService,
    tenant: str,
    conversation_id: str,
    item_id: str,
) -> dict[str, Any] | None:
    """A stored item of the conversation by its id (None: no such item)."""
    key = parse_item_id(item_id)
    if key is None or item_id in await responses.deleted_items(tenant, conversation_id):
        return None
    found: StoredMessage | None = None
    for stored in await responses.run_messages(tenant, conversation_id, key.run_id):
        if stored.index == key.index and not stored.failed:
            found = stored
    if found is None:
        return None
    view = await item_view(svc, responses, tenant, conversation_id, [found])
    items = items_of(found.message, found.run_id, found.index, view)
    return items[key.k] if key.k < len(items) and items[key.k]["id"] == item_id else None


async def resolve_references(
    svc: Services,
    responses: ResponseService,
    tenant: str,
    conversation_id: str | None,
    items: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """``input`` with each ``item_reference`` replaced by the stored item it names."""
    resolved = []
    for i, item in enumerate(items):
        if isinstance(item, dict) and item.get("type") == "item_reference":
            ref = item.get("id")
            found = None
            if isinstance(ref, str) and conversation_id is not None:
                found = await find_item(svc, responses, tenant, conversation_id, ref)
            if found is None:
                raise bad_request(f"Item with id '{ref}' not found.", f"input[{i}].id")
            item = found
        resolved.append(item)
    return resolved


async def resolve_approvals(
    svc: Services,
    responses: ResponseService,
    tenant: str,
    conversation_id: str | None,
    parsed: Parsed,
) -> tuple[tuple[Approval, ...], list[dict[str, Any]]]:
    """The ``mcp_approval_response`` items of ``input`` as the run's approvals, each with the
    call it answers (kept with the run: its output shows the call's ``mcp_call`` item). The
    request id names an ``mcp_approval_request`` item of the input (a client that keeps the
    history), one this surface gave (``mcpr_…``), or a pending call's id; else 400."""
    if not parsed.approvals:
        return (), []
    calls: dict[str, ToolCallBlock] = {}
    for message in parsed.messages:
        if isinstance(message, AssistantMessage):
            calls.update((c.id, c) for c in message.tool_calls if c.server_label is not None)
    stored: dict[str, ToolCallBlock] = {}
    if conversation_id is not None:
        conv = await svc.stores.conversations.get_conversation(tenant, conversation_id)
        if conv is None:
            raise conversation_not_found(conversation_id)
        stored = {c.id: c for c in pending_blocks(conv.pending_calls)}
    approvals: list[Approval] = []
    kept: list[dict[str, Any]] = []
    for decision in parsed.approvals:
        request_id = decision.approval_request_id
        call = calls.get(request_id) or stored.get(request_id)
        key = parse_item_id(request_id)
        if call is None and key is not None and conversation_id is not None:
            for found in await responses.run_messages(tenant, conversation_id, key.run_id):
                if found.index == key.index and isinstance(found.message, AssistantMessage):
                    block = calls_by_item(found.message, key.run_id, key.index).get(request_id)
                    call = stored.get(block.id) if block is not None else None
        if call is None:
            raise bad_request(
                f"No pending approval request found with id '{request_id}'.",
                f"{decision.where}.approval_request_id",
            )
        approvals.append(
            Approval(tool_call_id=call.id, approve=decision.approve, reason=decision.reason)
        )
        kept.append({"approval_request_id": request_id, "call": call.model_dump(mode="json")})
    return tuple(approvals), kept


__all__ = [
    "ResponsesDep",
    "added_items",
    "find_item",
    "item_view",
    "no_pending_calls",
    "pending_names",
    "resolve_approvals",
    "resolve_references",
    "response_service",
    "run_to_end",
]
