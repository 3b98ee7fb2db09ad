"""How a ``/v1`` response is answered: its JSON object (from a run that ended, its record, or
an unstored run's result), its stream (live from the run, or from the stored events: background
responses and resumed streams), background starts, and ``store: false`` runs. Used by
:mod:`app.api.v1.routes.responses`; it declares no route."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse, Response, StreamingResponse

from app.agent.messages import AnyMessage, Context, ToolResultMessage, UserMessage
from app.agent.pending import Approval
from app.agent.records import Result
from app.agent.replay import ReplayError, validate_messages
from app.errors import CarryoverError
from app.etag import ETagCondition
from app.service import pending
from app.service.events import EventFeed, event_payload
from app.service.live import ReaderBehind
from app.service.responses import ResponseService
from app.service.runs import ActiveRun, FinishedRun, QueuedRun, RunRequest
from app.store.records import RunRecord
from app.store.tables import Run

from ..deps import Services
from ..sse import keepalive
from .errors import OpenAIError, bad_request, openai_error
from .request import (
    RunTools,
    approved_calls,
    client_names,
    kept_fields,
    output_schema,
    pending_servers,
    run_settings,
    tools_echo,
)
from .schemas import ResponseCreate
from .stream import EventTranslator, sse
from .views import response_object, split, timestamp


def response_view(
    record: RunRecord | FinishedRun, body: ResponseCreate | None = None
) -> dict[str, Any]:
    """A run as a response: its output items, status and usage, and what its request said
    (``body``, or what its run kept of it; nothing for a native run)."""
    status: str
    if isinstance(record, FinishedRun):
        run, messages, final = record.run, record.result.new_messages, record.result.final
        status, usage = record.outcome.status, record.result.usage.model_dump()
        failure = record.result.error
        error = failure.model_dump() if failure is not None else None
        required: Any = record.result.required_action if status == "requires_action" else None
    else:
        run, messages, final = record.run, record.new_messages, record.final
        status, usage, error = run.status, run.usage, run.error
        required = run.required_action
    kept: dict[str, Any] = (
        kept_fields(body) if body is not None else (run.tool_inputs or {}).get("response") or {}
    )
    output = split(messages, run.run_id, pending_servers(required), approved_calls(kept)).output
    return response_object(
        run_id=run.run_id,
        status=status,
        created_at=timestamp(run.created_at),
        model=run.agent,
        output=output,
        usage=usage,
        error=error,
        conversation_id=run.conversation_id,
        instructions=kept.get("instructions"),
        tools=kept.get("tools") or (),
        metadata=kept.get("metadata"),
        previous_response_id=kept.get("previous_response_id"),
        background=bool(kept.get("background", False)),
        settings=kept,
        output_schema=pending.output_schema_of(run),
        final=final,
    )


def split_stateless(
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


async def background(
    svc: Services,
    tenant: str,
    conversation_id: str,
    run_request: RunRequest,
    if_match: ETagCondition | None,
    body: ResponseCreate,
) -> Response:
    """``background: true``: answered at once (``queued`` or ``in_progress``); with ``stream``
    its events follow from storage, as a resumed stream's do."""
    started = await svc.runs.start(
        tenant, conversation_id, run_request, if_match=if_match, respond_async=True
    )
    if isinstance(started, QueuedRun):
        run = started.run
    elif isinstance(started, ActiveRun) and started.started.run is not None:
        run = started.started.run
    else:
        raise OpenAIError("The run could not be started.", status=500)
    if body.stream:
        return streaming(svc, await stored_stream(svc, tenant, run, body, after=-1))
    view = response_view(RunRecord(run, (), None, ()), body)
    return JSONResponse({**view, "background": True})


async def stored_stream(
    svc: Services, tenant: str, run: Run, body: ResponseCreate | None, *, after: int
) -> AsyncIterator[bytes]:
    """A run's stored events (from any replica, during and after the run) as OpenAI's stream,
    the events numbered ``after`` and before left out: the same events, and numbers, as the
    stream of the request that started it."""
    feed = EventFeed(
        svc.stores,
        svc.runs.clock,
        svc.settings.event_retention_seconds,
        svc.settings.event_poll_seconds,
    )
    native = await feed.open(tenant, run.conversation_id, run.run_id, 0)  # 404, 410 here
    created = timestamp(run.created_at)
    model = body.model if body is not None else run.agent
    skeleton = response_object(
        run_id=run.run_id,
        status="queued" if run.status == "queued" else "running",
        created_at=created,
        model=model,
        output=[],
        usage=None,
        conversation_id=run.conversation_id,
        background=body.background if body is not None else False,
    )
    kept = kept_fields(body) if body is not None else (run.tool_inputs or {}).get("response") or {}
    translator = EventTranslator(
        run.run_id,
        skeleton,
        pending.output_schema_of(run),
        client_names=client_names(kept),
        approved=approved_calls(kept),
    )

    async def events() -> AsyncIterator[bytes]:
        produced = translator.start()
        async for event in native:
            if event.event == "run.finished":
                record = await feed.record(tenant, run.conversation_id, run.run_id)
                produced += translator.finish(response_view(record, body))
            else:
                produced += translator.on(event.event, event.data)
            for out in produced:
                if out["sequence_number"] > after:
                    yield sse(out)
            produced = []

    return events()


