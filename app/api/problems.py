"""Every error the service answers, as RFC 9457 ``application/problem+json`` (contract §4).

One registry: each kind of problem is a :class:`ProblemType` below, with a stable type URI
``https://carryover.dev/problems/<slug>`` — the problems requests are answered with, and the
ones a run record's ``error`` holds (``run-*``). Every layer raises a
:class:`~app.errors.CarryoverError` that names its slug (the API's own :class:`Problem` is one);
:func:`app.api.handlers.install_problem_handlers` turns it — and FastAPI's validation
errors, Starlette's 404/405 and any unhandled exception — into a problem response with ONE
handler, and makes the OpenAPI document say so. Routes document their problems with
:func:`problem_responses`::

    @router.put("/conversations/{id}/context",
                responses=problem_responses(404, PRECONDITION_FAILED, PRECONDITION_REQUIRED))
"""

from __future__ import annotations

import http
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from app.errors import CarryoverError

PROBLEM_BASE_URI = "https://carryover.dev/problems/"
PROBLEM_MEDIA_TYPE = "application/problem+json"
#: members every problem object has; extension members may not reuse these names
RESERVED_MEMBERS = frozenset({"type", "title", "status", "detail", "instance"})


@dataclass(frozen=True)
class ProblemType:
    """One kind of problem: a stable slug (the end of its type URI), a title and a status."""

    slug: str
    title: str
    status: int
    run_error: bool = False  # the error of a run record, not the answer to a request

    @property
    def uri(self) -> str:
        return PROBLEM_BASE_URI + self.slug


PROBLEM_TYPES: dict[str, ProblemType] = {}


def _register(slug: str, title: str, status: int, *, run_error: bool = False) -> ProblemType:
    if slug in PROBLEM_TYPES:
        raise ValueError(f"problem type {slug!r} is registered twice")
    problem_type = ProblemType(slug, title, status, run_error)
    PROBLEM_TYPES[slug] = problem_type
    return problem_type


# --- the registry ---------------------------------------------------------------------------
# Slugs are part of the API: clients branch on them. Never rename one; add a new one instead.

MALFORMED_JSON = _register("malformed-json", "Request body is not valid JSON", 400)
BAD_HEADER = _register("bad-header", "Malformed request header", 400)
BAD_CURSOR = _register("bad-cursor", "Invalid pagination cursor", 400)
UNAUTHORIZED = _register("unauthorized", "Missing or invalid API key", 401)
NOT_FOUND = _register("not-found", "Not found", 404)
METHOD_NOT_ALLOWED = _register("method-not-allowed", "Method not allowed", 405)
NOT_ACCEPTABLE = _register("not-acceptable", "Not acceptable", 406)
CONVERSATION_EXISTS = _register("conversation-exists", "Conversation already exists", 409)
RUN_IN_PROGRESS = _register("run-in-progress", "Another run is in progress", 409)
RUN_NOT_ACTIVE = _register("run-not-active", "The run is not in progress", 409)
STORED_DATA_DAMAGED = _register(
    "stored-data-damaged", "A stored message of the conversation is damaged", 409
)
TOOL_RESULTS_REQUIRED = _register(
    "tool-results-required", "Pending tool calls must be answered first", 409
)
IDEMPOTENCY_KEY_IN_FLIGHT = _register(
    "idempotency-key-in-flight", "A request with this Idempotency-Key is still running", 409
)
EVENTS_EXPIRED = _register("events-expired", "The run's events are no longer kept", 410)
VERSION_EXPIRED = _register(
    "version-expired", "The context version is past the version retention", 410
)
PRECONDITION_FAILED = _register("precondition-failed", "Precondition failed", 412)
PAYLOAD_TOO_LARGE = _register("payload-too-large", "Request body too large", 413)
UNSUPPORTED_MEDIA_TYPE = _register("unsupported-media-type", "Unsupported media type", 415)
VALIDATION_ERROR = _register("validation-error", "Request is not valid", 422)
INVALID_CONTEXT = _register("invalid-context", "Context is not valid", 422)
UNREPLAYABLE_CONTEXT = _register(
    "unreplayable-context", "Context could not be replayed to a provider", 422
)
UNEXPECTED_TOOL_ANSWER = _register(
    "unexpected-tool-answer", "A tool result or approval answers no pending tool call", 422
)
UNSAFE_CUT = _register("unsafe-cut", "The cut separates a tool call from its result", 422)
LIMIT_EXCEEDED = _register("limit-exceeded", "A configured limit was exceeded", 422)
IDEMPOTENCY_KEY_MISMATCH = _register(
    "idempotency-key-mismatch", "Idempotency-Key reused with a different request", 422
)
PRECONDITION_REQUIRED = _register("precondition-required", "Precondition required", 428)
INTERNAL = _register("internal", "Internal server error", 500)
PROVIDER_ERROR = _register("provider-error", "The model provider failed", 502)
NOT_READY = _register("not-ready", "Service not ready", 503)
DATABASE_UNAVAILABLE = _register("database-unavailable", "The database is not available", 503)
QUOTA_EXCEEDED = _register("quota-exceeded", "The tenant's quota is spent", 429)
STREAM_READER_BEHIND = _register(
    "stream-reader-behind", "The stream's reader fell too far behind; resume it", 409
)
TOO_MANY_AUTH_FAILURES = _register(
    "too-many-auth-failures", "Too many failed authentications from this address", 429
)

