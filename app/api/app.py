"""The FastAPI application: routes, problem handlers, middleware, and the services' lifetime."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from app import __version__, telemetry
from app.clock import SYSTEM_CLOCK, Clock
from app.config import Settings, default_settings, get_settings
from app.observability import MetricsMiddleware
from app.service import heap
from app.service.agents import AgentPool
from app.service.conversations import ConversationService
from app.service.runs import RunManager
from app.service.webhooks import WebhookWorker
from app.store.db import make_engine
from app.store.keys import KeyStore
from app.store.stores import Stores

from .auth import Authenticator, AuthMiddleware, announce_access
from .console import install_console
from .deps import Services
from .docs_pages import install_docs_pages
from .handlers import install_problem_handlers
from .limits import BodyLimitMiddleware
from .links import install_links
from .problems import METHOD_NOT_ALLOWED, document_problem_types, problem_response
from .routes import conversations, events, health, runs, transcript, usage
from .v1 import PREFIX as V1_PREFIX
from .v1 import OpenAIErrorsMiddleware, create_v1_app
from .views import record_view, run_problem_slug

DESCRIPTION = """\
Carryover stores each conversation's state and continues it run after run: it loads the
stored Context, runs the agent on new prompts, and stores the returned Context with a
conditional write, so a stale writer never overwrites a newer state.

