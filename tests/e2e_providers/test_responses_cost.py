"""What a run on the ``openai-responses`` provider costs: O(what changed), not O(history).

As tests/e2e_providers/test_request_cost.py does for the other providers: a long conversation is
PUT, then run several times, streamed and not, against the strict fake (which checks that each
request carried the whole history, every reasoning item exactly as issued). Meanwhile the test
counts the messages encoded into ``input`` items (``request._items``), the SDK's own encodings of
a request body, and the SDK models built from the answers: the history is encoded once (the
first run of a process that has not seen the conversation, in a worker thread), every later run
encodes only what it appended, and the SDK neither encodes a request nor builds a model of an
answer or of a streamed event.
"""

from __future__ import annotations

from typing import Any

import pytest

from app.agent.providers.openai_responses import request as responses_request
from app.config import AgentProfile
from tests.fakes import openai_responses_fake as R

from .conftest import GPT, Serve
from .test_request_cost import HISTORY, _Counted, _history


def _sdk_calls(monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[Any]]:
    """The openai SDK's encodings of a request body and the types it built answers of."""
    import openai._base_client as client

    encodings: list[int] = []
    built: list[Any] = []
    dumps, construct = client.openapi_dumps, client.construct_type

    def counting_dumps(obj: Any) -> bytes:
        encodings.append(1)
        encoded: bytes = dumps(obj)
        return encoded

    def counting_construct(*, type_: Any, value: Any, **kw: Any) -> Any:
        built.append(type_)
        return construct(type_=type_, value=value, **kw)

    monkeypatch.setattr(client, "openapi_dumps", counting_dumps)
    monkeypatch.setattr(client, "construct_type", counting_construct)
    return encodings, built


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
async def test_a_run_encodes_what_it_appended_not_the_history(
    serve: Serve,
    responses_fake: R.ResponsesFake,
    monkeypatch: pytest.MonkeyPatch,
    stream: bool,
) -> None:
    encoded = _Counted()
    monkeypatch.setattr(responses_request, "_items", encoded.wrap(responses_request._items))
    monkeypatch.setenv("FAKE_KEY", responses_fake.api_key)
    profile = AgentProfile(
        provider="openai-responses",
        model=GPT,
        base_url=responses_fake.base_url,
        api_key_env="FAKE_KEY",
        stream=stream,
    )
    responses_fake.add(
        *(R.Reply([R.Reasoning(f"thought {i}"), R.Text(f"answer {i}")]) for i in range(3))
    )
    sdk_encodings, sdk_models = _sdk_calls(monkeypatch)
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

    assert responses_fake.rejections == []
    requests = responses_fake.response_requests
    assert len(requests) == 3
    for i, request in enumerate(requests):
        sent = request.json["input"]
        # the whole history every time, plus what the earlier runs added (a reasoning item and
        # a message per answer)
        assert len(sent) == HISTORY + 3 * i + 1, (i, len(sent))
        assert sent[-1]["content"] == [{"type": "input_text", "text": f"p{i}"}]
        assert [x for x in sent if x["type"] == "reasoning"] == [
            responses_fake.reasoning[x["id"]] for x in sent if x["type"] == "reasoning"
        ]
    cold_loop, cold_threads = per_run[0]
    # the first run walks the history once, in a thread; on the loop only its prompt and answer
    assert cold_threads >= HISTORY and cold_loop <= 2, per_run
    for on_loop, in_threads in per_run[1:]:
        assert in_threads == 0 and on_loop <= 2, per_run  # the prompt and the answer
    assert sdk_encodings == []
    assert sdk_models == []  # answers and events are read as the SDK decoded them: dicts
