"""The app's error handlers: every error becomes an RFC 9457 problem (:mod:`app.api.problems`).

ONE handler answers every :class:`~app.errors.CarryoverError`, whichever layer raised it; the
others answer FastAPI's validation errors, Starlette's HTTP errors (404, 405, …) and anything
unexpected (500, without details). :func:`install_problem_handlers` also documents the problems
in the app's OpenAPI document.
"""

from __future__ import annotations

import http
import json
import logging
import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg.exceptions as asyncpg_errors  # type: ignore[import-untyped]
import sqlalchemy.exc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.errors import CarryoverError
from app.store.faults import DatabaseUnavailable, DbFault, classify

from .problems import (
    _BY_HTTP_STATUS,
    _PROBLEM_REF,
    INTERNAL,
    MALFORMED_JSON,
    METHOD_NOT_ALLOWED,
    NOT_FOUND,
    PROBLEM_MEDIA_TYPE,
    UNSUPPORTED_MEDIA_TYPE,
    VALIDATION_ERROR,
    Problem,
    ProblemDetails,
    ProblemJSONResponse,
    as_problem,
    database_unavailable,
    problem_response,
    validation_error,
)
from .validation import validation_errors

log = logging.getLogger(__name__)

#: on every 500: the server drops the connection after it (Starlette re-raises the error to
#: the server), so the client must know not to send its next request on it
_CLOSE = {"Connection": "close"}

#: what a database call raises, beside what it wraps: answered by :func:`_handle_database`
DATABASE_ERRORS: tuple[type[Exception], ...] = (
    DatabaseUnavailable,
    sqlalchemy.exc.SQLAlchemyError,
    sqlite3.Error,
    asyncpg_errors.PostgresError,
    asyncpg_errors.InterfaceError,
    asyncpg_errors.InternalClientError,
    OSError,
)

# --- validation errors -----------------------------------------------------------------------


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


def fault_problem(fault: DbFault) -> Problem:
    """The 503 ``database-unavailable`` of a database fault (no detail of the server's)."""
    what = fault.kind.replace("_", " ")
    return database_unavailable(
        f"the database is not available ({what}); nothing was changed by this request "
        "unless it says otherwise: try again after Retry-After",
        fault.retry_after,
    )


def _internal(request: Request) -> Response:
    return problem_response(
        INTERNAL,
        "the server could not handle this request; the error has been logged",
        instance=request.url.path,
        headers=_CLOSE,
    )


async def _handle_database(request: Request, exc: Exception) -> Response:
    """A database error on any route: 503 ``database-unavailable`` with ``Retry-After`` when
    :func:`~app.store.faults.classify` names a fault; else a bug (500, logged here: a handled
    error is not re-raised). Either way the connection stays usable or says ``close``."""
    fault = classify(exc)
    if fault is None:
        log.error(
            "unexpected database error on %s %s", request.method, request.url.path, exc_info=exc
        )
        return _internal(request)
    log.warning(
        "database %s on %s %s: %s", fault.kind, request.method, request.url.path, fault.detail
    )
    return fault_problem(fault).response(instance=request.url.path)


def stream_problem(exc: Exception, instance: str | None = None) -> dict[str, Any]:
    """The problem an ``error`` event of a stream carries, for what ended it: a refusal as
    itself, a database fault as ``database-unavailable``, anything else as ``internal``."""
    if isinstance(exc, CarryoverError):
        return as_problem(exc).body(instance=instance)
    fault = classify(exc)
    if fault is not None:
        return fault_problem(fault).body(instance=instance)
    log.error("a streamed run ended with an unexpected error", exc_info=exc)
    return Problem(
        INTERNAL, "the run's outcome could not be rendered; the error has been logged"
    ).body(instance=instance)


async def _handle_unexpected(request: Request, exc: Exception) -> Response:
    # No detail of the exception leaks; Starlette re-raises it after this response, so the
    # server logs the traceback — and drops the connection: ``Connection: close`` says so.
    fault = classify(exc)  # a database error wrapped in something else
    if fault is not None:
        problem = fault_problem(fault)
        return problem_response(
            problem.problem_type,
            problem.detail,
            instance=request.url.path,
            headers={**problem.headers, **_CLOSE},
        )
    return _internal(request)


Handler = Callable[[Request, Exception], Awaitable[Response]]


def install_problem_handlers(app: FastAPI) -> None:
    """Answer every error of ``app`` as a problem and document problems in its OpenAPI."""
    handlers: dict[type[Exception], Handler] = {
        **dict.fromkeys(DATABASE_ERRORS, _handle_database),
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
