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

from app import __version__

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
    )
    install_error_handlers(app)
    app.include_router(conversations.router)
    app.include_router(responses.router)
    return app


def v1_document() -> dict[str, Any]:
    """The document ``carryover openapi`` writes to ``openapi/v1.json``."""
    return create_v1_app().openapi()


__all__ = ["PREFIX", "OpenAIErrorsMiddleware", "create_v1_app", "v1_document"]
