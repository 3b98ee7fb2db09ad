"""Run records as the API shows them, built from the stored row and the agent's Result."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.agent.messages import AssistantMessage, AttemptError, Context, Usage, UserMessage
from app.agent.records import Compaction, Result
from app.api.problems import PROBLEM_BASE_URI
from app.api.schemas import Run as RunBody
from app.api.schemas import RunProblem
from app.store import tables
from app.store.repository import RunOutcome, RunRecord

#: run error kinds → (problem slug, title); documented in docs/api.md
RUN_PROBLEMS: dict[str, tuple[str, str]] = {
    "overflow": ("run-context-overflow", "The context does not fit the model's window"),
    "retryable": ("run-provider-unavailable", "The model provider stayed unavailable"),
    "fatal": ("run-provider-error", "The model provider refused the request"),
    "aborted": ("run-cancelled", "The run was cancelled"),
    "internal": ("run-internal-error", "The run failed inside Carryover"),
    "conflicted": ("run-conflicted", "The stored context changed during the run"),
    "interrupted": ("run-interrupted", "The process running the run went away"),
    "max_turns": ("run-max-turns", "The model kept calling tools"),
}


_STATUS_DETAIL = {
    "conflicted": "the stored context changed while the run was going (e.g. a PUT of the "
    "context); nothing was overwritten and the run's records are kept",
    "interrupted": "the process running this run stopped before it finished (its lease "
    "expired); nothing of the run was stored",
}


def run_problem(error: AttemptError | None, status: str) -> RunProblem | None:
    if status in _STATUS_DETAIL:
        slug, title = RUN_PROBLEMS[status]
        return RunProblem(
            type=PROBLEM_BASE_URI + slug,
            title=title,
            detail=_STATUS_DETAIL[status],
            kind=status,
        )
    if error is None:
        return None
    slug, title = RUN_PROBLEMS.get(
        "max_turns" if error.code == "max_turns" else error.kind, RUN_PROBLEMS["internal"]
    )
    return RunProblem(
        type=PROBLEM_BASE_URI + slug,
        title=title,
        detail=error.message,
        kind=error.kind,
        provider_status=error.status,
        code=error.code,
    )


@dataclass(frozen=True)
class RunView:
    """One run as answered over HTTP (``context`` left out of listings and minimal answers)."""

    model: RunBody

    @property
    def etag(self) -> str | None:
        return self.model.etag

    def body(self, *, minimal: bool = False) -> dict[str, Any]:
        data = self.model.model_dump(mode="json")
        if minimal or self.model.context is None:
            data.pop("context", None)
        return data


def _duration(start: datetime, end: datetime | None) -> int | None:
    return None if end is None else max(0, int((end - start).total_seconds() * 1000))


def run_view(run: tables.Run, result: Result, outcome: RunOutcome) -> RunView:
    """The answer to ``POST …/runs``, from the run row, the Result and what was stored."""
    return RunView(
        RunBody(
            run_id=run.run_id,
            conversation_id=run.conversation_id,
            agent=run.agent,
            status=outcome.status,
            stored=outcome.stored,
            etag=outcome.etag,
            base_etag=run.base_etag,
            on_failure=run.on_failure,  # type: ignore[arg-type]
            prompts=[UserMessage.model_validate(p) for p in run.prompts],
            context=result.context,
            new_messages=list(result.new_messages),
            final=result.final,
            compactions=list(result.compactions),
            usage=result.usage,
            error=run_problem(result.error, outcome.status),
            created_at=run.created_at,
            finished_at=outcome.finished_at,
            duration_ms=_duration(run.created_at, outcome.finished_at),
        )
    )


def record_view(record: RunRecord, *, current_etag: str | None = None) -> RunView:
    """A stored run record (``GET …/runs/{id}``)."""
    run = record.run
    error = AttemptError.model_validate(run.error) if run.error else None
    return RunView(
        RunBody(
            run_id=run.run_id,
            conversation_id=run.conversation_id,
            agent=run.agent,
            status=run.status,  # type: ignore[arg-type]
            stored=run.stored,
            etag=run.result_etag,
            base_etag=run.base_etag,
            on_failure=run.on_failure,  # type: ignore[arg-type]
            prompts=[UserMessage.model_validate(p) for p in run.prompts],
            context=None,
            new_messages=list(record.new_messages),
            final=record.final,
            compactions=list(record.compactions),
            usage=Usage.model_validate(run.usage) if run.usage else Usage(),
            error=run_problem(error, run.status),
            created_at=run.created_at,
            finished_at=run.finished_at,
            duration_ms=_duration(run.created_at, run.finished_at),
        )
    )


__all__ = [
    "AssistantMessage",
    "Compaction",
    "Context",
    "RunView",
    "record_view",
    "run_problem",
    "run_view",
]
