"""The ``openai-responses`` provider through the whole service (HTTP → store → provider → store)
against the strict fake of the Responses API: runs with reasoning and tools, compactions (on an
overflow and at the threshold), usage, structured outputs and the failures of a provider.

Every request is stateless and validated as the real API validates it: a reasoning item that
does not come back exactly as issued, a call without its output, ``store`` not false, an
unknown field — each is a 400 that fails the run, so a passing run proves the request."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.agent.compaction import SUMMARY_PREFIX, SUMMARY_SYSTEM_PROMPT
from app.config import AgentProfile
from tests.fakes import openai_responses_fake as R

from .conftest import GPT, Conversation, Serve, attempts, fast_retries, kinds

PROBLEMS = "https://carryover.dev/problems/"


def responses(fake: R.ResponsesFake, **fields: Any) -> AgentProfile:
    values: dict[str, Any] = {
        "provider": "openai-responses",
        "model": GPT,
        "base_url": fake.base_url,
        **fields,
    }
    return AgentProfile(**values)


@pytest.fixture(autouse=True)
def key(monkeypatch: pytest.MonkeyPatch, responses_fake: R.ResponsesFake) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", responses_fake.api_key)


def sent(fake: R.ResponsesFake, n: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = fake.response_requests[n].json["input"]
    return items


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
async def test_reasoning_and_tools_over_several_runs(
    serve: Serve, responses_fake: R.ResponsesFake, stream: bool
) -> None:
    spaced = '{"seconds":  0 ,\n "__proto__": null}'  # valid JSON the tool refuses (extra key)
    broken = '{"seconds": 0'  # invalid JSON, as a model cut short can write it
    responses_fake.add(
        # run 1
        R.Reply([R.Reasoning("Need the time."), R.Call("time_now", "{}")]),
        R.Reply(
            [R.Reasoning(["Got it.", "Say it."]), R.Text("It is noon.")],
            input_tokens=900,
            cached_tokens=512,
            reasoning_tokens=40,
            output_tokens=60,
        ),
        # run 2
        R.Reply([R.Reasoning("Two waits."), R.Call("wait", spaced), R.Call("wait", broken)]),
        R.Reply([R.Text("One wait failed.")]),
        # run 3
        R.Reply([R.Text("Bye.")]),
    )
    async with serve(agents={"default": responses(responses_fake, stream=stream)}) as client:
        conv = await Conversation.create(client, "Be brief.")
        first = await conv.completed("What time is it?")
        await conv.completed("Wait twice.")
        await conv.completed("Bye.")
        context = await conv.context()
        usage = (await client.get("/usage")).json()

    assert responses_fake.rejections == []
    messages = context["messages"]
    assert kinds(messages) == [
        "user",
        "assistant",
        "tool_result",
        "assistant",  # run 1
        "user",
        "assistant",
        "tool_result",
        "tool_result",
        "assistant",  # run 2
        "user",
        "assistant",  # run 3
    ]
    assert {m["provider"] for m in messages if m["type"] == "assistant"} == {"openai-responses"}
    # stored as issued: the summary as the thinking text, the reasoning item itself alongside
    answer = messages[3]
    assert answer["content"][0] == {
        "type": "thinking",
        "thinking": "Got it.\n\nSay it.",
        "signature": "",
    }
    (item,) = answer["provider_data"]["reasoning"]
    assert item == responses_fake.reasoning[item["id"]]
    assert answer["provider_data"]["reasoning_tokens"] == 40
    assert answer["usage"] == {
        "input_tokens": 900,
        "output_tokens": 60,
        "cache_read_tokens": 512,
        "cache_write_tokens": 0,
    }
    assert first["usage"]["cache_read_tokens"] == 512
    [today] = usage["days"]
    assert today["cached_tokens"] == 512
    assert [c["arguments"] for c in messages[5]["content"][1:]] == [spaced, broken]
    assert messages[6]["is_error"] is True and messages[7]["is_error"] is True

    # every request carried the whole context, with every reasoning item and call as issued
    assert len(responses_fake.response_requests) == 5
    last = sent(responses_fake, 4)
    assert [i["type"] for i in last] == [
        "message",
        "reasoning",
        "function_call",
        "function_call_output",
        "reasoning",
        "message",
        "message",
        "reasoning",
        "function_call",
        "function_call",
        "function_call_output",
        "function_call_output",
        "message",
        "message",
    ]
    issued = [
        m["provider_data"]["reasoning"][0]
        for m in messages
        if "reasoning" in m.get("provider_data", {})
    ]
    assert [i for i in last if i["type"] == "reasoning"] == issued
    assert [i["arguments"] for i in last if i["type"] == "function_call"] == ["{}", spaced, broken]
    for request in responses_fake.response_requests:
        body = request.json
        assert body["store"] is False and body["include"] == ["reasoning.encrypted_content"]
        assert body["instructions"] == "Be brief."
        assert body.get("stream") is (True if stream else None)
        assert [t["name"] for t in body["tools"]] == ["time_now", "wait", "fail"]


async def test_an_overflow_compacts_and_retries(
    serve: Serve, responses_fake: R.ResponsesFake
) -> None:
    responses_fake.add(
        R.Reply([R.Reasoning("Easy."), R.Text("nvim is a vim fork.")]),
        R.overflow(),  # run 2, first attempt
        R.Reply([R.Text("The user asked what nvim is: a vim fork.")]),  # the summary
        R.Reply([R.Reasoning("Using the summary."), R.Text("It is extensible in Lua.")]),
        R.Reply([R.Text("Yes.")]),  # run 3
    )
    async with serve(agents={"gpt": responses(responses_fake, max_retries=0)}) as client:
        conv = await Conversation.create(client, "Be brief.")
        first = await conv.completed("What is nvim?", "gpt")
        posted = await conv.completed("How does it differ from vim?", "gpt")
        record = await conv.record(posted["run_id"])
        context = await conv.context()
        await conv.completed("Really?", "gpt")

    assert responses_fake.rejections == []
    assert kinds(record["new_messages"]) == ["user", "assistant", "assistant"]
    failed, final = attempts(record)
    assert failed["stop_reason"] == "error" and failed["error"]["kind"] == "overflow"
    assert failed["error"]["status"] == 400 and failed["error"]["code"] == "context_length_exceeded"
    (compaction,) = record["compactions"]
    assert compaction["reason"] == "overflow"
    assert compaction["folded"] == first["context"]["messages"]  # the reasoning item too
    assert context["summary"] == "The user asked what nvim is: a vim fork."
    assert kinds(context["messages"]) == ["user", "assistant"] and context["messages"][1] == final
    # the summary request, then the retry: the summary first, the folded reasoning gone
    summary_request = responses_fake.response_requests[2].json
    assert summary_request["instructions"] == SUMMARY_SYSTEM_PROMPT
    assert "nvim is a vim fork." in summary_request["input"][0]["content"][0]["text"]
    retry = sent(responses_fake, 3)
    assert retry[0]["content"][0]["text"] == SUMMARY_PREFIX + context["summary"]
    assert [i["type"] for i in retry] == ["message", "message"]
    # run 3 replays the retry's reasoning item exactly
    run3 = sent(responses_fake, 4)
    assert run3[2] == final["provider_data"]["reasoning"][0]


async def test_the_threshold_compacts_before_the_prompt_is_admitted(
    serve: Serve, responses_fake: R.ResponsesFake
) -> None:
    long = "Tell me about editors. " * 40  # about 230 tokens by the heuristic
    responses_fake.add(
        R.Reply([R.Reasoning("Long."), R.Text("Editors edit text.")], input_tokens=240),
        R.Reply([R.Text("The user asked about editors.")]),  # the summary
        R.Reply([R.Text("Vim and Emacs.")]),
    )
    profile = responses(responses_fake, context_window=600, compact_at=0.5)
    async with serve(agents={"gpt": profile}) as client:
        conv = await Conversation.create(client)
        await conv.completed(long, "gpt")
        second = await conv.completed("Which ones? " + long, "gpt")
        context = await conv.context()

    assert responses_fake.rejections == []
    (compaction,) = second["compactions"]
    assert compaction["reason"] == "threshold"
    # the fewest messages that bring the rest under the threshold: the long prompt
    assert kinds(compaction["folded"]) == ["user"]
    assert context["summary"] == "The user asked about editors."
    after = sent(responses_fake, 2)
    assert after[0]["content"][0]["text"] == SUMMARY_PREFIX + context["summary"]
    # the answer that stayed still carries its reasoning item, exactly as issued
    assert [i["type"] for i in after] == ["message", "reasoning", "message", "message"]
    kept = context["messages"][0]
    assert after[1] == kept["provider_data"]["reasoning"][0]
    assert after[1] == responses_fake.reasoning[after[1]["id"]]
    assert kinds(context["messages"]) == ["assistant", "user", "assistant"]


async def test_structured_outputs_are_sent_as_text_format_and_checked(
    serve: Serve, responses_fake: R.ResponsesFake
) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
        "required": ["city", "days"],
        "additionalProperties": False,
    }
    responses_fake.add(
        R.Reply([R.Reasoning("Plan."), R.Text('{"city": "Oslo", "days": 0}')]),
        R.Reply([R.Text('{"city": "Oslo", "days": 3}')]),
        R.Reply([R.Refusal("I can't plan that.")]),
    )
    output_schema = {"name": "trip", "schema": schema, "strict": True}
    async with serve(agents={"gpt": responses(responses_fake)}) as client:
        conv = await Conversation.create(client)
        typed = await conv.run("Plan a trip.", "gpt", output_schema=output_schema)
        refused = await conv.run("Plan another.", "gpt", output_schema=output_schema)

    assert responses_fake.rejections == []
    assert typed["status"] == "completed", typed["error"]
    assert typed["output_parsed"] == {"city": "Oslo", "days": 3}
    first, correction = (r.json for r in responses_fake.response_requests[:2])
    assert first["text"] == {"format": {"type": "json_schema", **output_schema}}
    # the correction follows the answer that broke the schema, its reasoning item before it
    assert [i["type"] for i in correction["input"]] == [
        "message",
        "reasoning",
        "message",
        "message",
    ]
    assert "minimum of 1" in correction["input"][-1]["content"][0]["text"]
    assert refused["status"] == "failed"
    assert refused["final"]["stop_reason"] == "refusal"
    assert "the model refused" in refused["error"]["detail"]


async def test_rate_limits_and_server_errors_are_retried(
    serve: Serve, responses_fake: R.ResponsesFake
) -> None:
    responses_fake.add(
        R.Error.rate_limit(retry_after="1"), R.Error.server(500), R.Reply([R.Text("Hi.")])
    )
    async with serve(
        agents={"gpt": responses(responses_fake, max_retries=2)}, pool=fast_retries("gpt")
    ) as client:
        conv = await Conversation.create(client)
        body = await conv.completed("Hello.", "gpt")

    assert len(responses_fake.response_requests) == 3
    assert kinds(body["new_messages"]) == [
        "user",
        "assistant",
    ]  # retries before content: no attempts
    assert body["final"]["content"] == [{"type": "text", "text": "Hi."}]


async def test_a_garbage_stream_fails_the_run_clearly_and_the_next_run_works(
    serve: Serve, responses_fake: R.ResponsesFake
) -> None:
    garbage = R.RawSSE([{"type": "response.created", "response": {"id": "r"}}, ["not an event"]])
    responses_fake.add(garbage, garbage, R.Reply([R.Text("Back.")]))
    async with serve(
        agents={"gpt": responses(responses_fake, max_retries=1)}, pool=fast_retries("gpt")
    ) as client:
        conv = await Conversation.create(client)
        failed = await conv.run("Hello.", "gpt")
        record = await conv.record(failed["run_id"])
        again = await conv.completed("Again.", "gpt")

    assert record["status"] == "failed"
    problem = record["error"]
    assert problem["type"] == PROBLEMS + "run-provider-unavailable"
    assert (problem["kind"], problem["code"]) == ("retryable", "malformed_stream")
    assert "openai-responses: malformed stream data" in problem["detail"]
    assert problem["detail"].endswith("(after 1 retry)")
    assert kinds(again["context"]["messages"]) == ["user", "user", "assistant"]


async def test_an_html_page_fails_the_run_at_once(
    serve: Serve, responses_fake: R.ResponsesFake
) -> None:
    responses_fake.add(R.html_page(200, "Wi-Fi login"))
    async with serve(agents={"gpt": responses(responses_fake, max_retries=3)}) as client:
        conv = await Conversation.create(client)
        failed = await conv.run("Hello.", "gpt")

    assert len(responses_fake.response_requests) == 1
    problem = failed["error"]
    assert problem["type"] == PROBLEMS + "run-provider-error"
    assert problem["code"] == "not_an_event_stream" and "Wi-Fi login" in problem["detail"]
    assert json.dumps(failed).count("<html") == 0


async def test_a_runs_own_settings_are_sent_as_the_profile_allows(
    serve: Serve, responses_fake: R.ResponsesFake
) -> None:
    """``model``, ``temperature``, ``max_output_tokens`` and ``instructions`` of a run, each
    in its Responses field; the stored system prompt is what the next run sends again."""
    responses_fake.add(R.Reply([R.Text("Short.")]), R.Reply([R.Text("Plain.")]))
    profile = responses(
        responses_fake,
        max_output_tokens=1000,
        allowed_run_settings=["model", "temperature", "max_output_tokens", "instructions"],
    )
    async with serve(agents={"gpt": profile}) as client:
        conv = await Conversation.create(client, "Be brief.")
        body = await conv.run(
            "Hi.",
            "gpt",
            model="gpt-fake-mini",
            temperature=0.2,
            max_output_tokens=64,
            instructions="Answer in one word.",
        )
        assert body["status"] == "completed", body["error"]
        await conv.completed("Again.", "gpt")

    assert responses_fake.rejections == []
    first, second = (r.json for r in responses_fake.response_requests)
    assert first["model"] == "gpt-fake-mini" and first["temperature"] == 0.2
    assert first["max_output_tokens"] == 64
    assert first["instructions"] == "Answer in one word."
    assert second["model"] == GPT and "temperature" not in second
    assert second["max_output_tokens"] == 1000 and second["instructions"] == "Be brief."
