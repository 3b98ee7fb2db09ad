"""What a streamed answer costs in SDK objects: none. Each chunk (OpenAI) or event (Anthropic)
reaches the translator as the SDK decoded it, a dict; the SDK builds no model per chunk
(docs/performance.md, "Where a run's time goes"). Counted through the SDKs' one entry to their
model construction (``_process_response_data`` → ``construct_type``), never timed."""

from __future__ import annotations

from typing import Any

import pytest

from app.config import AgentProfile
from tests.fakes import anthropic_fake as A
from tests.fakes import openai_fake as O

from .conftest import CLAUDE, GPT, Serve


def _constructions(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The types the SDKs build response objects of (each a walk of the decoded JSON)."""
    import anthropic._base_client as anthropic_client
    import openai._base_client as openai_client

    built: list[Any] = []
    for module in (openai_client, anthropic_client):
        original = module.construct_type

        def counting(*, type_: Any, value: Any, _original: Any = original, **kw: Any) -> Any:
            built.append(type_)
            return _original(type_=type_, value=value, **kw)

        monkeypatch.setattr(module, "construct_type", counting)
    return built


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_streamed_answer_builds_no_sdk_model_per_chunk(
    serve: Serve,
    openai_fake: O.OpenAIFake,
    anthropic_fake: A.AnthropicFake,
    monkeypatch: pytest.MonkeyPatch,
    provider: str,
) -> None:
    if provider == "openai":
        profile = AgentProfile(
            provider="openai", model=GPT, base_url=openai_fake.base_url, api_key_env="FAKE_KEY"
        )
        monkeypatch.setenv("FAKE_KEY", openai_fake.api_key)
        openai_fake.add(*(O.Reply(text=f"answer number {i}, in pieces") for i in range(2)))
    else:
        profile = AgentProfile(
            provider="anthropic",
            model=CLAUDE,
            base_url=anthropic_fake.base_url,
            api_key_env="FAKE_KEY",
        )
        monkeypatch.setenv("FAKE_KEY", anthropic_fake.api_key)
        anthropic_fake.add(*(A.Reply([A.Text(f"answer number {i}, in pieces")]) for i in range(2)))
    assert profile.stream  # the default: the provider streams
    built = _constructions(monkeypatch)
    async with serve(agents={"default": profile}) as client:
        created = await client.post("/conversations", json={"id": "c", "system_prompt": "Hi."})
        assert created.status_code == 201, created.text
        for i in range(2):
            run = await client.post("/conversations/c/runs", json={"prompts": [f"p{i}"]})
            assert run.status_code == 201, run.text
            assert run.json()["status"] == "completed", run.json()["error"]
            assert run.json()["final"]["content"][0]["text"] == f"answer number {i}, in pieces"
    assert built == []


async def test_streamed_anthropic_runs_reuse_one_connection(
    serve: Serve, anthropic_fake: A.AnthropicFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    # After message_stop the rest of the body (its end) is read, so the connection goes back
    # to the client's pool: the next run does not open one again. Counted where the fake
    # accepts connections, never timed.
    profile = AgentProfile(
        provider="anthropic", model=CLAUDE, base_url=anthropic_fake.base_url, api_key_env="FAKE_KEY"
    )
    monkeypatch.setenv("FAKE_KEY", anthropic_fake.api_key)
    anthropic_fake.add(*(A.Reply([A.Text(f"answer number {i}")]) for i in range(3)))
    async with serve(agents={"default": profile}) as client:
        created = await client.post("/conversations", json={"id": "c", "system_prompt": "Hi."})
        assert created.status_code == 201, created.text
        for i in range(3):
            run = await client.post("/conversations/c/runs", json={"prompts": [f"p{i}"]})
            assert run.status_code == 201, run.text
            assert run.json()["status"] == "completed", run.json()["error"]
    assert len(anthropic_fake.message_requests) == 3
    assert anthropic_fake.connections == 1
