"""Structured outputs and per-run settings over HTTP (echo, both database engines): a native
run's ``output_schema`` and ``output_parsed``, an answer corrected on retry and one that never
validates, an invalid schema refused; ``/v1``'s ``text.format``; the settings a profile lets a
run set, and the ones it refuses, on both surfaces."""

from __future__ import annotations

import json
from typing import Any

from app.config import AgentProfile
from app.service.agents import AgentPool

from ..helpers import assert_problem, until
from .conftest import AppClient, SettingsFactory, apps

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 2},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "kind": {"enum": ["trip", "stay"]},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
    },
    "required": ["city", "days", "kind", "tags"],
    "additionalProperties": False,
}
FORMAT = {"name": "plan", "schema": SCHEMA, "strict": True}


async def _conversation(client: AppClient, conv_id: str) -> None:
    created = await client.post("/conversations", json={"id": conv_id, "system_prompt": "Be."})
    assert created.status_code == 201, created.text


async def _run(client: AppClient, conv_id: str, **body: Any) -> Any:
    return await client.post(f"/conversations/{conv_id}/runs", json=body)


async def test_a_run_with_an_output_schema_answers_a_parsed_instance(client: AppClient) -> None:
    await _conversation(client, "typed-1")
    answer = await _run(client, "typed-1", prompts=["plan it"], output_schema=FORMAT)
    assert answer.status_code == 201, answer.text
    run = answer.json()
    assert run["status"] == "completed"
    expected = {"city": "echo", "days": 1, "kind": "trip", "tags": ["echo", "echo"]}
    assert run["output_parsed"] == expected
    assert json.loads(run["final"]["content"][0]["text"]) == expected
    record = await client.get(f"/conversations/typed-1/runs/{run['run_id']}")
    assert record.json()["output_parsed"] == expected
    # a run without a schema has none
    plain = await _run(client, "typed-1", prompts=["hello"])
    assert plain.json()["output_parsed"] is None


async def test_an_invalid_answer_is_corrected_on_retry(client: AppClient) -> None:
    await _conversation(client, "typed-2")
    answer = await _run(client, "typed-2", prompts=["/invalid"], output_schema=FORMAT)
    run = answer.json()
    assert run["status"] == "completed", run
    assert run["output_parsed"]["city"] == "echo"
    kinds = [m["type"] for m in run["new_messages"]]
    assert kinds == ["user", "assistant", "user", "assistant"]
    correction = run["new_messages"][2]["content"][0]["text"]
    assert "does not match the required JSON schema" in correction
    assert "'city' is a required property" in correction


async def test_an_answer_that_never_validates_fails_the_run_naming_it(client: AppClient) -> None:
    await _conversation(client, "typed-3")
    answer = await _run(client, "typed-3", prompts=["/invalid always"], output_schema=FORMAT)
    run = answer.json()
    assert run["status"] == "failed", run
    assert run["output_parsed"] is None
    problem = run["error"]
    assert problem["type"].endswith("/run-output-invalid"), problem
    assert problem["code"] == "output_invalid"
    assert "'city' is a required property" in problem["detail"]
    assert "after 1 retry" in problem["detail"]
    record = await client.get(f"/conversations/typed-3/runs/{run['run_id']}")
    assert record.json()["output_parsed"] is None
    assert record.json()["error"]["code"] == "output_invalid"


async def test_a_schema_that_is_not_json_schema_is_refused(client: AppClient) -> None:
    await _conversation(client, "typed-4")
    bad = {"name": "plan", "schema": {"type": "object", "properties": {"a": {"type": 7}}}}
    answer = await _run(client, "typed-4", prompts=["x"], output_schema=bad)
    body = assert_problem(answer, 422, "validation-error")
    assert "not a valid JSON Schema" in body["detail"], body
    assert any("output_schema" in e["path"] for e in body["errors"]), body
    runs = await client.get("/conversations/typed-4/runs")
    assert runs.json()["items"] == []  # nothing ran


