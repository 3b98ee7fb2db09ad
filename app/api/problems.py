"""Every error the service answers, as RFC 9457 ``application/problem+json`` (SPEC §4).

One registry: each kind of problem is a :class:`ProblemType` below, with a stable type URI
``https://carryover.dev/problems/<slug>`` — the problems requests are answered with, and the
ones a run record's ``error`` holds (``run-*``). Every layer raises a
:class:`~app.errors.CarryoverError` that names its slug (the API's own :class:`Problem` is one);
:func:`install_problem_handlers` turns it — and FastAPI's validation errors, Starlette's 404/405
and any unhandled exception — into a problem response with ONE handler, and makes the OpenAPI
document say so. Routes document their problems with :func:`problem_responses`::

    @router.put("/conversations/{id}/context",
                responses=problem_responses(404, PRECONDITION_FAILED, PRECONDITION_REQUIRED))
"""

from __future__ import annotations

import http
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

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
IDEMPOTENCY_KEY_IN_FLIGHT = _register(
    "idempotency-key-in-flight", "A request with this Idempotency-Key is still running", 409
)
PRECONDITION_FAILED = _register("precondition-failed", "Precondition failed", 412)
PAYLOAD_TOO_LARGE = _register("payload-too-large", "Request body too large", 413)
UNSUPPORTED_MEDIA_TYPE = _register("unsupported-media-type", "Unsupported media type", 415)
VALIDATION_ERROR = _register("validation-error", "Request is not valid", 422)
INVALID_CONTEXT = _register("invalid-context", "Context is not valid", 422)
UNREPLAYABLE_CONTEXT = _register(
    "unreplayable-context", "Context could not be replayed to a provider", 422
)
LIMIT_EXCEEDED = _register("limit-exceeded", "A configured limit was exceeded", 422)
IDEMPOTENCY_KEY_MISMATCH = _register(
    "idempotency-key-mismatch", "Idempotency-Key reused with a different request", 422
)
PRECONDITION_REQUIRED = _register("precondition-required", "Precondition required", 428)
INTERNAL = _register("internal", "Internal server error", 500)
PROVIDER_ERROR = _register("provider-error", "The model provider failed", 502)
NOT_READY = _register("not-ready", "Service not ready", 503)

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
}
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
    """422: an uploaded Context breaks the model or the replay rules (SPEC §1)."""
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
        default=None, description="invalid-context: index of the offending message"
    )
    active_run_id: str | None = Field(
        default=None, description="run-in-progress: the run holding the conversation"
    )
    limit: str | None = Field(
        default=None, description="limit-exceeded / payload-too-large: the setting exceeded"
    )
    maximum: int | None = None


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


# --- validation errors -----------------------------------------------------------------------


def _error_path(
    loc: Sequence[str | int], body: Any, error_type: str, ctx: Mapping[str, Any]
) -> str:
    """``("body", "prompts", 0, "user", "content", 1)`` → ``body.prompts[0].content[1]``.

    pydantic puts the tag of a discriminated union (``user``) and the label of a union member
    (``UserMessage``, ``str``) into ``loc``; they are not in the request, so they are dropped
    by walking the request body alongside the location.
    """
    if not loc:
        return ""
    path = str(loc[0])
    if loc[0] in ("header", "query", "path", "cookie") and len(loc) > 1:
        # the parameter's name (a header's may be capitalised: it is no union label)
        path += f".{loc[1]}"
        loc = loc[1:]
    current: Any = body if loc[0] == "body" else None
    tag_skipped = False
    for segment in loc[1:]:
        if isinstance(segment, int):
            path += f"[{segment}]"
            current = (
                current[segment]
                if isinstance(current, list) and -len(current) <= segment < len(current)
                else None
            )
            tag_skipped = False
            continue
        if isinstance(current, dict):
            if not tag_skipped and current.get("type") == segment:
                # the tag of a discriminated union, even when a field has the same name
                # (a text block's tag "text" and its field "text")
                tag_skipped = True
                continue
            if segment in current:
                path += f".{segment}"
                current = current[segment]
                tag_skipped = False
                continue
            tags = [v for v in current.values() if isinstance(v, str)]
            is_tag = not tag_skipped and segment in tags
            is_label = segment[:1].isupper() or "[" in segment or segment in _TYPE_LABELS
            if is_tag or is_label:
                tag_skipped = tag_skipped or is_tag
                continue
            path += f".{segment}"  # a missing member
            current = None
            continue
        if current is not None or segment in _TYPE_LABELS or segment[:1].isupper():
            continue  # a union member's label under a scalar or list value
        path += f".{segment}"
    if error_type in ("union_tag_invalid", "union_tag_not_found"):
        path += "." + str(ctx.get("discriminator", "type")).strip("'\"")
    return path


