"""``/v1/responses``: OpenAI's Responses API as native runs. A response is a run (its id is
``resp_`` + the run id), on the conversation the request names, the one its
``previous_response_id`` continues, or a new one; ``store: false`` runs the agent on the input
alone and stores nothing (docs/openai.md)."""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response

from app.agent.messages import AnyMessage, Context, ToolResultMessage, UserMessage
from app.etag import parse_condition
from app.service import pending
from app.service.responses import ForkUnavailable, ResponseNotFound, ResponseService
from app.service.runs import ActiveRun, RunRequest
from app.store.tables import Run

from ...deps import Services, ServicesDep, TenantDep
from ...lean import LeanRoute
from ...limits import check_messages, check_text
from ...metadata import check_metadata
from .. import answers
from .. import request as request_
from ..deps import (
    ResponsesDep,
    conversation_id_of,
    discard_conversation,
    pending_names,
    resolve_approvals,
    resolve_references,
    run_to_end,
)
from ..errors import OpenAIError, bad_request
from ..items import messages_of
from ..schemas import ResponseCreate
from ..views import list_object, run_id_of, split

log = logging.getLogger(__name__)
router = APIRouter(route_class=LeanRoute)


def _not_found(value: str) -> OpenAIError:
    return OpenAIError(f"Response with id '{value}' not found.", status=404)


async def _run_of(responses: ResponseService, tenant: str, value: str) -> Run:
    run_id = run_id_of(value)
    if run_id is None:
        raise _not_found(value)
    try:
        return await responses.find(tenant, run_id)
    except ResponseNotFound:
        raise _not_found(value) from None


def _split_stored(
    messages: list[AnyMessage],
) -> tuple[tuple[ToolResultMessage, ...], tuple[UserMessage, ...]]:
    """A stored conversation's new input: results for its pending calls, then user messages."""
    results: list[ToolResultMessage] = []
    prompts: list[UserMessage] = []
    for i, message in enumerate(messages):
        if isinstance(message, ToolResultMessage) and not prompts:
            results.append(message)
        elif isinstance(message, UserMessage):
            prompts.append(message)
        else:
            raise bad_request(
                "With a stored conversation, `input` holds the new items only: user messages "
                "and function_call_output items for its pending calls (the rest is stored).",
                f"input[{i}]",
            )
    return tuple(results), tuple(prompts)


@router.post("/responses", operation_id="create_response")
async def create_response(
    request: Request,
    svc: ServicesDep,
    responses: ResponsesDep,
    tenant: TenantDep,
    body: ResponseCreate,
) -> Response:
    """A response: a run of the agent profile ``model`` on the input."""
    if body.model not in svc.agents.names:
        raise bad_request(f"The model '{body.model}' does not exist", "model", "model_not_found")
    if body.background and not body.store:
        raise bad_request("`background: true` needs `store: true`.", "background")
    if body.metadata:  # a new conversation's metadata; kept with the response in any case
        check_metadata(svc.settings, body.metadata, "metadata")
    conversation = body.conversation
    conversation_id = conversation.get("id") if isinstance(conversation, dict) else conversation
    if conversation_id is not None and body.previous_response_id is not None:
        raise bad_request(
            "Provide either `conversation` or `previous_response_id`, not both.",
            "previous_response_id",
        )
    if conversation_id is not None and not body.store:
        raise bad_request("`store: false` cannot be used with `conversation`.", "store")
    if conversation_id is not None and not isinstance(conversation_id, str):
        raise bad_request("Invalid value for 'conversation.id'.", "conversation")
    if conversation_id is not None:
        conversation_id = conversation_id_of(conversation_id)

    items = (
        [{"type": "message", "role": "user", "content": body.input}]
        if isinstance(body.input, str)
        else body.input
    )
    history: Context | None = None  # previous_response_id: the conversation it continues
    previous: Run | None = None  # at the head of its conversation: continued
    made: str | None = None  # a conversation made for this response (a fork), until its run starts
    if body.previous_response_id is not None:
        run, at_head = await _previous(svc, responses, tenant, body.previous_response_id)
        try:
            if not body.store:  # continued from, nothing stored
                history = await responses.context_at(tenant, run, latest=at_head)
            elif at_head:
                previous, conversation_id = run, run.conversation_id
            else:  # an older response: a new conversation forked at the version it stored
                conversation_id = (await responses.fork_at(tenant, run)).conversation.id
                made = conversation_id
        except ForkUnavailable as exc:  # its version is past the retention: expired
            raise bad_request(exc.detail, "previous_response_id") from None
    try:
        items = await resolve_references(svc, responses, tenant, conversation_id, items)
        answers_calls = any(
            isinstance(i, dict) and i.get("type") == "function_call_output" for i in items
        )
        names = await pending_names(svc, tenant, conversation_id if answers_calls else None)
        parsed = messages_of(items, names)
        check_messages(svc.settings, parsed.messages, "input")  # refused before anything is made
        instructions = (
            "\n\n".join(
                [*([body.instructions] if body.instructions is not None else []), *parsed.system]
            )
            if body.instructions is not None or parsed.system
            else None
        )
        if instructions is not None:  # this response's system prompt: a system prompt's limit
            check_text(svc.settings, instructions, "instructions")
        tools = request_.run_tools(body, svc.settings)
        approvals, approved = await resolve_approvals(
            svc, responses, tenant, conversation_id, parsed
        )
        body.approved.extend(approved)

        if not body.store:
            return await answers.unstored(
                svc,
                responses,
                tenant,
                body,
                parsed.messages,
                history,
                tools,
                instructions,
                approvals,
            )

        history_items: tuple[AnyMessage, ...] = ()
        if conversation_id is None:  # a new conversation: the input is its whole history
            history_items, results, prompts = answers.split_stateless(parsed.messages)
            pending.check_append(Context(), history_items)  # refused before anything is created
        else:
            results, prompts = _split_stored(parsed.messages)
        run_request = tools.request(
            prompts=prompts,
            agent=body.model,
            tool_results=results,
            approvals=approvals,
            instructions=instructions,
            settings=request_.run_settings(body),
            response=request_.kept_fields(body),
        )
        if conversation_id is None:  # a new conversation, listed natively
            info = await svc.conversations.create(tenant, metadata=body.metadata)
            conversation_id = made = info.conversation.id
            if history_items:  # stored first, as items added without a response
                append = RunRequest(prompts=(), append=history_items)
                await run_to_end(svc, tenant, conversation_id, append, param="input")
        if_match = None
        if previous is not None:  # still at the head when the run starts, or 409
            if_match = parse_condition(previous.result_etag, "If-Match")
        if body.background:  # a native background run: queued behind a busy conversation
            return await answers.background(
                svc, tenant, conversation_id, run_request, if_match, body
            )
        started = await svc.runs.start(
            tenant, conversation_id, run_request, if_match=if_match, stream=body.stream
        )
        if not isinstance(started, ActiveRun):
            raise OpenAIError("The run could not be started.", status=500)
    except BaseException:
        # refused (or failed) before its run started: the conversation made for it (a fork of
        # an older response's version, or a new one) is not kept, so a refused request leaves
        # nothing behind
        if made is not None:
            await asyncio.shield(discard_conversation(svc, tenant, made))
        raise
    if body.stream:
        return answers.streaming(svc, answers.live_events(svc, started, body))
    finished = await svc.runs.wait(
        started, on_disconnect="continue", disconnected=request.is_disconnected
    )
    return JSONResponse(answers.response_view(finished, body))


