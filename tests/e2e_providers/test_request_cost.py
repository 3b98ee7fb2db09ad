"""What a run with a real provider costs in encoding: O(what changed), not O(history).

A long conversation is PUT, then run several times through the OpenAI-compatible and the
Anthropic provider against their fakes. The fakes check every request the way the real APIs do
and the test checks that each one carried the whole history; meanwhile it counts the messages
the provider mappings encode (``_Writer.add`` for Chat Completions, ``_turn_of`` for Messages)
and the SDKs' own encodings of a request body. The history is encoded once (the first run of a
process that has not seen the conversation), in a worker thread; every later run encodes only
what it appended, and the SDKs never encode a request themselves.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from app.agent.providers.anthropic import request as anthropic_request
from app.agent.providers.openai import request as openai_request
from app.config import AgentProfile
from tests.fakes import anthropic_fake as A
from tests.fakes import openai_fake as O

from .conftest import CLAUDE, GPT, Serve

HISTORY = 2_400  # past the point where a context's walks go to a worker thread


def _history(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(n):
        role = "user" if i % 2 == 0 else "assistant"
        out.append({"type": role, "content": [{"type": "text", "text": f"m{i} " + "x" * 40}]})
    return out


class _Counted:
    """Calls of a function, split by whether they ran on the event loop's thread."""

    def __init__(self) -> None:
        self.on_loop = 0
        self.in_threads = 0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kw: Any) -> Any:
            if threading.current_thread() is threading.main_thread():
                self.on_loop += 1
            else:
                self.in_threads += 1
            return fn(*args, **kw)

        return counted

    def take(self) -> tuple[int, int]:
        seen = (self.on_loop, self.in_threads)
        self.on_loop = self.in_threads = 0
        return seen


def _sdk_encodings(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the SDKs' own JSON encodings of a request body (each walks the whole body)."""
    import anthropic._base_client as anthropic_client
    import openai._base_client as openai_client

    calls: list[int] = []
    for module in (openai_client, anthropic_client):
        original = module.openapi_dumps

        def counting(obj: Any, _original: Any = original) -> bytes:
            calls.append(1)
            encoded: bytes = _original(obj)
            return encoded

        monkeypatch.setattr(module, "openapi_dumps", counting)
    return calls


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_run_encodes_what_it_appended_not_the_history(
    serve: Serve,
    openai_fake: O.OpenAIFake,
    anthropic_fake: A.AnthropicFake,
    monkeypatch: pytest.MonkeyPatch,
    provider: str,
) -> None:
    encoded = _Counted()
    if provider == "openai":
        monkeypatch.setattr(openai_request._Writer, "add", encoded.wrap(openai_request._Writer.add))
        profile = AgentProfile(
            provider="openai", model=GPT, base_url=openai_fake.base_url, api_key_env="FAKE_KEY"
        )
        monkeypatch.setenv("FAKE_KEY", openai_fake.api_key)
        openai_fake.add(*(O.Reply(text=f"answer {i}") for i in range(3)))
    else:
        monkeypatch.setattr(anthropic_request, "_turn_of", encoded.wrap(anthropic_request._turn_of))
        profile = AgentProfile(
            provider="anthropic",
            model=CLAUDE,
            base_url=anthropic_fake.base_url,
            api_key_env="FAKE_KEY",
        )
        monkeypatch.setenv("FAKE_KEY", anthropic_fake.api_key)
        anthropic_fake.add(*(A.Reply([A.Text(f"answer {i}")]) for i in range(3)))
    sdk_encodings = _sdk_encodings(monkeypatch)
    settings = {
        "agents": {"default": profile},
        "context_window": 10**8,
        "max_context_messages": 100_000,
        "max_body_bytes": 64 * 1024 * 1024,
    }
    async with serve(**settings) as client:
        body = {"system_prompt": "Be brief.", "messages": _history(HISTORY)}
        put = await client.put(
            "/conversations/long/context", json=body, headers={"If-None-Match": "*"}
        )
        assert put.status_code in (200, 201), put.text
        per_run: list[tuple[int, int]] = []
        for i in range(3):
            run = await client.post("/conversations/long/runs", json={"prompts": [f"p{i}"]})
            assert run.status_code == 201, run.text
            assert run.json()["status"] == "completed", run.json()["error"]
            per_run.append(encoded.take())

    fake = openai_fake if provider == "openai" else anthropic_fake
    assert fake.rejections == []
    requests = fake.chat_requests if provider == "openai" else fake.message_requests
    assert len(requests) == 3
    for i, request in enumerate(requests):
        sent = request.json["messages"]
        # the whole history every time, plus what the earlier runs added
        expected = HISTORY + 2 * i + 1 + (1 if provider == "openai" else 0)  # + system
        assert len(sent) == expected, (i, len(sent))
        assert sent[-1]["content"] in (f"p{i}", [{"type": "text", "text": f"p{i}"}])
    cold_loop, cold_threads = per_run[0]
    # the first run walks the history once, in a thread; on the loop only its prompt and answer
    assert cold_threads >= HISTORY and cold_loop <= 2, per_run
    for on_loop, in_threads in per_run[1:]:
        assert in_threads == 0 and on_loop <= 2, per_run  # the prompt and the answer
    assert sdk_encodings == []