def streaming(svc: Services, events: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(
        keepalive(events, svc.settings.stream_keepalive_seconds),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


def skeleton(
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
        tools=tools_echo(body),
        metadata=body.metadata,
        previous_response_id=body.previous_response_id,
        settings=kept_fields(body),
    )


def error_event(exc: Exception, seq: int) -> bytes:
    refusal = exc if isinstance(exc, CarryoverError) else OpenAIError("The server had an error.")
    if not isinstance(exc, CarryoverError):
        refusal.status = 500
    _, payload, _ = openai_error(refusal)
    return sse({"type": "error", "sequence_number": seq, **payload["error"]})


async def live_events(
    svc: Services, active: ActiveRun, body: ResponseCreate
) -> AsyncIterator[bytes]:
    assert active.events is not None
    run = active.started.run
    created = timestamp(run.created_at) if run is not None else 0
    schema = output_schema(body)
    translator = EventTranslator(
        active.run_id,
        skeleton(active.run_id, body, active.conversation_id, created),
        schema.schema if schema is not None else None,
        client_names=client_names(kept_fields(body)),
        approved=approved_calls(kept_fields(body)),
    )
    for event in translator.start():
        yield sse(event)
    try:
        while True:
            try:
                native = await active.events.get()
            except ReaderBehind:  # the run goes on; this stream cannot keep up
                yield error_event(
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
            yield error_event(exc, translator.seq)
            return
        for event in translator.finish(response_view(finished, body)):
            yield sse(event)
    except asyncio.CancelledError:
        raise  # the run goes on (on_disconnect: continue), as natively


async def unstored(
    svc: Services,
    responses: ResponseService,
    tenant: str,
    body: ResponseCreate,
    messages: list[AnyMessage],
    history: Context | None,
    tools: RunTools,
    instructions: str | None,
    approvals: tuple[Approval, ...] = (),
) -> Response:
    """``store: false``: the agent on the input (after the context ``previous_response_id``
    continues), nothing stored."""
    before, results, prompts = split_stateless(messages)
    base = history or Context()
    context = base.model_copy(update={"messages": (*base.messages, *before)})
    try:
        validate_messages(context.messages, allow_open_batch=True)
    except ReplayError as exc:
        raise bad_request(f"Invalid input: {exc.reason}", "input") from None
    run_id = str(uuid.uuid4())
    run_request = tools.request(
        prompts=prompts,
        agent=body.model,
        tool_results=results,
        approvals=approvals,
        instructions=instructions,
        settings=run_settings(body),
    )
    created = int(svc.runs.clock.now().timestamp())

    def view(result: Result) -> dict[str, Any]:
        return response_object(
            run_id=run_id,
            status=result.status,
            created_at=created,
            model=body.model,
            output=split(
                result.new_messages,
                run_id,
                pending_servers(result.required_action),
                approved_calls(kept_fields(body)),
            ).output,
            usage=result.usage.model_dump(),
            error=result.error.model_dump() if result.error else None,
            store=False,
            instructions=body.instructions,
            tools=tools_echo(body),
            metadata=body.metadata,
            previous_response_id=body.previous_response_id,
            settings=kept_fields(body),
            output_schema=schema.schema if schema is not None else None,
            final=result.final,
        )

    schema = run_request.settings.output_schema
    # refusals (an unanswered call, bad tools, a server not allowed, a spent quota) are
    # answered before anything runs
    run_request, toolset = await responses.prepare_unstored(run_request, context)
    await responses.admit_unstored(tenant)
    if not body.stream:
        result = await responses.run_unstored(tenant, run_id, run_request, context, toolset=toolset)
        return JSONResponse(view(result))

    queue: asyncio.Queue[tuple[str, Any] | None] = asyncio.Queue()

    async def on_event(event: Any) -> None:
        found = event_payload(event)
        if found is not None:
            queue.put_nowait(found)

    result_task: asyncio.Task[Result] | None = None
    result_task = asyncio.ensure_future(
        responses.run_unstored(tenant, run_id, run_request, context, on_event, toolset=toolset)
    )
    result_task.add_done_callback(lambda _: queue.put_nowait(None))

    async def events() -> AsyncIterator[bytes]:
        assert result_task is not None
        translator = EventTranslator(
            run_id,
            skeleton(run_id, body, None, created),
            schema.schema if schema is not None else None,
            client_names=client_names(kept_fields(body)),
            approved=approved_calls(kept_fields(body)),
        )
        for event in translator.start():
            yield sse(event)
        try:
            while (native := await queue.get()) is not None:
                for event in translator.on(*native):
                    yield sse(event)
            try:
                result = result_task.result()
            except Exception as exc:
                yield error_event(exc, translator.seq)
                return
            for event in translator.finish(view(result)):
                yield sse(event)
        finally:
            if not result_task.done():
                result_task.cancel()

    return streaming(svc, events())