async def _previous(
    svc: Services, responses: ResponseService, tenant: str, value: str
) -> tuple[Run, bool]:
    """The run ``previous_response_id`` names, and whether it is its conversation's latest."""
    try:
        run = await _run_of(responses, tenant, value)
    except OpenAIError:
        run = None
    if run is None or not run.stored or run.result_etag is None:
        raise bad_request(f"Previous response with id '{value}' not found.", "previous_response_id")
    info = await svc.conversations.get(tenant, run.conversation_id)
    return run, run.result_etag == info.conversation.etag


@router.get("/responses/{response_id}", operation_id="retrieve_response")
async def retrieve_response(
    svc: ServicesDep,
    responses: ResponsesDep,
    tenant: TenantDep,
    response_id: str,
    stream: bool = False,
    starting_after: int | None = None,
    include: Annotated[list[str] | None, Query(alias="include[]")] = None,
) -> Response:
    """A stored response (a run of either surface); with ``stream=true`` its events again,
    after ``starting_after``, during and after the run."""
    run = await _run_of(responses, tenant, response_id)
    if stream:
        after = -1 if starting_after is None else starting_after
        return answers.streaming(
            svc, await answers.stored_stream(svc, tenant, run, None, after=after)
        )
    record = await responses.record_of(tenant, run)
    return JSONResponse(answers.response_view(record))


@router.get("/responses/{response_id}/input_items", operation_id="list_input_items")
async def list_input_items(
    responses: ResponsesDep,
    tenant: TenantDep,
    response_id: str,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
    after: str | None = None,
) -> JSONResponse:
    """The items the response took as input (its prompts and function call outputs)."""
    run = await _run_of(responses, tenant, response_id)
    record = await responses.record_of(tenant, run)
    items = split(record.new_messages, run.run_id).input
    if order == "desc":
        items.reverse()
    if after is not None:
        ids = [i["id"] for i in items]
        if after not in ids:
            raise bad_request(f"Item with id '{after}' not found.", "after")
        items = items[ids.index(after) + 1 :]
    return JSONResponse(list_object(items[:limit], has_more=len(items) > limit))


@router.post("/responses/{response_id}/cancel", operation_id="cancel_response")
async def cancel_response(
    svc: ServicesDep, responses: ResponsesDep, tenant: TenantDep, response_id: str
) -> JSONResponse:
    """Ask the run to stop, from any replica (a response that ended: 400)."""
    run = await _run_of(responses, tenant, response_id)
    record = await svc.runs.cancel(tenant, run.conversation_id, run.run_id)
    return JSONResponse(answers.response_view(record))


@router.delete("/responses/{response_id}", operation_id="delete_response")
async def delete_response(
    responses: ResponsesDep, tenant: TenantDep, response_id: str
) -> JSONResponse:
    """Delete a stored response: `/v1` no longer finds it (404; as a `previous_response_id`,
    400). Its conversation is unchanged — its items, its context, and natively the run record
    and the transcript, which are the conversation's audit (docs/openai.md). A response in
    progress: 400 (cancel it first)."""
    run = await _run_of(responses, tenant, response_id)
    if not await responses.delete(tenant, run):
        raise bad_request(
            f"Response '{response_id}' is in progress; cancel it before deleting it.",
            "response_id",
        )
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})
