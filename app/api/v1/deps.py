"""What the ``/v1`` routes share: the response service, runs of the native run manager waited
for, tool names of a conversation's pending calls, and ``item_reference`` resolution."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Annotated, Any

from fastapi import Depends

from app.agent.messages import AnyMessage
from app.service.responses import ResponseService, StoredMessage
from app.service.runs import ActiveRun, FinishedRun, RunRequest
from app.store.errors import conversation_not_found

from ..deps import Services, ServicesDep
from .errors import OpenAIError, bad_request
from .items import items_of, parse_item_id


async def response_service(svc: ServicesDep) -> ResponseService:
    return ResponseService(svc.stores, svc.runs, svc.conversations)


ResponsesDep = Annotated[ResponseService, Depends(response_service)]


async def run_to_end(
    svc: Services, tenant: str, conversation_id: str, request: RunRequest, **options: Any
) -> FinishedRun:
    """Start a native run (refusals raise) and wait for its outcome."""
    started = await svc.runs.start(tenant, conversation_id, request, if_match=None, **options)
    if not isinstance(started, ActiveRun):  # a replay, a queued run: /v1 asks for neither
        raise OpenAIError("The run could not be started.", status=500)
    return await svc.runs.wait(started, on_disconnect="continue", disconnected=None)


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
    return [item for i, m in enumerate(messages) for item in items_of(m, run_id, i)]


async def find_item(
    responses: ResponseService, tenant: str, conversation_id: str, item_id: str
) -> dict[str, Any] | None:
    """A stored item of the conversation by its id (None: no such item)."""
    key = parse_item_id(item_id)
    if key is None:
        return None
    found: StoredMessage | None = None
    for stored in await responses.run_messages(tenant, conversation_id, key.run_id):
        if stored.index == key.index and not stored.failed:
            found = stored
    if found is None:
        return None
    items = items_of(found.message, found.run_id, found.index)
    return items[key.k] if key.k < len(items) and items[key.k]["id"] == item_id else None


async def resolve_references(
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
                found = await find_item(responses, tenant, conversation_id, ref)
            if found is None:
                raise bad_request(f"Item with id '{ref}' not found.", f"input[{i}].id")
            item = found
        resolved.append(item)
    return resolved


__all__ = [
    "ResponsesDep",
    "added_items",
    "find_item",
    "no_pending_calls",
    "pending_names",
    "resolve_references",
    "response_service",
    "run_to_end",
]