_TYPE_LABELS = frozenset(
    {"str", "int", "float", "bool", "bytes", "list", "dict", "tuple", "set", "none", "null"}
)


def validation_errors(exc: RequestValidationError) -> list[dict[str, str]]:
    """FastAPI's errors as ``{"path", "message"}`` items, in order, without duplicates."""
    body = getattr(exc, "body", None)
    items: list[dict[str, str]] = []
    errors = list(exc.errors())
    for error in [e for e in errors if not _wrong_branch(e, errors)]:
        path = _error_path(
            tuple(error.get("loc", ())), body, error.get("type", ""), error.get("ctx") or {}
        )
        item = {"path": path, "message": str(error.get("msg", "invalid"))}
        if item not in items:
            items.append(item)
    return items


def _wrong_branch(error: Mapping[str, Any], errors: Sequence[Mapping[str, Any]]) -> bool:
    """A union member that does not even have the value's JSON type (``str`` for an object
    prompt) when another member got further: its "should be a valid string" would only hide
    the error that matters (``body.prompts[0].content[0].type``)."""
    loc = tuple(error.get("loc", ()))
    if not loc or not str(error.get("type", "")).endswith("_type"):
        return False
    label, prefix = loc[-1], loc[:-1]
    if not isinstance(label, str) or not (label in _TYPE_LABELS or label[:1].isupper()):
        return False
    return any(
        tuple(other.get("loc", ()))[: len(prefix)] == prefix
        and len(other.get("loc", ())) > len(prefix)
        and tuple(other.get("loc", ()))[len(prefix)] != label
        and not str(other.get("type", "")).endswith("_type")
        for other in errors
    )


