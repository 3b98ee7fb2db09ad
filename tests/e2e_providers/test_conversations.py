"""Multi-turn conversations with tools and thinking through the whole service (issue 4.1).

Profiles point at the fakes the way a deployment points at a provider: ``agents=`` with the key
from ``ANTHROPIC_API_KEY``, the default profile from ``CARRYOVER_*`` variables with
``OPENAI_API_KEY``, and a TOML file whose profiles name their key variable (``api_key_env``) or
need none (a local OpenAI-compatible server). Every run replays the stored history; the fakes
refuse a mis-replay with the real APIs' 400, which would fail the run — so each run must end
``completed`` and the fakes must have refused nothing.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from app.config import AgentProfile
from tests.fakes import anthropic_fake as A
from tests.fakes import openai_fake as O

from .conftest import CLAUDE, GPT, Conversation, Serve, attempts, blocks, kinds


def _sent_assistant_turns(request: Any) -> list[list[dict[str, Any]]]:
    return [m["content"] for m in request.json["messages"] if m["role"] == "assistant"]


async def test_anthropic_thinking_and_tools_over_several_runs(
    serve: Serve,
    anthropic_fake: A.AnthropicFake,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", anthropic_fake.api_key)
    profile = AgentProfile(
        provider="anthropic",
        model=CLAUDE,
        base_url=anthropic_fake.base_url,
        thinking_budget=1024,
        max_output_tokens=4096,
        max_retries=0,
    )
    raw_wait = '{ "seconds" :0 }'  # the model's own spacing, kept byte for byte
    anthropic_fake.add(
        # run 1: a thinking tool loop; the second turn thinks with an empty, signed block and a
        # redacted block before its call
        A.Reply([A.Thinking("The user wants the time."), A.ToolUse("time_now", {})]),
        A.Reply([A.Thinking(""), A.Redacted(), A.ToolUse("wait", partial_json=raw_wait)]),
        A.Reply([A.Thinking("Both done."), A.Text("It is late. I waited.")]),
        # run 2: a batch of two calls, one of which fails
        A.Reply(
            [
                A.Thinking("Two at once."),
                A.ToolUse("wait", {"seconds": 0}),
                A.ToolUse("fail", {"reason": "boom"}),
            ]
        ),
        A.Reply([A.Redacted(), A.Text("One of them failed: boom.")]),
        # run 3: plain text, but only if everything before replays as issued
        A.Reply([A.Thinking("Wrap up."), A.Text("You are welcome.")]),
    )
    async with serve(agents={"claude": profile}) as client:
        conv = await Conversation.create(client, "You are terse.")
        first = await conv.completed("What time is it? Then wait.", "claude")
        second = await conv.completed("Wait and fail, both at once.", "claude")
        third = await conv.completed("Thanks.", "claude")
        context = await conv.context()
        record = await conv.record(first["run_id"])

    assert anthropic_fake.rejections == []
    assert len(anthropic_fake.message_requests) == 6
    # thinking on for every request, inside tool loops too (each loop began with thinking)
    assert all(r.json["thinking"]["type"] == "enabled" for r in anthropic_fake.message_requests)

    messages = context["messages"]
    assert kinds(messages) == [
        "user",
        "assistant",
        "tool_result",
        "assistant",
        "tool_result",
        "assistant",
        "user",
        "assistant",
        "tool_result",
        "tool_result",
        "assistant",
        "user",
        "assistant",
    ]
    assert context["system_prompt"] == "You are terse." and context["summary"] == ""
    # thinking blocks as issued: text and signature exactly, the empty one with "" (not absent)
    assert messages[1]["content"][0] == {
        "type": "thinking",
        "thinking": "The user wants the time.",
        "signature": A.sign("The user wants the time."),
    }
    assert blocks(messages[3]) == ["thinking", "redacted_thinking", "tool_call"]
    assert messages[3]["content"][0] == {
        "type": "thinking",
        "thinking": "",
        "signature": A.sign(""),
    }
    assert messages[3]["content"][1]["data"] in anthropic_fake.redacted
    assert blocks(messages[10]) == ["redacted_thinking", "text"]
    # raw arguments exactly as streamed (input_json_delta fragments concatenated)
    wait_call = messages[3]["content"][2]
    assert wait_call["name"] == "wait" and wait_call["arguments"] == raw_wait
    assert messages[1]["content"][1]["arguments"] == "{}"
    # the tools really ran: time_now's ISO time, wait's answer, fail as an error result
    datetime.fromisoformat(messages[2]["content"][0]["text"])
    assert messages[2]["tool_call_id"] == messages[1]["content"][1]["id"]
    assert messages[4]["content"][0]["text"] == "waited 0 seconds"
    batch = messages[7]["content"]
    assert [m["tool_call_id"] for m in messages[8:10]] == [batch[1]["id"], batch[2]["id"]]
    assert messages[8]["is_error"] is False
    assert messages[9]["is_error"] is True and "boom" in messages[9]["content"][0]["text"]
    assert all(
        m["provider"] == "anthropic" and m["model"] == CLAUDE
        for m in messages
        if m["type"] == "assistant"
    )

    # the last request replayed every earlier assistant turn exactly as the fake issued it
    last = anthropic_fake.message_requests[-1]
    assert last.json["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    sent = _sent_assistant_turns(last)
    stored_thinking = [
        [b for b in m["content"] if b["type"] in ("thinking", "redacted_thinking")]
        for m in messages[:-1]
        if m["type"] == "assistant"
    ]
    assert [
        [b for b in turn if b["type"] in ("thinking", "redacted_thinking")] for turn in sent
    ] == stored_thinking
    assert sent[1][2] == {
        "type": "tool_use",
        "id": wait_call["id"],
        "name": "wait",
        "input": {"seconds": 0},
    }

    # run records: every message of the run, the last attempt as final, no compaction
    assert record["status"] == "completed" and record["error"] is None
    assert kinds(record["new_messages"]) == [
        "user",
        "assistant",
        "tool_result",
        "assistant",
        "tool_result",
        "assistant",
    ]
    assert record["new_messages"] == messages[:6]
    assert record["final"] == messages[5] and record["compactions"] == []
    assert record["usage"]["input_tokens"] == 3 * 25
    assert second["final"] == messages[10] and third["final"] == messages[12]
    assert third["etag"] != second["etag"] != first["etag"]


async def test_openai_tools_with_raw_arguments_over_several_runs(
    serve: Serve,
    openai_fake: O.OpenAIFake,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the default profile, configured the way contract §6 says: CARRYOVER_* and OPENAI_API_KEY
    monkeypatch.setenv("CARRYOVER_PROVIDER", "openai")
    monkeypatch.setenv("CARRYOVER_MODEL", GPT)
    monkeypatch.setenv("CARRYOVER_BASE_URL", openai_fake.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", openai_fake.api_key)
    spaced = '{"seconds":  0 ,\n "__proto__": null}'  # valid JSON the tool refuses (extra key)
    broken = '{"seconds": 0'  # invalid JSON, as a model cut short can write it
    openai_fake.add(
        O.Reply(
            reasoning="Let me call both.",
            tool_calls=[
                O.ToolCall("time_now", ""),
                O.ToolCall("wait", spaced),
                O.ToolCall("wait", broken),
            ],
        ),
        O.Reply(text="Two of three calls failed.", cached_tokens=5),
        O.Reply(tool_calls=[O.ToolCall("wait", '{"seconds":0}')]),
        O.Reply(text="Waited."),
        O.Reply(text="Bye."),
    )
    async with serve() as client:
        conv = await Conversation.create(client, "Be brief.")
        await conv.completed("Call time_now and wait twice.")
        await conv.completed("Wait once more.")
        await conv.completed("Bye.")
        context = await conv.context()

    assert openai_fake.rejections == []
    messages = context["messages"]
    assert kinds(messages) == [
        "user",
        "assistant",
        "tool_result",
        "tool_result",
        "tool_result",
        "assistant",
        "user",
        "assistant",
        "tool_result",
        "assistant",
        "user",
        "assistant",
    ]
    calls = messages[1]["content"]
    # reasoning_content is kept as an unsigned thinking block; arguments byte for byte
    assert calls[0] == {"type": "thinking", "thinking": "Let me call both.", "signature": ""}
    assert [c["arguments"] for c in calls[1:]] == ["", spaced, broken]
    assert messages[2]["is_error"] is False
    assert (
        messages[3]["is_error"] is True and "invalid arguments" in messages[3]["content"][0]["text"]
    )
    assert messages[4]["is_error"] is True and "not valid JSON" in messages[4]["content"][0]["text"]
    assert messages[5]["usage"]["cache_read_tokens"] == 5
    # each later request sent the calls back exactly as issued, and no reasoning
    for request in openai_fake.chat_requests[1:]:
        sent = request.json["messages"]
        assert sent[0] == {"role": "system", "content": "Be brief."}
        first_call = sent[2]
        assert [c["function"]["arguments"] for c in first_call["tool_calls"]] == [
            "",
            spaced,
            broken,
        ]
        assert "reasoning_content" not in json.dumps(sent)
    assert len(openai_fake.chat_requests) == 5


async def test_profiles_from_a_toml_file(
    serve: Serve,
    anthropic_fake: A.AnthropicFake,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Two named profiles from a TOML file: Anthropic with its key in the variable the profile
    names, and a local OpenAI-compatible server (Ollama style: no key, tool-call deltas without
    index or id)."""
    with O.OpenAIFake(api_key="unused") as local:
        config = tmp_path / "carryover.toml"
        config.write_text(f"""
[agents.claude]
provider = "anthropic"
model = "{CLAUDE}"
base_url = "{anthropic_fake.base_url}"
api_key_env = "TEAM_ANTHROPIC_KEY"
thinking_budget = 2048
max_retries = 0

[agents.local]
provider = "openai"
model = "llama-fake"
base_url = "{local.base_url}"
max_retries = 0
""")
        monkeypatch.setenv("TEAM_ANTHROPIC_KEY", anthropic_fake.api_key)
        anthropic_fake.add(
            A.Reply([A.Thinking("Check."), A.ToolUse("time_now", {})]),
            A.Reply([A.Thinking(""), A.Text("Now.")]),
            A.Reply([A.Text("Again.")]),
        )
        local.add(
            O.Reply(
                tool_calls=[O.ToolCall("wait", '{"seconds": 0}')], omit_index=True, omit_id=True
            ),
            O.Reply(text="Done."),
            O.Reply(text="Done again."),
        )
        async with serve(config_file=config) as client:
            claude = await Conversation.create(client)
            await claude.completed("Time?", "claude")
            await claude.completed("Again?", "claude")
            llama = await Conversation.create(client)
            await llama.completed("Wait.", "local")
            await llama.completed("Again.", "local")
            claude_context = await claude.context()
            llama_context = await llama.context()

        assert local.rejections == [] and anthropic_fake.rejections == []
        assert local.chat_requests[0].headers["authorization"] == "Bearer unused"
        assert anthropic_fake.message_requests[0].json["thinking"]["budget_tokens"] == 2048
        assert claude_context["messages"][3]["content"][0] == {
            "type": "thinking",
            "thinking": "",
            "signature": A.sign(""),
        }
        call = llama_context["messages"][1]["content"][0]
        assert call["arguments"] == '{"seconds": 0}' and call["id"]  # an id was made up
        assert llama_context["messages"][2]["tool_call_id"] == call["id"]
        assert kinds(llama_context["messages"]) == [
            "user",
            "assistant",
            "tool_result",
            "assistant",
            "user",
            "assistant",
        ]


