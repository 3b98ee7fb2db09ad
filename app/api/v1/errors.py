"""Every refusal on ``/v1`` in OpenAI's shape: ``{"error": {"message", "type", "param",
"code"}}`` (docs/openai.md), never Carryover's problem+json.

One mapping, :func:`openai_error`, turns any :class:`~app.errors.CarryoverError` (the native
layers' refusals, the ``/v1`` routes' own :class:`OpenAIError`) into that shape and status. The
``/v1`` app's exception handlers use it; :class:`OpenAIErrorsMiddleware` uses it for what the
native middleware answers before a ``/v1`` route runs (a missing key, a body too large).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.config import RUN_SETTINGS
from app.errors import CarryoverError
from app.store.faults import classify

from ..handlers import DATABASE_ERRORS, fault_problem
from ..problems import PROBLEM_MEDIA_TYPE

log = logging.getLogger(__name__)

#: the path every route of the surface is under
PREFIX = "/v1"


class OpenAIError(CarryoverError):
    """A refusal of the ``/v1`` surface itself, with OpenAI's ``param`` and ``code``."""

    slug = "validation-error"

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message, headers=headers)
        self.status = status
        self.param = param
        self.code = code


def bad_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(message, param=param, code=code)


#: statuses OpenAI's clients know by class; the native ones outside it map onto them
_STATUS = {412: 409, 422: 400, 428: 400, 413: 400, 415: 400, 410: 404}
_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    429: "rate_limit_exceeded",
}
#: codes for native problems, where OpenAI has one
_CODES = {
    "run-in-progress": "conversation_locked",
    "precondition-failed": "conversation_locked",
    "unauthorized": "invalid_api_key",
    "quota-exceeded": "rate_limit_exceeded",
    "payload-too-large": "payload_too_large",
}


def body_of(status: int, message: str, param: str | None, code: str | None) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(
                status, "server_error" if status >= 500 else "invalid_request_error"
            ),
            "param": param,
            "code": code,
        }
    }


def openai_status(status: int) -> int:
    """The ``/v1`` status of a native one (422 → 400, 412 → 409, ...)."""
    return _STATUS.get(status, status)


def openai_error(exc: CarryoverError) -> tuple[int, dict[str, Any], dict[str, str]]:
    """The status, body and headers of any refusal on ``/v1``."""
    if isinstance(exc, OpenAIError):
        return exc.status, body_of(exc.status, exc.detail, exc.param, exc.code), exc.headers
    status = openai_status(exc.status)
    message, param = exc.detail, None
    if exc.slug == "tool-results-required":  # OpenAI's wording, naming the call
        status = 400
        unanswered = exc.extras.get("unanswered") or []
        call = unanswered[0] if unanswered else ""
        message = f"No tool output found for function call {call}."
        param = "input"
    elif exc.slug in ("validation-error", "unreplayable-context", "unexpected-tool-answer"):
        param = "input"
        found = exc.extras.get("errors") or []
        path = str(found[0].get("path", "")) if found and isinstance(found[0], dict) else ""
        if path.removeprefix("body.") in RUN_SETTINGS:  # a setting the profile does not allow
            param, message = path.removeprefix("body."), str(found[0].get("message", message))
        elif path.startswith("body.tools"):  # a tool or MCP server of the request
            param, message = path.removeprefix("body."), str(found[0].get("message", message))
    code: str | None = _CODES.get(exc.slug, exc.slug.replace("-", "_"))
    if exc.slug == "not-found":
        code = None
    headers = {k: v for k, v in exc.headers.items() if k.lower() != "content-type"}
    return status, body_of(status, message, param, code), headers


def error_response(exc: CarryoverError) -> JSONResponse:
    status, body, headers = openai_error(exc)
    return JSONResponse(body, status_code=status, headers=headers)


def _validation_param(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "The request is not valid.", None
    first = errors[0]
    where = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path")]
    param = ".".join(where) or None
    if first.get("type") == "extra_forbidden":
        return f"Unknown parameter: '{param}'.", param
    if first.get("type") == "missing":
        return f"Missing required parameter: '{param}'.", param
    return f"Invalid value for '{param}': {first.get('msg', 'invalid')}.", param


def install_error_handlers(app: FastAPI) -> None:
    """Every exception a ``/v1`` route raises, answered in OpenAI's shape."""

    async def refusal(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, CarryoverError)
        return error_response(exc)

    async def validation(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        message, param = _validation_param(exc)
        return error_response(bad_request(message, param))

    async def http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 404:
            message = f"Invalid URL ({request.method} {request.url.path})"
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
        else:
            message = str(exc.detail)
        return error_response(OpenAIError(message, status=exc.status_code))

    async def unexpected(request: Request, exc: Exception) -> Response:
        fault = classify(exc)  # a database fault: 503 with Retry-After
        if fault is not None:
            log.warning("database %s on %s: %s", fault.kind, request.url.path, fault.detail)
            return error_response(fault_problem(fault))
        log.error("unexpected error on %s", request.url.path, exc_info=exc)
        return error_response(OpenAIError("The server had an error.", status=500))

    app.add_exception_handler(CarryoverError, refusal)
    app.add_exception_handler(RequestValidationError, validation)
    app.add_exception_handler(StarletteHTTPException, http)
    for database_error in DATABASE_ERRORS:
        app.add_exception_handler(database_error, unexpected)
    app.add_exception_handler(Exception, unexpected)


class OpenAIErrorsMiddleware:
    """Problems answered under ``/v1`` by the native middleware (authentication, body limit)
    rewritten into OpenAI's shape, with their status mapped as :func:`openai_error` maps it.
    Only problem+json answers are read; everything else passes untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not (path == PREFIX or path.startswith(PREFIX + "/")):
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        chunks: list[bytes] = []

        async def rewrite(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers") or [])
                if headers.get(b"content-type", b"").startswith(PROBLEM_MEDIA_TYPE.encode()):
                    start = message
                    return
            elif start is not None and message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if message.get("more_body"):
                    return
                await _send_rewritten(send, start, b"".join(chunks))
                return
            await send(message)

        await self.app(scope, receive, rewrite)


async def _send_rewritten(send: Send, start: Message, body: bytes) -> None:
    problem = json.loads(body)
    slug = str(problem.get("type", "")).rsplit("/", 1)[-1]
    refusal = CarryoverError(str(problem.get("detail") or problem.get("title") or ""))
    refusal.slug = slug
    refusal.status = int(problem.get("status") or start["status"])
    status, payload, _ = openai_error(refusal)
    encoded = json.dumps(payload).encode()
    headers = [
        (k, v)
        for k, v in start.get("headers") or []
        if k not in (b"content-type", b"content-length")
    ]
    headers += [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(encoded)).encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": encoded})


__all__ = [
    "PREFIX",
    "OpenAIError",
    "OpenAIErrorsMiddleware",
    "bad_request",
    "error_response",
    "install_error_handlers",
    "openai_error",
]