def _is_json_media_type(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def _from_validation(request: Request, exc: RequestValidationError) -> Problem:
    errors = exc.errors()
    for error in errors:
        if error.get("type") == "json_invalid":
            reason = (error.get("ctx") or {}).get("error", "")
            loc = error.get("loc", ())
            at = f" at character {loc[1]}" if len(loc) > 1 and isinstance(loc[1], int) else ""
            return Problem(MALFORMED_JSON, f"the request body is not valid JSON: {reason}{at}")
    content_type = request.headers.get("content-type")
    body_error = any(tuple(e.get("loc", ()))[:1] == ("body",) for e in errors)
    if body_error and content_type and not _is_json_media_type(content_type):
        return Problem(
            UNSUPPORTED_MEDIA_TYPE,
            f"the request body must be application/json, not {content_type.split(';')[0]}",
        )
    raw = getattr(exc, "body", None)
    if body_error and not content_type and isinstance(raw, bytes) and raw:
        return Problem(
            UNSUPPORTED_MEDIA_TYPE,
            "the request has a body but no Content-Type: send it as application/json",
        )
    return validation_error(validation_errors(exc))


# --- handlers --------------------------------------------------------------------------------


def as_problem(exc: CarryoverError) -> Problem:
    """The problem a refusal of any layer is answered with: its slug's registered type."""
    if isinstance(exc, Problem):
        return exc
    problem_type = PROBLEM_TYPES.get(exc.slug)
    if problem_type is None or problem_type.status != exc.status:
        raise LookupError(f"{type(exc).__name__} names no registered problem type: {exc.slug!r}")
    return Problem(problem_type, exc.detail, headers=exc.headers, **exc.extras)


async def _handle_refusal(request: Request, exc: Exception) -> Response:
    """The one handler of every :class:`~app.errors.CarryoverError`, whatever layer raised it."""
    assert isinstance(exc, CarryoverError)
    return as_problem(exc).response(instance=request.url.path)


async def _handle_validation(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    return _from_validation(request, exc).response(instance=request.url.path)


async def _handle_http(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code < 400:  # e.g. 304: no body allowed
        return Response(status_code=exc.status_code, headers=exc.headers)
    default_phrase = http.client.responses.get(exc.status_code, "")
    detail = exc.detail if exc.detail and exc.detail != default_phrase else None
    if exc.status_code == 400 and isinstance(exc.__cause__, RecursionError | UnicodeError):
        # FastAPI's "There was an error parsing the body": say what was wrong with it.
        reason = (
            "it nests arrays or objects too deeply"
            if isinstance(exc.__cause__, RecursionError)
            else "it is not valid UTF-8"
        )
        return problem_response(
            MALFORMED_JSON,
            f"the request body is not valid JSON: {reason}",
            instance=request.url.path,
        )
    problem_type = _BY_HTTP_STATUS.get(exc.status_code)
    if problem_type is NOT_FOUND and detail is None:
        detail = f"nothing at {request.method} {request.url.path}"
    elif problem_type is METHOD_NOT_ALLOWED and detail is None:
        detail = f"{request.method} is not allowed on {request.url.path}"
    if problem_type is None:
        # A status the registry has no kind for: RFC 9457's "about:blank" with the phrase.
        body = {
            "type": "about:blank",
            "title": default_phrase or "Error",
            "status": exc.status_code,
            "detail": detail or default_phrase or "Error",
            "instance": request.url.path,
        }
        return ProblemJSONResponse(body, status_code=exc.status_code, headers=exc.headers)
    return problem_response(
        problem_type, detail, instance=request.url.path, headers=exc.headers or {}
    )


async def _handle_unexpected(request: Request, exc: Exception) -> Response:
    # No detail of the exception leaks; Starlette re-raises it after this response, so the
    # server logs the traceback.
    return problem_response(
        INTERNAL,
        "the server could not handle this request; the error has been logged",
        instance=request.url.path,
    )


Handler = Callable[[Request, Exception], Awaitable[Response]]


def install_problem_handlers(app: FastAPI) -> None:
    """Answer every error of ``app`` as a problem and document problems in its OpenAPI."""
    handlers: dict[type[Exception], Handler] = {
        CarryoverError: _handle_refusal,
        RequestValidationError: _handle_validation,
        StarletteHTTPException: _handle_http,
        Exception: _handle_unexpected,
    }
    for exc_class, handler in handlers.items():
        app.add_exception_handler(exc_class, handler)

    generate = app.openapi

    def openapi() -> dict[str, Any]:
        schema = generate()
        _document_problems(schema)
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def _document_problems(schema: dict[str, Any]) -> None:
    """Put ``ProblemDetails`` in the components and replace FastAPI's default 422 body
    (``HTTPValidationError``, which this service never sends) with it. Idempotent."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    problem_schema = ProblemDetails.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, definition in problem_schema.pop("$defs", {}).items():
        components.setdefault(name, definition)
    components.setdefault("ProblemDetails", problem_schema)
    default_ref = "#/components/schemas/HTTPValidationError"
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            if not isinstance(operation, dict):
                continue
            for response in operation.get("responses", {}).values():
                content = response.get("content", {})
                json_schema = content.get("application/json", {}).get("schema", {})
                if json_schema.get("$ref") == default_ref:
                    response["description"] = VALIDATION_ERROR.title
                    response["content"] = {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": _PROBLEM_REF}}}
    # FastAPI's own schemas for that body go once nothing refers to them any more.
    for unused in ("HTTPValidationError", "ValidationError"):
        others = {k: v for k, v in components.items() if k != unused}
        refs = json.dumps([schema.get("paths", {}), others])
        if unused in components and f'"#/components/schemas/{unused}"' not in refs:
            del components[unused]