# Why a run did not complete: a run record's ``error`` (docs/api.md). Its status is the one the
# failure would have as an answer; the run itself is answered 201.
_RUN_PROBLEMS = {
    "overflow": ("run-context-overflow", "The context does not fit the model's window", 422),
    "retryable": ("run-provider-unavailable", "The model provider stayed unavailable", 503),
    "fatal": ("run-provider-error", "The model provider refused the request", 502),
    "aborted": ("run-cancelled", "The run was cancelled", 409),
    "internal": ("run-internal-error", "The run failed inside Carryover", 500),
    "conflicted": ("run-conflicted", "The stored context changed during the run", 409),
    "interrupted": ("run-interrupted", "The process running the run went away", 503),
    "max_turns": ("run-max-turns", "The model kept calling tools", 422),
    "answer_too_large": ("run-answer-too-large", "The model's answer passed the size limit", 502),
    "run_deadline": ("run-deadline-exceeded", "The run passed its deadline", 504),
    "context_too_large": (
        "run-context-too-large",
        "The run's context would pass the stored-context limits",
        422,
    ),
    # a background queued run refused when its turn came (docs/runs.md "Queued runs"): the
    # problem a direct start would have answered, as the run's end
    "quota_exceeded": ("run-quota-exceeded", "The tenant's quota was spent at the run's turn", 429),
    "tool_results_required": (
        "run-tool-results-required",
        "The queued run left pending tool calls unanswered at its turn",
        409,
    ),
    "unexpected_tool_answer": (
        "run-unexpected-tool-answer",
        "The queued run answered a tool call that was not pending at its turn",
        422,
    ),
    "output_invalid": (
        "run-output-invalid",
        "The model's answer did not match the run's output schema",
        422,
    ),
    "validation_error": ("run-invalid-request", "The queued run's request was not valid", 422),
    "stored_data_damaged": (
        "run-stored-data-damaged",
        "A stored message of the conversation was damaged at the queued run's turn",
        409,
    ),
}
#: run error codes with a problem type of their own (the others take their kind's)
CODED_RUN_PROBLEMS = frozenset(
    {
        "max_turns",
        "output_invalid",
        "answer_too_large",
        "run_deadline",
        "context_too_large",
        "quota_exceeded",
        "tool_results_required",
        "unexpected_tool_answer",
        "validation_error",
        "stored_data_damaged",
    }
)
#: run error kinds (and the statuses conflicted / interrupted) → their problem type
RUN_PROBLEMS: dict[str, ProblemType] = {
    kind: _register(slug, title, status, run_error=True)
    for kind, (slug, title, status) in _RUN_PROBLEMS.items()
}


def run_problem_type(kind: str) -> ProblemType:
    """The problem type of a run that ended with an error of this kind (or this status)."""
    return RUN_PROBLEMS.get(kind, RUN_PROBLEMS["internal"])


# What a framework-raised HTTPException of a given status becomes.
_BY_HTTP_STATUS: dict[int, ProblemType] = {
    p.status: p
    for p in (
        UNAUTHORIZED,
        NOT_FOUND,
        METHOD_NOT_ALLOWED,
        NOT_ACCEPTABLE,
        PAYLOAD_TOO_LARGE,
        UNSUPPORTED_MEDIA_TYPE,
        PRECONDITION_FAILED,
        PRECONDITION_REQUIRED,
        INTERNAL,
        NOT_READY,
    )
}