Every error is an RFC 9457 `application/problem+json` with a stable `type`.
"""


#: the document's sections, in the order a reader meets them (the routes themselves are matched
#: in another order: the run routes first, see :func:`create_app`)
TAGS = [
    {"name": "conversations", "description": "Conversations, their stored context and versions"},
    {"name": "runs", "description": "Runs of the agent on a conversation, and their events"},
    {
        "name": "transcript",
        "description": "A conversation's append-only record: every prompt, attempt, tool "
        "result and compaction, never rewritten",
    },
    {"name": "usage", "description": "The tenant's runs and tokens by day, and its quota"},
    {"name": "health", "description": "Liveness, readiness and metrics"},
]


def _operation_id(route: APIRoute) -> str:
    """Readable operation ids for generated clients (``create_run``, not ``create_run_post``)."""
    return route.name


#: the methods a 405's ``Allow`` may name (RFC 9110 §9), in the order it names them
_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(app: FastAPI, scope: Any) -> list[str]:
    """Every method some route answers at the request's path (what a 405's ``Allow`` lists,
    RFC 9110 §15.5.6); Starlette's own 405 names only the first route whose path matched.
    Asked of the router itself, so included routers and path converters count as they route."""
    # a concrete path is matched before a templated one (OpenAPI 3.1 §4.8.8): the resource at
    # /conversations/import is the import, whatever /conversations/{id} would also match
    concrete = app.openapi().get("paths", {}).get(scope.get("path"))
    if concrete is not None:
        return [m for m in _METHODS if m.lower() in concrete]
    found = []
    for method in _METHODS:
        probe = {**scope, "method": method}
        if any(route.matches(probe)[0] is Match.FULL for route in app.router.routes):
            found.append(method)
    return found


def install_method_not_allowed(app: FastAPI) -> None:
    """Answer 405 as a problem whose ``Allow`` lists all the resource's methods."""

    async def method_not_allowed(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        headers = dict(exc.headers or {})
        headers["Allow"] = ", ".join(allowed_methods(app, request.scope))
        default = exc.detail in (None, "", "Method Not Allowed")
        detail = f"{request.method} is not allowed on {request.url.path}" if default else exc.detail
        return problem_response(
            METHOD_NOT_ALLOWED, detail, instance=request.url.path, headers=headers
        )

    app.add_exception_handler(405, method_not_allowed)


def _parameter_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A parameter's schema without the ``null`` branch FastAPI gives an optional one (``str |
    None``): a header or query value is absent or a string, never ``null`` — a generator taking
    the document at its word would send the text ``null``."""
    branches = schema.get("anyOf")
    if not isinstance(branches, list):
        return schema
    others = [b for b in branches if b != {"type": "null"}]
    if len(others) != 1 or len(others) == len(branches):
        return schema
    rest = {k: v for k, v in schema.items() if k != "anyOf"}
    return {**others[0], **rest}


def install_parameter_schemas(
    app: FastAPI, max_page_size: int, settings: Settings | None = None
) -> None:
    """Make the parameters of the document as exact as the server: no ``null`` for an optional
    one, and ``limit`` bounded by this app's ``max_page_size`` (the committed document is built
    from the default settings). Beyond it the server answers 422 ``limit-exceeded``, so the
    bound is written here rather than enforced by FastAPI."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        schema = generate()
        for operations in schema.get("paths", {}).values():
            for operation in operations.values():
                for parameter in operation.get("parameters", []):
                    parameter["schema"] = _parameter_schema(parameter["schema"])
                    if parameter["in"] == "query" and parameter["name"] == "limit":
                        parameter["schema"]["maximum"] = max_page_size
        document_problem_types(schema)
        if settings is not None:
            conversations.document_metadata(schema, settings)
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def create_app(
    settings: Settings | None = None,
    *,
    agents: AgentPool | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> FastAPI:
    """Build the app. Tests pass settings (a pool with fake agents, a clock they move);
    ``carryover serve`` calls it without arguments, so the environment configures it."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = make_engine(settings.database_url)
        telemetry.instrument_engine(engine)
        pool = agents or AgentPool(settings)
        stores = Stores(engine, clock)
        manager = RunManager(stores, pool, settings, clock, problem_slug=run_problem_slug)
        keys = KeyStore(engine, clock)
        auth = Authenticator(
            settings.api_keys,
            keys,
            settings.api_key_cache_seconds,
            failure_limit=settings.auth_failure_limit,
            failure_window=settings.auth_failure_window_seconds,
        )
        app.state.services = Services(
            settings=settings,
            engine=engine,
            agents=pool,
            stores=stores,
            conversations=ConversationService(stores, manager),
            runs=manager,
            auth=auth,
        )
        v1.state.services = app.state.services  # the /v1 surface uses the same services
        await announce_access(auth)
        await manager.start_keeper()
        heap.tune(settings.gc_gen0_threshold)
        webhooks = WebhookWorker(stores, settings, clock, lambda r: record_view(r).body())
        if settings.webhook_worker:
            await webhooks.start()
        try:
            yield
        finally:
            await webhooks.aclose()
            await manager.aclose()
            await pool.aclose()
            await engine.dispose()

    app = FastAPI(
        title="Carryover",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        generate_unique_id_function=_operation_id,
        docs_url=None,  # /docs and /redoc come from the package, not a CDN (docs_pages.py)
        redoc_url=None,
        telemetry=telemetry.FASTAPI_TELEMETRY,
        openapi_tags=TAGS,
    )
    install_problem_handlers(app)
    install_method_not_allowed(app)
    install_links(app)
    install_parameter_schemas(app, settings.max_page_size, settings)

    # matched in this order: the run routes first, as a run is the request that matters most
    # (FastAPI tries each route of each router in turn; none of these paths overlaps another)
    for module in (runs, conversations, events, transcript, health, usage):
        app.include_router(module.router)
    install_docs_pages(app)
    install_console(app)  # GET /console (docs/console.md), outside the document
    v1 = create_v1_app()  # OpenAI's Responses and Conversations API (its own document)
    app.mount(V1_PREFIX, v1)

    # Outermost last: metrics → CORS → authentication → body limit → routes. CORS answers
    # preflights (which carry no key) and adds its headers to 401s; nothing reads a body
    # before its sender is authenticated.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(AuthMiddleware, public_metrics=settings.public_metrics)
    app.add_middleware(OpenAIErrorsMiddleware)  # /v1: their problems in OpenAI's shape
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "POST", "PUT", "DELETE", "OPTIONS"],
            allow_headers=[
                "Authorization",
                "Content-Type",
                "If-Match",
                "If-None-Match",
                "Prefer",
                "Idempotency-Key",
                "Accept",
            ],
            expose_headers=["ETag", "Location", "Retry-After", "Idempotent-Replayed"],
        )
    app.add_middleware(MetricsMiddleware)
    telemetry.configure()
    telemetry.instrument_app(app)
    return app


def openapi_document() -> dict[str, Any]:
    """The document the app serves, without starting it, as ``carryover openapi`` writes it:
    from the default settings, so the environment (and its secrets) never reach it."""
    return create_app(default_settings()).openapi()
