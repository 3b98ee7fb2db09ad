"""An HTTP client on the real app over a fresh, migrated database (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from app.api.app import create_app
from app.clock import SYSTEM_CLOCK, Clock
from app.config import Settings
from app.service.agents import AgentPool

SettingsFactory = Callable[..., Settings]


@pytest.fixture
def make_settings(database_url: str) -> SettingsFactory:
    """Settings on the test database; keyword arguments override (e.g. ``api_keys=...``)."""

    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "database_url": database_url,
            "lease_seconds": 2.0,
            "busy_wait_seconds": 5.0,
        }
        values.update(overrides)
        return Settings(**values)

    return make


class AppClient(httpx.AsyncClient):
    """An httpx client whose app is started (lifespan) and stopped with it."""

    app: Any


async def start_client(
    settings: Settings, agents: AgentPool | None = None, clock: Clock = SYSTEM_CLOCK
) -> tuple[Any, AppClient]:
    app = create_app(settings, agents=agents, clock=clock)
    client = AppClient(transport=httpx.ASGITransport(app=app), base_url="http://carryover.test")
    client.app = app
    return app, client


@pytest.fixture
async def client(make_settings: SettingsFactory) -> AsyncIterator[AppClient]:
    settings = make_settings()
    app, http = await start_client(settings)
    async with app.router.lifespan_context(app), http:
        yield http


def apps(make_settings: SettingsFactory, clock: Clock = SYSTEM_CLOCK) -> Callable[..., Any]:
    """``async with apps(agents=..., **settings) as client``: a started app on the test
    database, with the settings overridden, on ``clock``."""

    @asynccontextmanager
    async def start(agents: AgentPool | None = None, **overrides: Any) -> AsyncIterator[AppClient]:
        app, http = await start_client(make_settings(**overrides), agents, clock)
        async with app.router.lifespan_context(app), http:
            yield http

    return start


@pytest.fixture
def app_factory(make_settings: SettingsFactory) -> Callable[..., Any]:
    """Start more apps on the same database: ``async with app_factory(**settings) as client``."""
    return apps(make_settings)