class Problem(CarryoverError):
    """An error the API itself answers as a problem object (lower layers raise their own
    :class:`~app.errors.CarryoverError`). ``extras`` become extension members."""

    def __init__(
        self,
        problem_type: ProblemType,
        detail: str | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        **extras: Any,
    ) -> None:
        clash = RESERVED_MEMBERS & extras.keys()
        if clash:
            raise ValueError(f"extension members may not be named {sorted(clash)}")
        super().__init__(detail or problem_type.title, headers=headers, **extras)
        self.problem_type = problem_type
        self.slug = problem_type.slug
        self.status = problem_type.status

    def body(self, instance: str | None = None) -> dict[str, Any]:
        """The problem object (also what a run record's ``error`` holds)."""
        return problem_body(self.problem_type, self.detail, instance=instance, **self.extras)

    def response(self, instance: str | None = None) -> JSONResponse:
        return problem_response(
            self.problem_type, self.detail, instance=instance, headers=self.headers, **self.extras
        )

    def __repr__(self) -> str:
        return f"Problem({self.problem_type.slug!r}, {self.detail!r})"


# --- constructors for the problems that carry extension members ------------------------------


def validation_error(errors: Sequence[Mapping[str, str]], detail: str | None = None) -> Problem:
    """422 with ``errors``: a list of ``{"path": ..., "message": ...}``."""
    items = [{"path": str(e["path"]), "message": str(e["message"])} for e in errors]
    if detail is None:
        first = items[0] if items else {"path": "", "message": "invalid"}
        more = f" (and {len(items) - 1} more)" if len(items) > 1 else ""
        detail = f"{first['path']}: {first['message']}{more}"
    return Problem(VALIDATION_ERROR, detail, errors=items)


def invalid_context(message_index: int | None, detail: str) -> Problem:
    """422: an uploaded Context breaks the model or the replay rules (contract §1)."""
    return Problem(INVALID_CONTEXT, detail, message_index=message_index)


def unreplayable_context(message_index: int | None, detail: str) -> Problem:
    return Problem(UNREPLAYABLE_CONTEXT, detail, message_index=message_index)


def run_in_progress(active_run_id: str, retry_after: int = 1) -> Problem:
    """409 naming the active run, with ``Retry-After`` (seconds)."""
    return Problem(
        RUN_IN_PROGRESS,
        f"run {active_run_id} is in progress on this conversation",
        headers={"Retry-After": str(max(1, int(retry_after)))},
        active_run_id=active_run_id,
    )


def database_unavailable(detail: str, retry_after: int = 1, **extras: Any) -> Problem:
    """503: the database failed (docs/faults.md); ``Retry-After`` says when to try again."""
    return Problem(
        DATABASE_UNAVAILABLE,
        detail,
        headers={"Retry-After": str(max(1, int(retry_after)))},
        **extras,
    )


def conversation_not_found(conversation_id: str) -> Problem:
    """404 for a conversation that does not exist — or belongs to another tenant."""
    return Problem(NOT_FOUND, f"conversation {conversation_id!r} not found")


def limit_exceeded(limit: str, maximum: int, actual: int | None = None) -> Problem:
    """422 naming the configured limit (e.g. ``max_prompts_per_run``) and its value."""
    got = f" (got {actual})" if actual is not None else ""
    return Problem(
        LIMIT_EXCEEDED, f"{limit} is {maximum}{got}", limit=limit, maximum=maximum, actual=actual
    )


def payload_too_large(max_bytes: int) -> Problem:
    return Problem(
        PAYLOAD_TOO_LARGE,
        f"the request body exceeds {max_bytes} bytes",
        limit="max_body_bytes",
        maximum=max_bytes,
    )


# --- rendering -------------------------------------------------------------------------------


class ProblemJSONResponse(JSONResponse):
    media_type = PROBLEM_MEDIA_TYPE


def problem_body(
    problem_type: ProblemType,
    detail: str | None = None,
    *,
    instance: str | None = None,
    **extras: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": problem_type.uri,
        "title": problem_type.title,
        "status": problem_type.status,
        "detail": detail or problem_type.title,
    }
    if instance is not None:
        body["instance"] = instance
    body.update((k, v) for k, v in extras.items() if k not in RESERVED_MEMBERS)
    return body


