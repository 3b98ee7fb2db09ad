"""The OpenAI-compatible surface under ``/v1`` (docs/openai.md): OpenAI's Responses and
Conversations API over the native conversations and runs.

It is a FastAPI app of its own, mounted at ``/v1`` by :func:`app.api.app.create_app`: its own
OpenAPI document (``openapi/v1.json``), its own error handlers (OpenAI's error shape on every
refusal), and the native app's services (``state.services``), middleware (authentication,
body limit, metrics) and tenancy.

- :mod:`.errors`: the error shape; :mod:`.items`: items ↔ messages; :mod:`.views`: responses,
  conversations, usage; :mod:`.stream`: a run's events as OpenAI's streaming events;
  :mod:`.schemas`: request bodies; :mod:`.deps`: what the routes share;
- :mod:`.routes`: ``conversations`` (models, conversations, items), ``responses``.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from app import __version__
from app.observability import ROUTE_PREFIX_KEY
from app.telemetry import FASTAPI_TELEMETRY

from .errors import PREFIX, OpenAIErrorsMiddleware, install_error_handlers
from .routes import conversations, responses

DESCRIPTION = """\
OpenAI's Responses and Conversations API, served by Carryover over its own conversations:
point an OpenAI SDK at `http://HOST:PORT/v1` with a Carryover API key. Errors have OpenAI's
shape, `{"error": {"message", "type", "param", "code"}}`.
"""


def create_v1_app() -> FastAPI:
    """The ``/v1`` app; the native app mounts it and hands it its services when it starts."""
    app = FastAPI(
        title="Carryover — OpenAI-compatible API",
        version=__version__,
        description=DESCRIPTION,
        servers=[{"url": PREFIX}],
        generate_unique_id_function=lambda route: route.name,
        telemetry=FASTAPI_TELEMETRY,
    )
    install_error_handlers(app)
    app.add_middleware(_RoutePrefix)
    app.include_router(conversations.router)
    app.include_router(responses.router)
    document_errors(app)
    return app


class _RoutePrefix:
    """Its routes are counted in the metrics under ``/v1`` (app/observability.py)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope[ROUTE_PREFIX_KEY] = PREFIX
        await self.app(scope, receive, send)


#: OpenAI's error object, as every refusal of the surface carries it
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
            "required": ["message", "type", "param", "code"],
        }
    },
    "required": ["error"],
}
_ERRORS = {
    "400": "Invalid request (unknown or invalid parameter, unanswered function call)",
    "401": "Missing or invalid API key",
    "404": "Not found (or another tenant's)",
    "409": "The conversation is busy (`conversation_locked`)",
    "429": "The tenant's quota is spent",
    "500": "Server error",
    "503": "The database is not available",
}


def document_errors(app: FastAPI) -> None:
    """Every operation answers OpenAI's error object (never FastAPI's 422)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = generate()
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.pop("HTTPValidationError", None)
        components.pop("ValidationError", None)
        components["Error"] = ERROR_SCHEMA
        ref = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
        for operations in schema.get("paths", {}).values():
            for operation in operations.values():
                answers = operation.setdefault("responses", {})
                answers.pop("422", None)
                for status, description in _ERRORS.items():
                    answers.setdefault(status, {"description": description, "content": ref})
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def v1_document() -> dict[str, Any]:
    """The document ``carryover openapi`` writes to ``openapi/v1.json``."""
    return create_v1_app().openapi()


__all__ = ["PREFIX", "OpenAIErrorsMiddleware", "create_v1_app", "v1_document"]