async def test_per_run_settings_the_profile_allows(make_settings: SettingsFactory) -> None:
    open_profile = AgentProfile(
        allowed_run_settings=("model", "temperature", "max_output_tokens", "instructions")
    )
    pool = AgentPool(make_settings(agents={"open": open_profile}))
    async with apps(make_settings)(pool) as client:
        await _conversation(client, "typed-5")
        answer = await _run(
            client,
            "typed-5",
            prompts=["hi"],
            agent="open",
            model="echo-2",
            temperature=0.2,
            max_output_tokens=64,
            instructions="Be brief.",
        )
        assert answer.status_code == 201, answer.text
        assert answer.json()["final"]["model"] == "echo-2"
        stored = await client.get("/conversations/typed-5/context")
        assert stored.json()["system_prompt"] == "Be."  # instructions were for this run only
        # the default profile allows instructions alone
        refused = await _run(client, "typed-5", prompts=["hi"], temperature=0.5)
        body = assert_problem(refused, 422, "validation-error")
        assert body["errors"][0]["path"] == "body.temperature", body
        assert "temperature" in body["detail"]
        ok = await _run(client, "typed-5", prompts=["hi"], instructions="Other.")
        assert ok.status_code == 201, ok.text
        # /v1: the same rule, OpenAI's 400 naming the parameter
        v1 = await client.post(
            "/v1/responses", json={"model": "default", "input": "hi", "temperature": 0.5}
        )
        assert v1.status_code == 400, v1.text
        assert v1.json()["error"]["param"] == "temperature"
        allowed = await client.post(
            "/v1/responses",
            json={"model": "open", "input": "hi", "temperature": 0.5, "max_output_tokens": 9},
        )
        assert allowed.status_code == 200, allowed.text
        assert allowed.json()["temperature"] == 0.5
        assert allowed.json()["max_output_tokens"] == 9


async def test_a_profile_without_instructions_refuses_them(
    make_settings: SettingsFactory,
) -> None:
    pool = AgentPool(make_settings(agents={"fixed": AgentProfile(allowed_run_settings=())}))
    async with apps(make_settings)(pool) as c:
        await _conversation(c, "typed-6")
        refused = await _run(c, "typed-6", prompts=["hi"], agent="fixed", instructions="No.")
        body = assert_problem(refused, 422, "validation-error")
        assert body["errors"][0]["path"] == "body.instructions", body
        v1 = await c.post(
            "/v1/responses", json={"model": "fixed", "input": "hi", "instructions": "No."}
        )
        assert v1.status_code == 400, v1.text
        assert v1.json()["error"]["param"] == "instructions"


async def test_v1_text_format_json_schema(client: AppClient) -> None:
    text = {"format": {"type": "json_schema", **FORMAT}}
    answer = await client.post(
        "/v1/responses", json={"model": "default", "input": "plan", "text": text}
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["status"] == "completed"
    assert body["text"] == text
    assert body["output_parsed"]["kind"] == "trip"
    again = await client.get(f"/v1/responses/{body['id']}")
    assert again.json()["output_parsed"] == body["output_parsed"]
    assert again.json()["text"] == text
    # never valid: failed, no message item, nothing parsed
    failed = await client.post(
        "/v1/responses", json={"model": "default", "input": "/invalid always", "text": text}
    )
    body = failed.json()
    assert body["status"] == "failed", body
    assert body["output_parsed"] is None
    assert [i for i in body["output"] if i["type"] == "message"] == []
    assert "'city' is a required property" in body["error"]["message"]
    # unstored: the same
    unstored = await client.post(
        "/v1/responses",
        json={"model": "default", "input": "/invalid", "text": text, "store": False},
    )
    assert unstored.json()["output_parsed"]["city"] == "echo"
    bad = {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}}
    refused = await client.post(
        "/v1/responses", json={"model": "default", "input": "x", "text": bad}
    )
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == "text.format"


async def test_a_background_run_keeps_its_schema_and_settings(
    make_settings: SettingsFactory,
) -> None:
    pool = AgentPool(make_settings(agents={"open": AgentProfile(allowed_run_settings=("model",))}))
    async with apps(make_settings)(pool) as client:
        await _conversation(client, "typed-7")
        accepted = await client.post(
            "/conversations/typed-7/runs",
            json={
                "prompts": ["/invalid"],
                "agent": "open",
                "model": "echo-bg",
                "output_schema": FORMAT,
                "if_busy": "enqueue",
            },
            headers={"Prefer": "respond-async"},
        )
        assert accepted.status_code == 202, accepted.text
        location = accepted.headers["location"]

        async def ended() -> dict[str, Any] | None:
            record: dict[str, Any] = (await client.get(location)).json()
            return record if record["status"] not in ("queued", "running") else None

        record = await until(ended, what="the background run's end")
        assert record["status"] == "completed", record
        assert record["output_parsed"]["kind"] == "trip"
        assert record["final"]["model"] == "echo-bg"