async def test_a_large_thinking_budget_without_max_output_tokens(
    serve: Serve,
    anthropic_fake: A.AnthropicFake,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``max_tokens`` must exceed the thinking budget (Anthropic refuses it otherwise); a profile
    that sets only ``thinking_budget`` still gets a request the API accepts."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", anthropic_fake.api_key)
    profile = AgentProfile(
        provider="anthropic", model=CLAUDE, base_url=anthropic_fake.base_url, thinking_budget=16_000
    )
    anthropic_fake.add(A.Reply([A.Thinking("Deep."), A.Text("Answer.")]))
    async with serve(agents={"deep": profile}) as client:
        conv = await Conversation.create(client)
        body = await conv.completed("Think hard.", "deep")
    assert anthropic_fake.rejections == []
    sent = anthropic_fake.message_requests[0].json
    assert sent["max_tokens"] > sent["thinking"]["budget_tokens"] == 16_000
    assert attempts(body)[0]["content"][0]["signature"] == A.sign("Deep.")


async def test_a_streamed_run_carries_the_providers_deltas(
    serve: Serve,
    anthropic_fake: A.AnthropicFake,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``Accept: text/event-stream``: thinking, text and tool-call argument deltas as the fake
    streams them, each completed message, the tool events, then the run's record."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", anthropic_fake.api_key)
    profile = AgentProfile(
        provider="anthropic",
        model=CLAUDE,
        base_url=anthropic_fake.base_url,
        thinking_budget=1024,
        max_output_tokens=4096,
    )
    anthropic_fake.add(
        A.Reply(
            [A.Thinking("Wait first."), A.ToolUse("wait", partial_json='{"seconds": 0}')],
            chunk_size=5,
        ),
        A.Reply([A.Thinking(""), A.Text("Waited.")]),
    )
    async with serve(agents={"claude": profile}) as client:
        conv = await Conversation.create(client)
        response = await client.post(
            f"/conversations/{conv.id}/runs",
            headers={"Accept": "text/event-stream"},
            json={"prompts": ["Wait."], "agent": "claude"},
        )
        events = [
            (
                chunk.split("\n")[0].removeprefix("event: "),
                json.loads(chunk.split("\n")[1].removeprefix("data: ")),
            )
            for chunk in response.text.strip().split("\n\n")
        ]
        record = await conv.record(events[-1][1]["run_id"])

    assert response.status_code == 201
    names = [name for name, _ in events]
    assert names[0] == "run.started" and names[-1] == "run.finished"
    deltas = [data for name, data in events if name == "delta"]
    assert "".join(d["text"] for d in deltas if d["kind"] == "thinking") == "Wait first."
    assert "".join(d["text"] for d in deltas if d["kind"] == "tool_call_arguments") == (
        '{"seconds": 0}'
    )
    # the fake's chunks (4 characters) arrive within 50 ms: coalesced into one delta (issue 13)
    assert "".join(d["text"] for d in deltas if d["kind"] == "text") == "Waited."
    assert names.count("tool.started") == names.count("tool.finished") == 1
    messages = [data for name, data in events if name == "message"]
    assert messages == record["new_messages"]
    finished = events[-1][1]
    assert finished["status"] == "completed" and finished["final"] == record["final"]
    assert finished["final"]["content"][0] == {
        "type": "thinking",
        "thinking": "",
        "signature": A.sign(""),
    }
