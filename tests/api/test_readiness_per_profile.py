"""``/readyz`` reports each agent profile: one that cannot run (its key is unset) is named with
why and its runs answer 503, while the server stays ready as long as a profile can run; with no
profile able to run it is not ready."""

from __future__ import annotations

import pytest

from app.config import AgentProfile

from ..helpers import assert_problem
from .conftest import AppClient, SettingsFactory, start_client

WHY = "its anthropic key variable CARRYOVER_TEST_NO_SUCH_KEY is not set"


@pytest.fixture(autouse=True)
def no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CARRYOVER_TEST_NO_SUCH_KEY", raising=False)


def keyless() -> AgentProfile:
    return AgentProfile(
        provider="anthropic", model="claude-x", api_key_env="CARRYOVER_TEST_NO_SUCH_KEY"
    )


async def test_one_profile_without_its_key_leaves_the_server_ready(
    make_settings: SettingsFactory,
) -> None:
    app, client = await start_client(make_settings(agents={"claude": keyless()}))
    async with app.router.lifespan_context(app), client:
        got = await client.get("/readyz")
        assert got.status_code == 200, got.text
        body = got.json()
        assert body["status"] == "ready"
        assert body["profiles"] == {
            "claude": {"ready": False, "reason": WHY},
            "default": {"ready": True, "reason": None},
        }
        assert body["unready_profiles"] == {"claude": WHY}
        # the ready profile runs, the other answers 503 naming its key
        await client.post("/conversations", json={"id": "c"})
        ran = await client.post("/conversations/c/runs", json={"prompts": ["hi"]})
        assert ran.status_code == 201 and ran.json()["status"] == "completed"
        refused = await client.post(
            "/conversations/c/runs", json={"prompts": ["hi"], "agent": "claude"}
        )
        assert "CARRYOVER_TEST_NO_SUCH_KEY" in assert_problem(refused, 503, "not-ready")["detail"]


async def test_no_profile_that_can_run_is_not_ready(make_settings: SettingsFactory) -> None:
    app, client = await start_client(make_settings(agents={"default": keyless()}))
    async with app.router.lifespan_context(app), client:
        got = await client.get("/readyz")
        assert got.status_code == 503, got.text
        body = got.json()
        assert body["status"] == "not_ready" and body["database"] is True
        assert body["profiles"] == {"default": {"ready": False, "reason": WHY}}


async def test_readiness_is_documented_in_the_openapi_document(client: AppClient) -> None:
    document = (await client.get("/openapi.json")).json()
    readiness = document["components"]["schemas"]["Readiness"]
    assert "profiles" in readiness["properties"]
    assert "at least" in document["paths"]["/readyz"]["get"]["description"]
