"""Client tools and approvals through the whole service against the provider fakes (issue 12).

The fakes validate every request like the real APIs: a tool call sent without its result, a
result without its call, or (Anthropic) a thinking block moved away from its tool use is a
400, which would fail the run. So each resumed run ending ``completed`` with no rejection shows
that the pause and the answers were stored and replayed as the wire formats require.
"""

from __future__ import annotations

from typing import Any

import pytest

from app.config import AgentProfile
from tests.fakes import anthropic_fake as A
from tests.fakes import openai_fake as O

from .conftest import CLAUDE, GPT, Conversation, Serve, kinds

LOOKUP = {
    "name": "lookup",
    "description": "Look a word up in the application's dictionary",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
}


def tool_result(call: dict[str, Any], text: str) -> dict[str, Any]:
    return {
        "type": "tool_result",
        "tool_call_id": call["id"],
        "tool_name": call["name"],
        "content": [{"type": "text", "text": text}],
        "is_error": False,
    }


async def post(conv: Conversation, **body: Any) -> dict[str, Any]:
    response = await conv.client.post(f"/conversations/{conv.id}/runs", json=body)
    assert response.status_code == 201, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def test_openai_client_tool_loop(
    serve: Serve, openai_fake: O.OpenAIFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", openai_fake.api_key)
    profile = AgentProfile(provider="openai", model=GPT, base_url=openai_fake.base_url)
    raw = '{"word":  "carry"}'
    openai_fake.add(
        O.Reply(tool_calls=[O.ToolCall("lookup", raw, id="call_lookup")]),
        O.Reply(text="It means: to bear along."),
    )
    async with serve(agents={"gpt": profile}) as client:
        conv = await Conversation.create(client)
        first = await post(conv, prompts=["What does carry mean?"], agent="gpt", tools=[LOOKUP])
        assert first["status"] == "requires_action", first
        [call] = first["required_action"]["tool_calls"]
        assert call == {"id": "call_lookup", "name": "lookup", "arguments": raw, "kind": "client"}
        second = await post(conv, prompts=[tool_result(call, "to bear along")], agent="gpt")
        assert second["status"] == "completed", second

    assert openai_fake.rejections == []
    first_request, second_request = (r.json for r in openai_fake.chat_requests)
    # the client tool went out in Chat Completions form, with the server tools
    names = [t["function"]["name"] for t in first_request["tools"]]
    assert names[-1] == "lookup" and "time_now" in names
    assert first_request["tools"][-1]["function"]["parameters"] == LOOKUP["parameters"]
    # the resumed request pairs the call with its result, arguments verbatim
    roles = [m["role"] for m in second_request["messages"]]
    assert roles[-2:] == ["assistant", "tool"]
    assert second_request["messages"][-2]["tool_calls"][0]["function"]["arguments"] == raw
    assert second_request["messages"][-1]["tool_call_id"] == "call_lookup"
    assert second_request["messages"][-1]["content"] == "to bear along"


async def test_anthropic_client_tool_loop_keeps_thinking_before_the_tool_use(
    serve: Serve, anthropic_fake: A.AnthropicFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", anthropic_fake.api_key)
    profile = AgentProfile(
        provider="anthropic",
        model=CLAUDE,
        base_url=anthropic_fake.base_url,
        thinking_budget=1024,
        max_output_tokens=4096,
    )
    anthropic_fake.add(
        A.Reply([A.Thinking("I should look it up."), A.ToolUse("lookup", {"word": "carry"})]),
        A.Reply([A.Thinking("Now I know."), A.Text("It means: to bear along.")]),
    )
    async with serve(agents={"claude": profile}) as client:
        conv = await Conversation.create(client)
        first = await post(conv, prompts=["What does carry mean?"], agent="claude", tools=[LOOKUP])
        assert first["status"] == "requires_action", first
        [call] = first["required_action"]["tool_calls"]
        second = await post(conv, prompts=[tool_result(call, "to bear along")], agent="claude")
        assert second["status"] == "completed", second
        context = await conv.context()

    assert anthropic_fake.rejections == []
    first_request, second_request = (r.json for r in anthropic_fake.message_requests)
    lookup = next(t for t in first_request["tools"] if t["name"] == "lookup")
    assert lookup["input_schema"] == LOOKUP["parameters"]
    # the resumed request: the assistant turn as issued (signed thinking, then the tool use),
    # then the user turn with the tool_result
    assistant, results = second_request["messages"][-2:]
    assert [b["type"] for b in assistant["content"]] == ["thinking", "tool_use"]
    assert assistant["content"][0]["signature"] == A.sign("I should look it up.")
    assert results["content"][0]["type"] == "tool_result"
    assert results["content"][0]["tool_use_id"] == call["id"]
    assert kinds(context["messages"]) == ["user", "assistant", "tool_result", "assistant"]


async def test_a_mixed_batch_runs_the_server_tool_and_holds_the_others(
    serve: Serve, openai_fake: O.OpenAIFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One batch: a server tool (runs at once), a client tool and an approval-gated server tool
    (both pending); then approve or deny."""
    monkeypatch.setenv("OPENAI_API_KEY", openai_fake.api_key)
    profile = AgentProfile(
        provider="openai", model=GPT, base_url=openai_fake.base_url, approval_required=("fail",)
    )
    batch = [
        O.ToolCall("wait", '{"seconds": 0}', id="call_wait"),
        O.ToolCall("lookup", '{"word": "x"}', id="call_lookup"),
        O.ToolCall("fail", '{"reason": "approved failure"}', id="call_fail"),
    ]
    openai_fake.add(
        O.Reply(tool_calls=batch),
        O.Reply(text="Done with all three."),
        O.Reply(tool_calls=[O.ToolCall("fail", "{}", id="call_fail_2")]),
        O.Reply(text="Understood, not failing."),
    )
    async with serve(agents={"gpt": profile}) as client:
        conv = await Conversation.create(client)
        first = await post(conv, prompts=["Do three things."], agent="gpt", tools=[LOOKUP])
        assert first["status"] == "requires_action", first
        held = first["required_action"]["tool_calls"]
        assert [(c["id"], c["kind"]) for c in held] == [
            ("call_lookup", "client"),
            ("call_fail", "approval"),
        ]
        # the server tool of the batch ran before the pause
        stored = first["context"]["messages"]
        assert kinds(stored)[-2:] == ["assistant", "tool_result"]
        assert stored[-1]["tool_call_id"] == "call_wait"
        assert stored[-1]["content"][0]["text"] == "waited 0 seconds"

        # answers in any order; stored in call order; the approved call runs now
        second = await post(
            conv,
            agent="gpt",
            approvals=[{"tool_call_id": "call_fail", "approve": True}],
            prompts=[tool_result(held[0], "x is a letter")],
        )
        assert second["status"] == "completed", second
        results = [m for m in second["new_messages"] if m["type"] == "tool_result"]
        assert [r["tool_call_id"] for r in results] == ["call_lookup", "call_fail"]
        assert results[1]["is_error"] is True  # fail ran (approved) and failed as designed
        assert "approved failure" in results[1]["content"][0]["text"]

        third = await post(conv, agent="gpt", prompts=["Fail again."])
        assert third["status"] == "requires_action"
        fourth = await post(
            conv,
            agent="gpt",
            approvals=[{"tool_call_id": "call_fail_2", "approve": False, "reason": "no more"}],
        )
        assert fourth["status"] == "completed", fourth
        [denial] = [m for m in fourth["new_messages"] if m["type"] == "tool_result"]
        assert denial["content"][0]["text"] == "denied: no more"
        transcript = await conv.transcript()

    assert openai_fake.rejections == []
    decisions = [e["body"] for e in transcript if e["kind"] == "approval"]
    assert [(d["tool_call_id"], d["approve"]) for d in decisions] == [
        ("call_fail", True),
        ("call_fail_2", False),
    ]
    assert [e["kind"] for e in transcript].count("pause") == 2
