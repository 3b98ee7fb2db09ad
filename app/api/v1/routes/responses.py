"""``/v1/responses``: OpenAI's Responses API as native runs. A response is a run (its id is
``resp_`` + the run id), on the conversation the request names, the one its
``previous_response_id`` continues, or a new one; ``store: false`` runs the agent on the input
alone and stores nothing (docs/openai.md)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from app.agent.messages import AnyMessage, Context, ToolResultMessage, UserMessage
from app.agent.pending import ClientTool
from app.agent.records import Result
from app.agent.replay import ReplayError, validate_messages
from app.errors import CarryoverError
from app.etag import parse_condition
from app.service import pending
from app.service.events import event_payload
from app.service.live import ReaderBehind
from app.service.responses import ResponseNotFound, ResponseService
from app.service.runs import ActiveRun, FinishedRun, RunRequest
from app.store.records import RunRecord
from app.store.tables import Run

from ...deps import Services, ServicesDep, TenantDep
from ...sse import keepalive
from ..deps import ResponsesDep, pending_names, resolve_references
from ..errors import OpenAIError, bad_request, openai_error
from ..items import messages_of
from ..schemas import ResponseCreate
from ..stream import EventTranslator, sse
from ..views import list_object, response_object, run_id_of, split, timestamp

router = APIRouter()


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


def _view(record: RunRecord | FinishedRun, body: ResponseCreate | None = None) -> dict[str, Any]:
    status: str
    if isinstance(record, FinishedRun):
        run, messages = record.run, record.result.new_messages
        status, usage = record.outcome.status, record.result.usage.model_dump()
        failure = record.result.error
        error = {"detail": failure.message} if failure is not None else None
    else:
        run, messages = record.run, record.new_messages
        status, usage, error = run.status, run.usage, run.error
    return response_object(
        run_id=run.run_id,
        status=status,
        created_at=timestamp(run.created_at),
        model=run.agent,
        output=split(messages, run.run_id).output,
        usage=usage,
        error=error,
        conversation_id=run.conversation_id,
        instructions=body.instructions if body else None,
        tools=[t.model_dump(exclude_none=True) for t in body.tools] if body else (),
        metadata=body.metadata if body else None,
        previous_response_id=body.previous_response_id if body else None,
    )


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


def _split_stateless(
    messages: list[AnyMessage],
) -> tuple[tuple[AnyMessage, ...], tuple[ToolResultMessage, ...], tuple[UserMessage, ...]]:
    """A whole history: what came before, the results that answer its last calls, the new user
    messages at its end."""
    end = len(messages)
    while end and isinstance(messages[end - 1], UserMessage):
        end -= 1
    cut = end
    while cut and isinstance(messages[cut - 1], ToolResultMessage):
        cut -= 1
    prompts = tuple(m for m in messages[end:] if isinstance(m, UserMessage))
    results = tuple(m for m in messages[cut:end] if isinstance(m, ToolResultMessage))
    return tuple(messages[:cut]), results, prompts


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
    if body.background:
        raise bad_request("background responses are not supported yet.", "background")
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

    items = (
        [{"type": "message", "role": "user", "content": body.input}]
        if isinstance(body.input, str)
        else body.input
    )
    history: Context | None = None  # previous_response_id: the conversation it continues
    if body.previous_response_id is not None:
        previous = await _previous(svc, responses, tenant, body.previous_response_id)
        conversation_id = previous.conversation_id
        if not body.store:
            loaded = await svc.conversations.get_context(tenant, conversation_id)
            history = getattr(loaded, "context", None)
    info = (
        await svc.conversations.get(tenant, conversation_id)
        if conversation_id is not None
        else None
    )
    items = await resolve_references(responses, tenant, conversation_id, items)
    parsed = messages_of(items, pending_names(info))
    instructions = (
        "\n\n".join(
            [*([body.instructions] if body.instructions is not None else []), *parsed.system]
        )
        if body.instructions is not None or parsed.system
        else None
    )
    tools = tuple(
        ClientTool(
            name=t.name,
            description=t.description or "",
            parameters=t.parameters or {"type": "object", "properties": {}},
        )
        for t in body.tools
    )

    if not body.store:
        return await _unstored(
            svc, responses, tenant, body, parsed.messages, history, tools, instructions
        )

    results, prompts = _split_stored(parsed.messages)
    run_request = RunRequest(
        prompts=prompts,
        agent=body.model,
        client_tools=tools,
        tool_results=results,
        instructions=instructions,
    )
    if conversation_id is None:  # a new conversation, listed natively
        info = await svc.conversations.create(tenant, metadata=body.metadata)
        conversation_id = info.conversation.id
    if_match = None
    if body.previous_response_id is not None:
        if_match = parse_condition(previous.result_etag, "If-Match")
    started = await svc.runs.start(
        tenant, conversation_id, run_request, if_match=if_match, stream=body.stream
    )
    if not isinstance(started, ActiveRun):
        raise OpenAIError("The run could not be started.", status=500)
    if body.stream:
        return _streaming(svc, _stored_events(svc, started, body))
    finished = await svc.runs.wait(
        started, on_disconnect="continue", disconnected=request.is_disconnected
    )
    return JSONResponse(_view(finished, body))


async def _previous(svc: Services, responses: ResponseService, tenant: str, value: str) -> Run:
    """The run ``previous_response_id`` names, at the head of its conversation."""
    try:
        run = await _run_of(responses, tenant, value)
    except OpenAIError:
        raise bad_request(
            f"Previous response with id '{value}' not found.", "previous_response_id"
        ) from None
    info = await svc.conversations.get(tenant, run.conversation_id)
    if not run.stored or run.result_etag != info.conversation.etag:
        raise bad_request(
            f"Previous response '{value}' is not the latest response of its conversation: "
            "continuing from an older response (a fork) is not supported yet.",
            "previous_response_id",
        )
    return run


def _streaming(svc: Services, events: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(
        keepalive(events, svc.settings.stream_keepalive_seconds),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


def _skeleton(
    run_id: str, body: ResponseCreate, conversation_id: str | None, created: int
) -> dict[str, Any]:
    return response_object(
        run_id=run_id,
        status="running",
        created_at=created,
        model=body.model,
        output=[],
        usage=None,
        conversation_id=conversation_id,
        store=body.store,
        instructions=body.instructions,
        tools=[t.model_dump(exclude_none=True) for t in body.tools],
        metadata=body.metadata,
        previous_response_id=body.previous_response_id,
    )


def _error_event(exc: Exception, seq: int) -> bytes:
    refusal = exc if isinstance(exc, CarryoverError) else OpenAIError("The server had an error.")
    if not isinstance(exc, CarryoverError):
        refusal.status = 500
    _, payload, _ = openai_error(refusal)
    return sse({"type": "error", "sequence_number": seq, **payload["error"]})


async def _stored_events(
    svc: Services, active: ActiveRun, body: ResponseCreate
) -> AsyncIterator[bytes]:
    assert active.events is not None
    run = active.started.run
    created = timestamp(run.created_at) if run is not None else 0
    translator = EventTranslator(
        active.run_id, _skeleton(active.run_id, body, active.conversation_id, created)
    )
    for event in translator.start():
        yield sse(event)
    try:
        while True:
            try:
                native = await active.events.get()
            except ReaderBehind:  # the run goes on; this stream cannot keep up
                yield _error_event(
                    OpenAIError("The stream fell behind the run.", status=500), translator.seq
                )
                return
            if native is None:
                break
            for event in translator.on(native.event, native.data):
                yield sse(event)
        try:
            finished = await asyncio.shield(active.done)
        except Exception as exc:
            yield _error_event(exc, translator.seq)
            return
        for event in translator.finish(_view(finished, body)):
            yield sse(event)
    except asyncio.CancelledError:
        raise  # the run goes on (on_disconnect: continue), as natively


async def _unstored(
    svc: Services,
    responses: ResponseService,
    tenant: str,
    body: ResponseCreate,
    messages: list[AnyMessage],
    history: Context | None,
    tools: tuple[ClientTool, ...],
    instructions: str | None,
) -> Response:
    """``store: false``: the agent on the input (after the context ``previous_response_id``
    continues), nothing stored."""
    before, results, prompts = _split_stateless(messages)
    base = history or Context()
    context = base.model_copy(update={"messages": (*base.messages, *before)})
    try:
        validate_messages(context.messages, allow_open_batch=True)
    except ReplayError as exc:
        raise bad_request(f"Invalid input: {exc.reason}", "input") from None
    run_id = str(uuid.uuid4())
    run_request = RunRequest(
        prompts=prompts,
        agent=body.model,
        client_tools=tools,
        tool_results=results,
        instructions=instructions,
    )
    created = int(svc.runs.clock.now().timestamp())

    def view(result: Result) -> dict[str, Any]:
        return response_object(
            run_id=run_id,
            status=result.status,
            created_at=created,
            model=body.model,
            output=split(result.new_messages, run_id).output,
            usage=result.usage.model_dump(),
            error={"detail": result.error.message} if result.error else None,
            store=False,
            instructions=body.instructions,
            tools=[t.model_dump(exclude_none=True) for t in body.tools],
            metadata=body.metadata,
            previous_response_id=body.previous_response_id,
        )

    if not body.stream:
        result = await responses.run_unstored(tenant, run_id, run_request, context)
        return JSONResponse(view(result))

    queue: asyncio.Queue[tuple[str, Any] | None] = asyncio.Queue()

    async def on_event(event: Any) -> None:
        found = event_payload(event)
        if found is not None:
            queue.put_nowait(found)

    # refusals (an unanswered call, bad tools) are answered before the stream starts
    result_task: asyncio.Task[Result] | None = None
    pending.checker(svc.agents.get(body.model), run_request)(context)
    result_task = asyncio.ensure_future(
        responses.run_unstored(tenant, run_id, run_request, context, on_event)
    )
    result_task.add_done_callback(lambda _: queue.put_nowait(None))

    async def events() -> AsyncIterator[bytes]:
        assert result_task is not None
        translator = EventTranslator(run_id, _skeleton(run_id, body, None, created))
        for event in translator.start():
            yield sse(event)
        try:
            while (native := await queue.get()) is not None:
                for event in translator.on(*native):
                    yield sse(event)
            try:
                result = result_task.result()
            except Exception as exc:
                yield _error_event(exc, translator.seq)
                return
            for event in translator.finish(view(result)):
                yield sse(event)
        finally:
            if not result_task.done():
                result_task.cancel()

    return _streaming(svc, events())


@router.get("/responses/{response_id}", operation_id="retrieve_response")
async def retrieve_response(
    responses: ResponsesDep,
    tenant: TenantDep,
    response_id: str,
    stream: bool = False,
    starting_after: int | None = None,
    include: Annotated[list[str] | None, Query(alias="include[]")] = None,
) -> JSONResponse:
    """A stored response (a run of either surface)."""
    if stream:
        raise bad_request("Streaming a stored response again is not supported yet.", "stream")
    run = await _run_of(responses, tenant, response_id)
    record = await responses.runs.record(tenant, run.conversation_id, run.run_id)
    return JSONResponse(_view(record))


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
    record = await responses.runs.record(tenant, run.conversation_id, run.run_id)
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
    return JSONResponse(_view(record))


@router.delete("/responses/{response_id}", operation_id="delete_response")
async def delete_response(
    responses: ResponsesDep, tenant: TenantDep, response_id: str
) -> JSONResponse:
    """Not implemented yet: a run record is part of the conversation's audit (docs/openai.md)."""
    await _run_of(responses, tenant, response_id)
    raise bad_request(
        "Deleting a stored response is not supported yet; delete its conversation instead.",
        "response_id",
    )
