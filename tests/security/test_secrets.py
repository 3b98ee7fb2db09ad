"""Secrets never leave (contract §6): provider keys and API keys appear in no log record, error,
problem body, run record, transcript or metric — including when a provider echoes the key
back in its error, when a run fails, and when a caller presents a wrong or mangled key."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from app.config import AgentProfile, Settings
from tests.fakes import anthropic_fake as A
from tests.fakes import openai_fake as O

from .conftest import ACME_KEY, API_KEYS, GLOBEX_KEY, StartApp, http_client
from .test_auth import create_key

OPENAI_SECRET = "sk-proj-Zq81mW3vXyS7OpenAiSecret0042"
ANTHROPIC_SECRET = "sk-ant-api03-Kp5Rt9AnthropicSecret7731"
OTHER_SECRET = "team-WXQ7-local-model-secret-9913"  # no sk- prefix: only the exact value helps


@pytest.fixture
def fakes() -> Iterator[tuple[O.OpenAIFake, A.AnthropicFake]]:
    with (
        O.OpenAIFake(api_key=OPENAI_SECRET) as openai,
        A.AnthropicFake(api_key=ANTHROPIC_SECRET) as anthropic,
    ):
        yield openai, anthropic


@pytest.fixture(autouse=True)
def provider_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_SECRET)
    monkeypatch.setenv("ANTHROPIC_API_KEY", ANTHROPIC_SECRET)
    monkeypatch.setenv("LOCAL_MODEL_KEY", OTHER_SECRET)


def secrets_in(text: str, secrets: list[str]) -> list[str]:
    """The secrets, or recognisable pieces of them, that ``text`` holds."""
    found = []
    for secret in secrets:
        pieces = {secret, secret[-12:], secret[3:15]}
        found += [piece for piece in pieces if piece in text]
    return found


async def test_no_secret_in_logs_errors_records_or_metrics(
    start_app: StartApp,
    database_url: str,
    fakes: tuple[O.OpenAIFake, A.AnthropicFake],
    caplog: pytest.LogCaptureFixture,
) -> None:
    openai, anthropic = fakes
    _, stored_key = await create_key(database_url, "initech")
    secrets = [OPENAI_SECRET, ANTHROPIC_SECRET, OTHER_SECRET, ACME_KEY, GLOBEX_KEY, stored_key]
    caplog.set_level(logging.DEBUG)  # every logger, the SDKs' and httpx's included

    # Providers: a good answer, then errors that echo the key whole, and a wrong key.
    openai.add(
        O.Reply(text="fine"),
        O.Error(401, f"Incorrect API key provided: {OPENAI_SECRET}.", code="invalid_api_key"),
        O.Error(500, f"upstream failed for key {OPENAI_SECRET}", type="server_error"),
    )
    anthropic.add(
        A.Reply([A.Text("fine")]),
        A.Error(403, "permission_error", f"key {ANTHROPIC_SECRET} may not"),
    )
    profiles = {
        "gpt": AgentProfile(
            provider="openai",
            model="gpt-fake",
            base_url=openai.base_url,
            max_retries=0,
            api_key=Settings().openai_api_key,
        ),
        "claude": AgentProfile(
            provider="anthropic",
            model="claude-fake",
            max_retries=0,
            base_url=anthropic.base_url,
            api_key=Settings().anthropic_api_key,
        ),
        "local": AgentProfile(
            provider="openai",
            model="gpt-fake",
            base_url=openai.base_url,
            max_retries=0,
            api_key_env="LOCAL_MODEL_KEY",
        ),
    }
    answers: list[httpx.Response] = []
    async with start_app(api_keys=API_KEYS, agents=profiles) as app:
        acme = http_client(app, ACME_KEY)
        answers.append(await acme.post("/conversations", json={"id": "leak"}))
        for agent in ("gpt", "gpt", "gpt", "claude", "claude", "local", "default"):
            answers.append(
                await acme.post(
                    "/conversations/leak/runs",
                    json={"agent": agent, "prompts": ["/fail" if agent == "default" else "hello"]},
                )
            )
        # callers with wrong, mangled and misplaced keys
        for client in (
            http_client(app, ACME_KEY + "x"),
            http_client(app, ACME_KEY[:-1]),
            http_client(app, None, Authorization=f"Basic {GLOBEX_KEY}"),
            http_client(app, None, Authorization=f"Token {stored_key}"),
            http_client(app, stored_key[:-2]),
        ):
            answers.append(await client.get("/conversations/leak"))
            answers.append(await client.post("/conversations/leak/runs", json={"prompts": ["hi"]}))
        initech = http_client(app, stored_key)
        answers.append(await initech.get("/conversations/leak"))  # 404: acme's
        answers.append(
            await acme.post("/conversations/leak/runs", json={"agent": "nope", "prompts": ["x"]})
        )
        records = [
            await acme.get("/conversations/leak/runs"),
            await acme.get("/conversations/leak/transcript"),
            await acme.get("/conversations/leak/context"),
            await acme.get("/conversations/leak"),
        ]
        runs = records[0].json()["items"]
        records += [await acme.get(f"/conversations/leak/runs/{r['run_id']}") for r in runs]
        metrics = await acme.get("/metrics")
        openapi = await acme.get("/openapi.json")

    statuses = [r.json()["status"] for r in answers[1:8]]
    assert statuses == [
        "completed",
        "failed",
        "failed",
        "completed",
        "failed",
        "failed",
        "failed",
    ], [a.text[:200] for a in answers[1:8]]
    assert [r.status_code for r in answers[8:18]] == [401] * 10
    assert answers[18].status_code == 404 and answers[19].status_code == 422
    assert len(runs) == 7 and metrics.status_code == 200
    # the failures carry the provider's words, scrubbed
    errors = [r["error"]["detail"] for r in runs if r["error"]]
    assert any("[redacted]" in e for e in errors), errors

    everything = {
        "answers": "\n".join(f"{r.headers}\n{r.text}" for r in answers),
        "records": "\n".join(r.text for r in records),
        "metrics": metrics.text,
        "openapi": openapi.text,
        "logs": caplog.text
        + "\n".join(
            f"{r.getMessage()} {r.exc_text or ''} {json.dumps(vars(r), default=str)}"
            for r in caplog.records
        ),
    }
    for where, text in everything.items():
        assert secrets_in(text, secrets) == [], where
    assert caplog.records  # the logs were captured at all
    # the providers did get their keys
    assert openai.requests[0].headers["authorization"] == f"Bearer {OPENAI_SECRET}"
    sent = anthropic.requests[0].headers
    assert ANTHROPIC_SECRET in (sent.get("x-api-key"), sent.get("authorization", "")[7:])


def test_settings_never_print_a_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CARRYOVER_API_KEYS", API_KEYS)
    monkeypatch.setenv("CARRYOVER_DATABASE_URL", "postgresql://carryover:pg-Secret-77@db/x")
    settings = Settings()
    secrets = [OPENAI_SECRET, ANTHROPIC_SECRET, ACME_KEY, GLOBEX_KEY, "pg-Secret-77"]
    shown: list[Any] = [
        repr(settings),
        str(settings),
        settings.model_dump_json(),
        repr(settings.profiles()),
        settings.database_url_display,
    ]
    for text in shown:
        assert secrets_in(str(text), secrets) == [], text
    assert set(settings.secret_values()) >= set(secrets)