def problem_response(
    problem_type: ProblemType,
    detail: str | None = None,
    *,
    instance: str | None = None,
    headers: Mapping[str, str] | None = None,
    **extras: Any,
) -> JSONResponse:
    """An ``application/problem+json`` response."""
    return ProblemJSONResponse(
        problem_body(problem_type, detail, instance=instance, **extras),
        status_code=problem_type.status,
        headers=dict(headers or {}),
    )


class ProblemError(BaseModel):
    path: str = Field(examples=["body.prompts[0].content[1].type"])
    message: str


class ProblemDetails(BaseModel):
    """RFC 9457 problem details, with the extension members Carryover uses."""

    model_config = ConfigDict(extra="allow", title="ProblemDetails")

    type: str = Field(examples=[PRECONDITION_FAILED.uri])
    title: str
    status: int
    detail: str
    instance: str | None = None
    errors: list[ProblemError] | None = Field(
        default=None, description="validation-error: each invalid value and why"
    )
    message_index: int | None = Field(
        default=None,
        description="invalid-context, stored-data-damaged: index of the offending message",
    )
    current_etag: str | None = Field(
        default=None,
        description="precondition-failed, stored-data-damaged: the stored context's ETag now",
    )
    conversation_id: str | None = Field(
        default=None, description="stored-data-damaged: the conversation whose message it is"
    )
    active_run_id: str | None = Field(
        default=None, description="run-in-progress: the run holding the conversation"
    )
    limit: str | None = Field(
        default=None, description="limit-exceeded / payload-too-large: the setting exceeded"
    )
    run_id: str | None = Field(
        default=None, description="database-unavailable after a run: the run it concerns"
    )
    stored: bool | None = Field(
        default=None,
        description="database-unavailable after a run: false, the run's outcome was not stored",
    )
    maximum: int | None = None
    pending_tool_calls: list[dict[str, Any]] | None = Field(
        default=None,
        description="tool-results-required: every pending call of the conversation "
        "(id, name, arguments, kind)",
    )
    unanswered: list[str] | None = Field(
        default=None, description="tool-results-required: ids of the calls left unanswered"
    )
    tool_call_id: str | None = Field(
        default=None, description="unexpected-tool-answer: the call the answer names"
    )


_PROBLEM_REF = "#/components/schemas/ProblemDetails"


def problem_responses(*problems: int | ProblemType) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` for the given statuses or problem types, each answered as a problem.

    The description names the problem types a status stands for.
    """
    titles: dict[int, list[str]] = {}
    for item in problems:
        if isinstance(item, ProblemType):
            titles.setdefault(item.status, []).append(f"{item.slug}: {item.title}")
        else:
            titles.setdefault(item, []).extend(
                f"{p.slug}: {p.title}"
                for p in PROBLEM_TYPES.values()
                if p.status == item and not p.run_error
            )
    return {
        status: {
            "description": "; ".join(dict.fromkeys(names)) or http.HTTPStatus(status).phrase,
            "content": {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": _PROBLEM_REF}}},
        }
        for status, names in sorted(titles.items())
    }


def document_problem_types(document: dict[str, Any]) -> None:
    """Name every registered problem type in the OpenAPI document: request problems on
    ``ProblemDetails.type``, run errors on ``RunProblem.type`` (each with its status)."""
    schemas = document.get("components", {}).get("schemas", {})
    for name, run_error in (("ProblemDetails", False), ("RunProblem", True)):
        prop = schemas.get(name, {}).get("properties", {}).get("type")
        if prop is None:
            continue
        kinds = [p for p in PROBLEM_TYPES.values() if p.run_error is run_error]
        listed = "; ".join(f"`{p.uri}` ({p.status}, {p.title})" for p in kinds)
        what = "the error of a run record" if run_error else "a refused request"
        prop["description"] = f"The problem type of {what}, one of: {listed}."


def as_problem(exc: CarryoverError) -> Problem:
    """The problem a refusal of any layer is answered with: its slug's registered type."""
    if isinstance(exc, Problem):
        return exc
    problem_type = PROBLEM_TYPES.get(exc.slug)
    if problem_type is None or problem_type.status != exc.status:
        raise LookupError(f"{type(exc).__name__} names no registered problem type: {exc.slug!r}")
    return Problem(problem_type, exc.detail, headers=exc.headers, **exc.extras)
