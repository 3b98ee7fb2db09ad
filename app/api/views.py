"""How the services' results are answered over HTTP: run records (from a finished run or a
stored record), conversations, and the service's request types from HTTP bodies."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.agent.codec import CHUNK, MessageList, dumps_json, in_field_order, model_value
from app.agent.messages import AssistantMessage, AttemptError, Usage, UserMessage
from app.agent.structured import parsed_output
from app.config import Settings
from app.service.conversations import ConversationInfo
from app.service.pending import output_schema_of, split_prompts
from app.service.runs import FinishedRun, RunRequest
from app.store.stores import RunRecord
from app.store.tables import Run

from .problems import CODED_RUN_PROBLEMS, PROBLEM_TYPES, run_problem_type
from .schemas import Conversation, RunCreate, RunProblem
from .schemas import Run as RunBody
from .tools import split_tools

_STATUS_DETAIL = {
    "conflicted": "the stored context changed while the run was going (e.g. a PUT of the "
    "context); nothing was overwritten and the run's records are kept",
    "interrupted": "the process running this run stopped before it finished (its lease "
    "expired); nothing of the run was stored",
}


def run_problem(error: AttemptError | None, status: str) -> RunProblem | None:
    """The ``error`` of a run record: a problem whose type says why the run did not complete."""
    if status in _STATUS_DETAIL:
        problem_type = run_problem_type(status)
        # An outcome lost to a database outage says so (docs/faults.md).
        outage = error is not None and error.code == "database_unavailable"
        return RunProblem(
            type=problem_type.uri,
            title=problem_type.title,
            detail=error.message if outage and error is not None else _STATUS_DETAIL[status],
            kind=status,
            code=error.code if outage and error is not None else None,
        )
    if error is None:
        return None
    coded = error.code in CODED_RUN_PROBLEMS
    problem_type = run_problem_type(error.code if coded and error.code else error.kind)
    return RunProblem(
        type=problem_type.uri,
        title=problem_type.title,
        detail=error.message,
        kind=error.kind,
        provider_status=error.status,
        code=error.code,
    )


def run_problem_slug(error: AttemptError | None, status: str) -> str | None:
    """The slug of :func:`run_problem`'s type (the run's log line names it)."""
    problem = run_problem(error, status)
    return problem.type.rsplit("/", 1)[-1] if problem is not None else None


@dataclass(frozen=True)
class RunView:
    """One run as answered over HTTP (``context`` left out of listings and minimal answers)."""

    model: RunBody

    @property
    def etag(self) -> str | None:
        return self.model.etag

    def body(self, *, minimal: bool = False) -> dict[str, Any]:
        if minimal or self.model.context is None:
            # never serialized only to be dropped: a long context is most of the work
            return self.model.model_dump(mode="json", exclude={"context"})
        return self.model.model_dump(mode="json")

    async def render(self, *, minimal: bool = False) -> bytes:
        """:meth:`body` as the JSON a ``JSONResponse`` of it sends (the same values, in the
        same order), built without one long call: the message lists — ``context.messages``,
        ``new_messages`` and each compaction's ``folded`` (a compaction of a long context
        folds thousands) — are encoded a few hundred messages per call, and the event loop
        runs its other tasks between them (``/healthz`` answers meanwhile)."""
        model = self.model
        drop_context = minimal or model.context is None
        listed = len(model.new_messages) + sum(len(c.folded) for c in model.compactions)
        if not drop_context:
            assert model.context is not None
            listed += len(model.context.messages)
        if listed <= CHUNK:  # a piece's worth in all (most runs): one call, no turn of the loop
            return model.model_dump_json(exclude={"context"} if drop_context else None).encode()
        exclude: dict[str, Any] = {
            "context": True if drop_context else {"messages"},
            "new_messages": True,
            "compactions": True,
        }
        head = model.model_dump(mode="json", exclude=exclude)
        if not drop_context:
            assert model.context is not None
            head["context"]["messages"] = MessageList(model.context.messages)
        head["new_messages"] = MessageList(model.new_messages)
        head["compactions"] = [model_value(c, folded=c.folded) for c in model.compactions]
        return await dumps_json(in_field_order(type(model), head))


def _duration(start: datetime | None, end: datetime | None) -> int | None:
    """From the run's start (a queued run's claim) to its end: time in the queue is not in it."""
    if start is None or end is None:
        return None
    return max(0, int((end - start).total_seconds() * 1000))


def _parsed(run: Run, status: str, final: AssistantMessage | None) -> Any:
    """A completed run's answer as JSON when it asked for an output schema (and matched it)."""
    if status != "completed":
        return None
    return parsed_output(output_schema_of(run), final)


