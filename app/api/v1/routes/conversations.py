"""``/v1/models`` and ``/v1/conversations`` (with their items): OpenAI's Conversations API over
the native conversations. A conversation here is the native conversation of the same id; its
items are its transcript's messages (docs/openai.md)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from app.agent.messages import Context
from app.etag import parse_condition
from app.service import pending
from app.service.errors import UnreplayableContext
from app.service.responses import ResponseService, StoredMessage
from app.service.runs import RunRequest
from app.store.stores import Loaded

from ...deps import ServicesDep, TenantDep
from ...limits import check_messages, check_text
from ...metadata import check_metadata
from ..deletion import deletion_plan
from ..deps import (
    ConversationIdPath,
    ResponsesDep,
    added_items,
    discard_conversation,
    find_item,
    item_view,
    no_pending_calls,
    pending_names,
    run_to_end,
)
from ..errors import OpenAIError, bad_request
from ..items import items_of, messages_of, parse_item_id
from ..schemas import ConversationCreate, ConversationUpdate, ItemsCreate
from ..views import conversation_object, list_object

router = APIRouter()


def _not_found(kind: str, value: str) -> OpenAIError:
    return OpenAIError(f"{kind} with id '{value}' not found.", status=404)


@router.get("/models", operation_id="list_models")
async def list_models(svc: ServicesDep, tenant: TenantDep) -> JSONResponse:
    """One model per agent profile."""
    data = [_model(name) for name in svc.agents.names]
    return JSONResponse(list_object(data, has_more=False, first_last=False))


@router.get("/models/{model}", operation_id="retrieve_model")
async def retrieve_model(svc: ServicesDep, tenant: TenantDep, model: str) -> JSONResponse:
    if model not in svc.agents.names:
        raise OpenAIError(
            f"The model '{model}' does not exist", status=404, param="model", code="model_not_found"
        )
    return JSONResponse(_model(model))


def _model(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "carryover"}


@router.post("/conversations", operation_id="create_conversation")
async def create_conversation(
    svc: ServicesDep, tenant: TenantDep, body: ConversationCreate | None = None
) -> JSONResponse:
    """A new conversation, with up to 20 items (stored as a run that calls no model)."""
    body = body or ConversationCreate()
    if body.metadata:
        check_metadata(svc.settings, body.metadata, "metadata")
    parsed = messages_of(body.items or [], no_pending_calls, "items")
    # refused before anything is created
    pending.check_append(Context(), parsed.messages)
    check_messages(svc.settings, parsed.messages, "items")
    system_prompt = "\n\n".join(parsed.system)
    check_text(svc.settings, system_prompt, "items")  # the stored one's limit, as natively
    info = await svc.conversations.create(
        tenant, system_prompt=system_prompt, metadata=body.metadata
    )
    if parsed.messages:
        append = RunRequest(prompts=(), append=tuple(parsed.messages))
        try:
            await run_to_end(svc, tenant, info.conversation.id, append)
        except BaseException:  # the items were not stored: neither is the conversation
            await asyncio.shield(discard_conversation(svc, tenant, info.conversation.id))
            raise
    return JSONResponse(conversation_object(info))


@router.get("/conversations/{conversation_id}", operation_id="retrieve_conversation")
async def retrieve_conversation(
    svc: ServicesDep, tenant: TenantDep, conversation_id: ConversationIdPath
) -> JSONResponse:
    return JSONResponse(conversation_object(await svc.conversations.get(tenant, conversation_id)))


@router.post("/conversations/{conversation_id}", operation_id="update_conversation")
async def update_conversation(
    svc: ServicesDep,
    tenant: TenantDep,
    conversation_id: ConversationIdPath,
    body: ConversationUpdate,
) -> JSONResponse:
    """Replace the conversation's metadata."""
    info = await svc.conversations.get(tenant, conversation_id)
    patch: dict[str, str | None] = {k: None for k in info.metadata if k not in body.metadata}
    patch.update(body.metadata)
    check_metadata(svc.settings, body.metadata, "metadata")
    await svc.conversations.patch(
        tenant, conversation_id, patch, max_keys=svc.settings.max_metadata_keys
    )
    return JSONResponse(conversation_object(await svc.conversations.get(tenant, conversation_id)))


@router.delete("/conversations/{conversation_id}", operation_id="delete_conversation")
async def delete_conversation(
    svc: ServicesDep, tenant: TenantDep, conversation_id: ConversationIdPath
) -> JSONResponse:
    await svc.conversations.delete(tenant, conversation_id)
    return JSONResponse({"id": conversation_id, "object": "conversation.deleted", "deleted": True})


