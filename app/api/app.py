"""The FastAPI application: routes, problem handlers, middleware, and the services' lifetime."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.routing import APIRoute

from app import __version__
from app.clock import SYSTEM_CLOCK, Clock
from app.config import Settings, default_settings, get_settings
from app.observability import MetricsMiddleware
from app.service.agents import AgentPool
from app.service.conversations import ConversationService
from app.service.runs import RunManager
from app.service.webhooks import WebhookWorker
from app.store.db import make_engine
from app.store.keys import KeyStore
from app.store.repository import Repository

from .auth import Authenticator, AuthMiddleware, announce_access
from .deps import Services
from .handlers import install_problem_handlers
from .limits import BodyLimitMiddleware
from .links import install_links
from .routes import conversations, events, health, runs, transcript
from .views import record_view

DESCRIPTION = """\
Carryover stores each conversation's state and continues it run after run: it loads the
stored Context, runs the agent on new prompts, and stores the returned Context with a
conditional write, so a stale writer never overwrites a newer state.

Every error is an RFC 9457 `application/problem+json` with a stable `type`.
"""


def _operation_id(route: APIRoute) -> str:
    """Readable operation ids for generated clients (``create_run``, not ``create_run_post``)."""
    return route.name


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
        pool = agents or AgentPool(settings)
        repo = Repository(engine, clock)
        manager = RunManager(repo, pool, settings, clock)
        keys = KeyStore(engine, clock)
        auth = Authenticator(settings.api_keys, keys, settings.api_key_cache_seconds)
        app.state.services = Services(
            settings=settings,
            engine=engine,
            agents=pool,
            conversations=ConversationService(repo, manager),
            runs=manager,
            auth=auth,
        )
        await announce_access(auth)
        await manager.start_keeper()
        webhooks = WebhookWorker(repo, settings, clock, lambda r: record_view(r).body())
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
    )
    install_problem_handlers(app)
    install_links(app)

    for module in (conversations, runs, events, transcript, health):
        app.include_router(module.router)

    # Outermost last: metrics → CORS → authentication → body limit → routes. CORS answers
    # preflights (which carry no key) and adds its headers to 401s; nothing reads a body
    # before its sender is authenticated.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(AuthMiddleware, public_metrics=settings.public_metrics)
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
    return app


def openapi_document() -> dict[str, Any]:
    """The document the app serves, without starting it, as ``carryover openapi`` writes it:
    from the default settings, so the environment (and its secrets) never reach it."""
    return create_app(default_settings()).openapi()