def run_view(finished: FinishedRun) -> RunView:
    """The answer to ``POST …/runs``, from the run row, the Result and what was stored."""
    run, result, outcome = finished.run, finished.result, finished.outcome
    return RunView(
        RunBody(
            run_id=run.run_id,
            conversation_id=run.conversation_id,
            agent=run.agent,
            status=outcome.status,
            stored=outcome.stored,
            etag=outcome.etag,
            base_etag=run.base_etag,
            on_failure=run.on_failure,
            prompts=[UserMessage.model_validate(p) for p in run.prompts],
            context=result.context,
            new_messages=list(result.new_messages),
            final=result.final,
            compactions=list(result.compactions),
            usage=result.usage,
            error=run_problem(result.error, outcome.status),
            output_parsed=_parsed(run, outcome.status, result.final),
            required_action=(
                result.required_action if outcome.status == "requires_action" else None
            ),
            created_at=run.created_at,
            started_at=run.started_at,
            finished_at=outcome.finished_at,
            duration_ms=_duration(run.started_at, outcome.finished_at),
            trace_id=run.trace_id,
        )
    )


def record_view(record: RunRecord) -> RunView:
    """A stored run record (``GET …/runs/{id}``)."""
    run = record.run
    error = AttemptError.model_validate(run.error) if run.error else None
    return RunView(
        RunBody.model_validate(
            {
                "run_id": run.run_id,
                "conversation_id": run.conversation_id,
                "agent": run.agent,
                "status": run.status,
                "stored": run.stored,
                "etag": run.result_etag,
                "base_etag": run.base_etag,
                "on_failure": run.on_failure,
                "prompts": [UserMessage.model_validate(p) for p in run.prompts],
                "context": None,
                "new_messages": list(record.new_messages),
                "final": record.final,
                "compactions": list(record.compactions),
                "usage": Usage.model_validate(run.usage) if run.usage else Usage(),
                "error": run_problem(error, run.status),
                "output_parsed": _parsed(run, run.status, record.final),
                "required_action": run.required_action,
                "created_at": run.created_at,
                "started_at": run.started_at,
                "finished_at": run.finished_at,
                "duration_ms": _duration(run.started_at, run.finished_at),
                "trace_id": run.trace_id,
            }
        )
    )


def conversation_body(info: ConversationInfo) -> Conversation:
    conv = info.conversation
    return Conversation(
        id=conv.id,
        etag=conv.etag,
        system_prompt=conv.system_prompt,
        has_summary=bool(conv.summary),
        message_count=conv.message_count,
        run_count=info.run_count,
        transcript_count=conv.transcript_seq,
        active_run_id=conv.active_run_id,
        pending_tool_calls=list(info.pending_tool_calls),
        created_at=conv.created_at,
        updated_at=conv.updated_at,
        metadata=info.metadata,
        expires_at=conv.expires_at,
    )


def run_request(body: RunCreate, settings: Settings) -> RunRequest:
    """The service's request from the HTTP body: ``prompts`` splits into the leading tool
    results and the user messages (422 ``unexpected-tool-answer`` for a result after them);
    ``tools`` into client tools and MCP servers."""
    tool_results, prompts = split_prompts(body.messages())
    client, client_at, servers, servers_at = split_tools(body.tools, settings)
    return RunRequest(
        prompts=prompts,
        agent=body.agent,
        on_failure=body.on_failure,
        if_busy=body.if_busy,
        client_tools=client,
        require_approval=tuple(body.require_approval),
        tool_results=tool_results,
        approvals=tuple(body.approvals),
        instructions=body.instructions,
        settings=body.settings(),
        mcp_servers=servers,
        tool_positions=client_at,
        mcp_positions=servers_at,
    )


__all__ = [
    "PROBLEM_TYPES",
    "RunView",
    "conversation_body",
    "record_view",
    "run_problem",
    "run_request",
    "run_view",
]
