"""The services on a fresh database (SQLite and PostgreSQL), with a clock the test moves."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from app.clock import ManualClock
from app.config import Settings
from app.service.agents import AgentPool
from app.service.conversations import ConversationService
from app.service.runs import RunManager
from app.store.db import make_engine
from tests.repository import Repository

TENANT = "acme"


@dataclass
class Services:
    conversations: ConversationService
    runs: RunManager
    repo: Repository
    clock: ManualClock


@pytest.fixture
async def services(database_url: str, clock: ManualClock) -> AsyncIterator[Services]:
    settings = Settings(database_url=database_url, lease_seconds=30, idempotency_ttl_seconds=600)
    engine = make_engine(database_url)
    repo = Repository(engine, clock)
    pool = AgentPool(settings)
    runs = RunManager(repo, pool, settings, clock)
    try:
        yield Services(ConversationService(repo, runs), runs, repo, clock)
    finally:
        await runs.aclose()
        await pool.aclose()
        await engine.dispose()
