"""The whole service against the fake providers: HTTP → store → provider → store.

Each test configures the app with agent profiles that point at a fake (``base_url``), the way a
deployment points at a real provider, creates a conversation over HTTP and runs it turn after
turn. Every request a run makes is validated by the fake the way the real API validates it, so a
history that is stored or replayed wrongly fails the run (the fake answers 400).

Fixtures: ``serve`` (the app on a fresh migrated database per test, SQLite and PostgreSQL, via
``make_settings`` of ``tests/api``), ``openai_fake`` / ``anthropic_fake`` / ``responses_fake``
(``tests/fakes``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import replace
from typing import Any

import pytest

from app.agent.retry import RetryPolicy
from app.agent.run import Agent
from app.config import Settings
from app.service.agents import AgentPool
from tests.api.conftest import AppClient, SettingsFactory, start_client
from tests.api.conftest import make_settings as make_settings
from tests.fakes.anthropic_fake import anthropic_fake as anthropic_fake
from tests.fakes.openai_fake import openai_fake as openai_fake
from tests.fakes.openai_responses_fake import responses_fake as responses_fake

CLAUDE = "claude-fake-1"
GPT = "gpt-fake-1"


@pytest.fixture(autouse=True)
def _no_provider_keys_from_the_machine(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Keys come only from what each test sets."""
    for name in (
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "CARRYOVER_PROVIDER",
        "CARRYOVER_MODEL",
        "CARRYOVER_BASE_URL",
        "CARRYOVER_CONFIG_FILE",
        "CARRYOVER_AGENTS",
    ):
        monkeypatch.delenv(name, raising=False)
    yield


Serve = Callable[..., AbstractAsyncContextManager[AppClient]]


@pytest.fixture
def serve(make_settings: SettingsFactory) -> Serve:
    """``async with serve(**settings) as client``: the real app on a fresh database, configured
    by ``Settings`` keyword arguments (``agents={...}``, ``config_file=...``), with its own
    ``AgentPool`` built from them unless ``pool=`` gives one. Its lease lasts 30 s: these tests
    are about providers, not leases, and on a loaded machine a run with several provider calls
    can outlast the 2 s the API tests use, its lease then lapsing on the wall clock."""

    @asynccontextmanager
    async def factory(
        pool: Callable[[Settings], AgentPool] | None = None, **overrides: Any
    ) -> AsyncIterator[AppClient]:
        settings = make_settings(**{"lease_seconds": 30.0, **overrides})
        app, http = await start_client(settings, pool(settings) if pool else None)
        async with app.router.lifespan_context(app), http:
            yield http

    return factory


def fast_retries(*names: str) -> Callable[[Settings], AgentPool]:
    """For ``serve(pool=...)``: the service's own pool (providers built from the profiles by
    ``build_provider``), with the named agents' backoff shortened so a burst of retries does not
    slow the suite. The number of retries stays the profile's ``max_retries``; ``retry-after``
    is capped at 50 ms."""

    def build(settings: Settings) -> AgentPool:
        pool = AgentPool(settings)
        for name in names:
            agent = pool.get(name)
            policy = RetryPolicy(
                max_retries=agent.config.retry.max_retries,
                base_delay=0.01,
                max_delay=0.05,
                jitter=0.0,
            )
            pool.put(name, Agent(replace(agent.config, retry=policy)))
        return pool

    return build


class Conversation:
    """One conversation driven over HTTP."""

    def __init__(self, client: AppClient, conversation_id: str) -> None:
        self.client = client
        self.id = conversation_id

    @classmethod
    async def create(cls, client: AppClient, system_prompt: str = "") -> Conversation:
        response = await client.post("/conversations", json={"system_prompt": system_prompt})
        assert response.status_code == 201, response.text
        return cls(client, response.json()["id"])

    async def run(self, prompt: str, agent: str = "default", **extra: Any) -> dict[str, Any]:
        """POST a run; returns its body (the HTTP answer is always 201 once a run started)."""
        response = await self.client.post(
            f"/conversations/{self.id}/runs",
            json={"prompts": [prompt], "agent": agent, **extra},
        )
        assert response.status_code == 201, response.text
        body: dict[str, Any] = response.json()
        assert response.headers["location"] == f"/conversations/{self.id}/runs/{body['run_id']}"
        return body

    async def completed(self, prompt: str, agent: str = "default") -> dict[str, Any]:
        body = await self.run(prompt, agent)
        assert body["status"] == "completed", body["error"]
        assert body["stored"] is True
        return body

    async def record(self, run_id: str) -> dict[str, Any]:
        response = await self.client.get(f"/conversations/{self.id}/runs/{run_id}")
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    async def context(self) -> dict[str, Any]:
        response = await self.client.get(f"/conversations/{self.id}/context")
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    async def transcript(self) -> list[dict[str, Any]]:
        response = await self.client.get(
            f"/conversations/{self.id}/transcript", params={"limit": 200}
        )
        assert response.status_code == 200, response.text
        items: list[dict[str, Any]] = response.json()["items"]
        return items


def kinds(messages: list[dict[str, Any]]) -> list[str]:
    return [m["type"] for m in messages]


def blocks(message: dict[str, Any]) -> list[str]:
    return [b["type"] for b in message["content"]]


def attempts(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The assistant attempts of a run record, in order."""
    return [m for m in body["new_messages"] if m["type"] == "assistant"]