@router.get("/conversations/{conversation_id}/items", operation_id="list_items")
async def list_items(
    svc: ServicesDep,
    responses: ResponsesDep,
    tenant: TenantDep,
    conversation_id: ConversationIdPath,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
    after: str | None = None,
    include: Annotated[list[str] | None, Query(alias="include[]")] = None,
) -> JSONResponse:
    """The conversation's items, newest first unless ``order=asc``; ``after`` an item id."""
    descending = order == "desc"
    key = parse_item_id(after) if after is not None else None
    from_seq: int | None = None
    if after is not None:
        found = None
        if key is not None:
            runs = await responses.run_messages(tenant, conversation_id, key.run_id)
            found = next((m for m in runs if m.index == key.index), None)
        if found is None:
            raise bad_request(f"Item with id '{after}' not found.", "after")
        from_seq = found.seq
    deleted = await responses.deleted_items(tenant, conversation_id)
    data: list[dict[str, Any]] = []
    while len(data) <= limit:
        page = await responses.messages(
            tenant, conversation_id, from_seq=from_seq, descending=descending, limit=limit + 2
        )
        view = await item_view(svc, responses, tenant, conversation_id, page)
        for stored in page:
            if stored.failed:
                continue
            items = items_of(stored.message, stored.run_id, stored.index, view)
            if key is not None and (stored.run_id, stored.index) == (key.run_id, key.index):
                items = items[key.k + 1 :] if not descending else items[: key.k]
            items = [item for item in items if item["id"] not in deleted]
            data.extend(reversed(items) if descending else items)
        if len(page) < limit + 2:
            break
        from_seq = page[-1].seq + (-1 if descending else 1)
    return JSONResponse(list_object(data[:limit], has_more=len(data) > limit))


@router.post("/conversations/{conversation_id}/items", operation_id="create_items")
async def create_items(
    svc: ServicesDep, tenant: TenantDep, conversation_id: ConversationIdPath, body: ItemsCreate
) -> JSONResponse:
    """Add up to 20 items without a response, under the one-run-at-a-time rule; an item that
    would break the pairing of calls and outputs is refused (400)."""
    names = await pending_names(svc, tenant, conversation_id)  # 404 for no conversation
    parsed = messages_of(body.items, names, "items")
    if parsed.system:
        raise bad_request(
            "system and developer items are not stored: give them as `instructions` of a "
            "response (or as the conversation's system prompt, natively).",
            "items",
        )
    if not parsed.messages:
        return JSONResponse(list_object([], has_more=False))
    check_messages(svc.settings, parsed.messages, "items")
    finished = await run_to_end(
        svc, tenant, conversation_id, RunRequest(prompts=(), append=tuple(parsed.messages))
    )
    return JSONResponse(list_object(added_items(finished, parsed.messages), has_more=False))


@router.get("/conversations/{conversation_id}/items/{item_id}", operation_id="retrieve_item")
async def retrieve_item(
    svc: ServicesDep,
    responses: ResponsesDep,
    tenant: TenantDep,
    conversation_id: ConversationIdPath,
    item_id: str,
) -> JSONResponse:
    found = await find_item(svc, responses, tenant, conversation_id, item_id)
    if found is None:
        raise _not_found("Item", item_id)
    return JSONResponse(found)


@router.delete("/conversations/{conversation_id}/items/{item_id}", operation_id="delete_item")
async def delete_item(
    svc: ServicesDep,
    responses: ResponsesDep,
    tenant: TenantDep,
    conversation_id: ConversationIdPath,
    item_id: str,
) -> JSONResponse:
    """Delete an item: the context gets a new version without it (a ``function_call`` and its
    ``function_call_output`` go together), the transcript keeps it and appends an
    ``item_deleted`` entry. 400 when its message is no longer in the context (folded into the
    summary, or the context replaced since) or it is one of several items of an assistant
    message and not a ``function_call``; 409 while a run holds the conversation."""
    found = await find_item(svc, responses, tenant, conversation_id, item_id)
    if found is None:
        raise _not_found("Item", item_id)
    loaded = await svc.conversations.get_context(tenant, conversation_id)
    assert isinstance(loaded, Loaded)  # no If-None-Match: never NotModified
    deleted = await responses.deleted_items(tenant, conversation_id)
    stored = await _transcript_messages(responses, tenant, conversation_id)
    plan = deletion_plan(item_id, found, stored, deleted, loaded.context)
    try:
        await svc.conversations.put_context(
            tenant,
            conversation_id,
            plan.context,
            if_match=parse_condition(loaded.etag),
            if_none_match=None,
            deleted=plan.item_ids,
        )
    except UnreplayableContext as exc:
        raise bad_request(
            f"Item with id '{item_id}' cannot be deleted: the context would no longer be "
            f"replayable ({exc.detail}).",
            "item_id",
        ) from None
    return JSONResponse(conversation_object(await svc.conversations.get(tenant, conversation_id)))


async def _transcript_messages(
    responses: ResponseService, tenant: str, conversation_id: str
) -> list[StoredMessage]:
    """All the transcript's messages (failed attempts left out), oldest first."""
    found: list[StoredMessage] = []
    from_seq: int | None = None
    while True:
        page = await responses.messages(
            tenant, conversation_id, from_seq=from_seq, descending=False, limit=_PAGE
        )
        found.extend(s for s in page if not s.failed)
        if len(page) < _PAGE:
            return found
        from_seq = page[-1].seq + 1


_PAGE = 500
