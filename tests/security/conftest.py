"""Security tests run the real app over HTTP (httpx's ASGI transport) with two tenants, on a
fresh migrated database per test (SQLite and PostgreSQL).

- ``make_settings(**overrides)`` / ``app_factory`` / ``client``: as in ``tests/api``.
- ``tenants``: one app with ``CARRYOVER_API_KEYS`` for ``acme`` and ``globex``, and a client
  per caller: ``tenants.acme``, ``tenants.globex``, ``tenants.anonymous`` (no key).
- ``gated_tenants``: the same, with runs whose prompt starts with "held" held at ``gate`` (a
  :class:`~tests.fakes.gated.GatedProvider`) until the test releases them.
- ``snapshot(database_url)``: every row of every table, to check a refused request wrote
  nothing.
- ``fuzzed_database``: a migrated database URL for a whole fuzzing module, on the engines
  its ``pytestmark = fuzz_on(...)`` names.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from app.api.app import create_app
from app.config import Settings
from app.service.agents import AgentPool
from app.store.db import make_engine, read_transaction
from app.store.tables import metadata
from tests.api.conftest import (  # noqa: F401  (fixtures)
    AppClient,
    SettingsFactory,
    app_factory,
    client,
    make_settings,
)
from tests.conftest import BACKENDS, _copy_sqlite, _postgres_url, _require_postgres, _sqlite_url

from ..fakes.gated import GatedProvider, gated_pool

PROBLEM = "https://carryover.dev/problems/"
ACME_KEY = "acme-key-9f2c0d7e4b1a"
GLOBEX_KEY = "globex-key-3e8a6c5d2f90"
API_KEYS = f"acme:{ACME_KEY},globex:{GLOBEX_KEY}"

#: these tests send many wrong keys from one address: the throttle of failed authentication
#: has tests of its own (test_auth_throttle.py)
UNTHROTTLED = {"auth_failure_limit": 0}

Rows = dict[str, list[tuple[Any, ...]]]


#: a fuzzed operation's hang guard, in seconds (pytest-timeout; the suite's is 300): the
#: examples of a deep body (a conversation import) take minutes to generate on a busy 2-core
#: machine, CPU-bound in hypothesis, not waiting
FUZZ_TIMEOUT_SECONDS = 900


def fuzz_on(*engines: str) -> list[pytest.MarkDecorator]:
    """A fuzzing module's ``pytestmark``: its tests run once per engine named (``sqlite``,
    ``postgresql``), each on a ``fuzzed_database`` of its own. Each engine refuses values of
    its own (PostgreSQL: a NUL in text, an integer past 32 bits), so the API is fuzzed on
    both; a long module runs each engine in a module of its own, which a parallel run can put
    on two workers. Each test may take up to :data:`FUZZ_TIMEOUT_SECONDS`."""
    assert set(engines) <= set(BACKENDS), engines
    return [
        pytest.mark.parametrize("fuzzed_database", engines, indirect=True, scope="module"),
        pytest.mark.timeout(FUZZ_TIMEOUT_SECONDS),
    ]


@pytest.fixture(scope="module")
def fuzzed_database(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A fuzzing module's database, migrated, for the whole module, on the engine
    :func:`fuzz_on` names."""
    if request.param == "sqlite":
        path = tmp_path_factory.mktemp("schemathesis") / "carryover.db"
        _copy_sqlite(request.getfixturevalue("_sqlite_template"), path)
        yield _sqlite_url(path)
        return
    _require_postgres()
    pool = request.getfixturevalue("_postgres_pool")
    name = pool.take()
    try:
        yield _postgres_url(name)
    finally:
        pool.give_back(name)


async def snapshot(database_url: str) -> Rows:
    """Every row of every table, in primary key order."""
    engine = make_engine(database_url)
    try:
        rows: Rows = {}
        async with read_transaction(engine) as conn:
            for table in metadata.sorted_tables:
                order = list(table.primary_key.columns) or list(table.columns)
                result = await conn.execute(select(table).order_by(*order))
                rows[table.name] = [tuple(row) for row in result.all()]
        return rows
    finally:
        await engine.dispose()


def http_client(app: Any, key: str | None = None, **headers: str) -> AppClient:
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    http = AppClient(
        transport=httpx.ASGITransport(app=app), base_url="http://carryover.test", headers=headers
    )
    http.app = app
    return http


@dataclass
class Tenants:
    app: Any
    settings: Settings
    acme: AppClient
    globex: AppClient
    anonymous: AppClient

    def as_key(self, key: str) -> AppClient:
        return http_client(self.app, key)


StartApp = Callable[..., Any]


@pytest.fixture
def start_app(make_settings: SettingsFactory) -> StartApp:  # noqa: F811
    """``async with start_app(**settings) as app``: the real app with its lifespan running."""

    @asynccontextmanager
    async def start(**overrides: Any) -> AsyncIterator[Any]:
        app = create_app(make_settings(**overrides))
        async with app.router.lifespan_context(app):
            yield app

    return start


@asynccontextmanager
async def _tenants(settings: Settings, agents: AgentPool | None = None) -> AsyncIterator[Tenants]:
    app = create_app(settings, agents=agents)
    async with app.router.lifespan_context(app):
        clients = [http_client(app, ACME_KEY), http_client(app, GLOBEX_KEY), http_client(app)]
        try:
            yield Tenants(app, settings, *clients)
        finally:
            for http in clients:
                await http.aclose()


@pytest.fixture
async def tenants(make_settings: SettingsFactory) -> AsyncIterator[Tenants]:  # noqa: F811
    async with _tenants(make_settings(api_keys=API_KEYS, **UNTHROTTLED)) as found:
        yield found


@pytest.fixture
def gate() -> GatedProvider:
    """Holds the provider request of every run whose prompt starts with "held"."""
    return GatedProvider(hold=lambda prompt: prompt.startswith("held"))


@pytest.fixture
async def gated_tenants(
    make_settings: SettingsFactory,  # noqa: F811
    gate: GatedProvider,
) -> AsyncIterator[Tenants]:
    """``tenants`` whose default agent answers through ``gate``."""
    settings = make_settings(api_keys=API_KEYS, **UNTHROTTLED)
    async with _tenants(settings, gated_pool(settings, gate)) as found:
        try:
            yield found
        finally:
            gate.open()
