"""One conversation, several providers (contract §1 "Replayable"): run 1 on the Anthropic
profile with thinking, run 2 on the OpenAI profile, run 3 back on Anthropic, run 4 on OpenAI.

The stored context keeps every block as issued. Each request carries only what its provider
can take: OpenAI never sees a signature or redacted thinking; Anthropic gets its own earlier
thinking back exactly and the OpenAI turns without their (unsigned) reasoning, their raw
arguments parsed into ``input`` — ``{}`` for the string that is not valid JSON. The same holds
for a conversation that moves to OpenAI's Responses API and back: its reasoning items go back to
it exactly, and to no other provider.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.config import AgentProfile
from tests.fakes import anthropic_fake as A
from tests.fakes import openai_fake as O
from tests.fakes import openai_responses_fake as R

from .conftest import CLAUDE, GPT, Conversation, Serve, blocks, kinds


async def test_switching_provider_mid_conversation(
    serve: Serve,
    anthropic_fake: A.AnthropicFake,
    openai_fake: O.OpenAIFake,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", anthropic_fake.api_key)
    monkeypatch.setenv("OPENAI_API_KEY", openai_fake.api_key)
    profiles = {
        "claude": AgentProfile(
            provider="anthropic",
            model=CLAUDE,
            base_url=anthropic_fake.base_url,
            thinking_budget=1024,
            max_output_tokens=4096,
            max_retries=0,
        ),
        "gpt": AgentProfile(
            provider="openai", model=GPT, base_url=openai_fake.base_url, max_retries=0
        ),
    }
    broken = '{"seconds": 0,}'  # not JSON: the tool refuses it, Anthropic gets {}
    anthropic_fake.add(
        # run 1
        A.Reply([A.Thinking("Need the time."), A.Redacted(), A.ToolUse("time_now", {})]),
        A.Reply([A.Thinking(""), A.Text("It is noon.")]),
        # run 3
        A.Reply([A.Thinking("Back again."), A.ToolUse("wait", {"seconds": 0})]),
        A.Reply([A.Redacted(), A.Text("All done.")]),
    )
    openai_fake.add(
        # run 2: reasoning (an unsigned thinking block) and two calls
        O.Reply(
            reasoning="Two waits.",
            tool_calls=[O.ToolCall("wait", broken), O.ToolCall("wait", '{"seconds":0}')],
        ),
        O.Reply(text="One wait failed."),
        # run 4
        O.Reply(text="Bye."),
    )
    async with serve(agents=profiles) as client:
        conv = await Conversation.create(client, "Be brief.")
        runs = [
            await conv.completed("What time is it?", "claude"),
            await conv.completed("Wait twice.", "gpt"),
            await conv.completed("Wait once more.", "claude"),
            await conv.completed("Bye.", "gpt"),
        ]
        context = await conv.context()

    assert all(r["status"] == "completed" for r in runs)
    assert anthropic_fake.rejections == [] and openai_fake.rejections == []
    messages = context["messages"]
    assert kinds(messages) == [
        "user",
        "assistant",
        "tool_result",
        "assistant",  # run 1, claude
        "user",
        "assistant",
        "tool_result",
        "tool_result",
        "assistant",  # run 2, gpt
        "user",
        "assistant",
        "tool_result",
        "assistant",  # run 3, claude
        "user",
        "assistant",  # run 4, gpt
    ]
    assert [m["provider"] for m in messages if m["type"] == "assistant"] == [
        "anthropic",
        "anthropic",
        "openai",
        "openai",
        "anthropic",
        "anthropic",
        "openai",
    ]
    # the store keeps everything as issued, whichever provider it came from
    assert messages[1]["content"][0] == {
        "type": "thinking",
        "thinking": "Need the time.",
        "signature": A.sign("Need the time."),
    }
    assert blocks(messages[1]) == ["thinking", "redacted_thinking", "tool_call"]
    assert messages[3]["content"][0] == {
        "type": "thinking",
        "thinking": "",
        "signature": A.sign(""),
    }
    assert messages[5]["content"][0] == {
        "type": "thinking",
        "thinking": "Two waits.",
        "signature": "",
    }
    assert [c["arguments"] for c in messages[5]["content"][1:]] == [broken, '{"seconds":0}']
    assert messages[6]["is_error"] is True and messages[7]["is_error"] is False

    signatures = [
        b["signature"]
        for m in messages
        if m["type"] == "assistant"
        for b in m["content"]
        if b["type"] == "thinking" and b["signature"]
    ]
    redacted = [
        b["data"]
        for m in messages
        if m["type"] == "assistant"
        for b in m["content"]
        if b["type"] == "redacted_thinking"
    ]
    assert len(signatures) == 3 and len(redacted) == 2

    # OpenAI never receives Anthropic's opaque fields, nor anyone's reasoning
    for request in openai_fake.chat_requests:
        sent = json.dumps(request.json)
        for opaque in (*signatures, *redacted):
            assert opaque not in sent
        for word in ("signature", "redacted_thinking", "thinking", "Need the time.", "reasoning"):
            assert word not in sent
    run2_first = openai_fake.chat_requests[0].json["messages"]
    assert [m["role"] for m in run2_first] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
    ]
    assert run2_first[2]["tool_calls"] == [
        {
            "id": messages[1]["content"][2]["id"],
            "type": "function",
            "function": {"name": "time_now", "arguments": "{}"},
        }
    ]
    assert run2_first[4] == {"role": "assistant", "content": "It is noon."}
    # run 4 sent run 2's calls back byte for byte
    run4 = openai_fake.chat_requests[-1].json["messages"]
    assert [c["function"]["arguments"] for c in run4[6]["tool_calls"]] == [broken, '{"seconds":0}']

    # Anthropic (run 3): its own turns exactly as issued, the OpenAI turns without reasoning
    run3_first = anthropic_fake.message_requests[2].json["messages"]
    assistant_turns = [m["content"] for m in run3_first if m["role"] == "assistant"]
    assert assistant_turns[0] == [
        {"type": "thinking", "thinking": "Need the time.", "signature": A.sign("Need the time.")},
        {"type": "redacted_thinking", "data": redacted[0]},
        {
            "type": "tool_use",
            "id": messages[1]["content"][2]["id"],
            "name": "time_now",
            "input": {},
        },
    ]
    assert assistant_turns[1] == [
        {"type": "thinking", "thinking": "", "signature": A.sign("")},
        {"type": "text", "text": "It is noon."},
    ]
    gpt_calls = messages[5]["content"][1:]
    assert assistant_turns[2] == [
        {"type": "tool_use", "id": gpt_calls[0]["id"], "name": "wait", "input": {}},
        {"type": "tool_use", "id": gpt_calls[1]["id"], "name": "wait", "input": {"seconds": 0}},
    ]
    assert assistant_turns[3] == [{"type": "text", "text": "One wait failed."}]
    assert "Two waits." not in json.dumps(run3_first)
    # the tool results of the OpenAI batch answer its calls in the next user turn
    results_turn = run3_first[6]["content"]
    assert [(b["tool_use_id"], b.get("is_error", False)) for b in results_turn] == [
        (gpt_calls[0]["id"], True),
        (gpt_calls[1]["id"], False),
    ]

    # run 4's request to OpenAI held run 3's Anthropic turns as plain text and calls
    assert (
        run4[-4]["tool_calls"][0]["function"]["arguments"]
        == messages[10]["content"][1]["arguments"]
    )
    assert run4[-2] == {"role": "assistant", "content": "All done."}


async def test_an_assistant_turn_with_only_foreign_reasoning_is_left_out(
    serve: Serve,
    anthropic_fake: A.AnthropicFake,
    openai_fake: O.OpenAIFake,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An OpenAI-compatible answer that was all reasoning (a model that ran out of tokens while
    thinking) has nothing Anthropic can take: the turn is skipped and the two user turns around
    it merge, instead of an empty assistant turn Anthropic would refuse."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", anthropic_fake.api_key)
    monkeypatch.setenv("OPENAI_API_KEY", openai_fake.api_key)
    profiles: dict[str, Any] = {
        "claude": AgentProfile(
            provider="anthropic", model=CLAUDE, base_url=anthropic_fake.base_url, max_retries=0
        ),
        "local": AgentProfile(
            provider="openai", model=GPT, base_url=openai_fake.base_url, max_retries=0
        ),
    }
    openai_fake.add(O.Reply(reasoning="Thinking and thinking...", finish_reason="length"))
    anthropic_fake.add(A.Reply([A.Text("Short answer.")]))
    async with serve(agents=profiles) as client:
        conv = await Conversation.create(client)
        first = await conv.completed("Think long.", "local")
        await conv.completed("Just answer.", "claude")

    assert first["final"]["stop_reason"] == "max_tokens"
    assert first["final"]["content"] == [
        {"type": "thinking", "thinking": "Thinking and thinking...", "signature": ""}
    ]
    assert anthropic_fake.rejections == []
    assert anthropic_fake.message_requests[0].json["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Think long."},
                {"type": "text", "text": "Just answer."},
            ],
        }
    ]


async def test_switching_to_thinking_inside_an_unfinished_tool_loop(
    serve: Serve,
    anthropic_fake: A.AnthropicFake,
    openai_fake: O.OpenAIFake,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Run 1 on OpenAI fails right after its tool batch (the provider stays down), so the
    stored context ends with the call and its result. Run 2 on Anthropic with thinking
    continues that tool loop, whose assistant turn has no thinking block: Anthropic refuses
    thinking there ("a final assistant message must start with a thinking block"), and one
    thinking configuration per tool loop is the rule — so that request goes without thinking,
    and thinking is back on once a new turn starts."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", anthropic_fake.api_key)
    monkeypatch.setenv("OPENAI_API_KEY", openai_fake.api_key)
    profiles = {
        "claude": AgentProfile(
            provider="anthropic",
            model=CLAUDE,
            base_url=anthropic_fake.base_url,
            thinking_budget=1024,
            max_output_tokens=4096,
            max_retries=0,
        ),
        "gpt": AgentProfile(
            provider="openai", model=GPT, base_url=openai_fake.base_url, max_retries=0
        ),
    }
    openai_fake.add(O.Reply(tool_calls=[O.ToolCall("time_now", "{}")]), O.Error.server(503))
    anthropic_fake.add(
        A.Reply([A.Text("It is noon, and I answer the new question too.")]),
        A.Reply([A.Thinking("A new turn."), A.Text("Thinking again.")]),
    )
    async with serve(agents=profiles) as client:
        conv = await Conversation.create(client)
        failed = await conv.run("Time?", "gpt")
        continued = await conv.run("Still there?", "claude")
        again = await conv.completed("And now?", "claude")
        context = await conv.context()

    assert failed["status"] == "failed" and kinds(failed["context"]["messages"]) == [
        "user",
        "assistant",
        "tool_result",
    ]
    assert anthropic_fake.rejections == []
    assert continued["status"] == "completed", continued["error"]
    first, second = (r.json for r in anthropic_fake.message_requests)
    assert "thinking" not in first  # this request continues OpenAI's tool loop
    assert first["messages"][-1]["content"][0]["type"] == "tool_result"
    assert second["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert again["final"]["content"][0]["signature"] == A.sign("A new turn.")
    assert kinds(context["messages"]) == [
        "user",
        "assistant",
        "tool_result",
        "user",
        "assistant",
        "user",
        "assistant",
    ]


async def test_a_conversation_moves_to_openai_responses_and_back(
    serve: Serve,
    anthropic_fake: A.AnthropicFake,
    openai_fake: O.OpenAIFake,
    responses_fake: R.ResponsesFake,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Anthropic with thinking, then the Responses API, then Chat Completions, then the
    Responses API again, then Anthropic: each provider gets its own opaque fields back exactly
    (Anthropic's signatures, the Responses API's reasoning items) and never another's."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", anthropic_fake.api_key)
    monkeypatch.setenv("OPENAI_API_KEY", openai_fake.api_key)
    monkeypatch.setenv("RESPONSES_KEY", responses_fake.api_key)
    profiles = {
        "claude": AgentProfile(
            provider="anthropic",
            model=CLAUDE,
            base_url=anthropic_fake.base_url,
            thinking_budget=1024,
            max_output_tokens=4096,
            max_retries=0,
        ),
        "chat": AgentProfile(
            provider="openai", model=GPT, base_url=openai_fake.base_url, max_retries=0
        ),
        "responses": AgentProfile(
            provider="openai-responses",
            model=GPT,
            base_url=responses_fake.base_url,
            api_key_env="RESPONSES_KEY",
            max_retries=0,
        ),
    }
    anthropic_fake.add(
        A.Reply([A.Thinking("Need the time."), A.Redacted(), A.ToolUse("time_now", {})]),
        A.Reply([A.Thinking("Noon."), A.Text("It is noon.")]),
        A.Reply([A.Thinking("Last turn."), A.Text("Goodbye.")]),
    )
    responses_fake.add(
        R.Reply([R.Reasoning("Wait once."), R.Call("wait", '{"seconds": 0}')]),
        R.Reply([R.Reasoning("Done waiting."), R.Text("Waited.")]),
        R.Reply([R.Reasoning("Again?"), R.Text("Here again.")]),
    )
    openai_fake.add(O.Reply(reasoning="Chat thinks.", text="Chat here."))
    async with serve(agents=profiles) as client:
        conv = await Conversation.create(client, "Be brief.")
        for prompt, agent in (
            ("Time?", "claude"),
            ("Wait.", "responses"),
            ("Hello chat.", "chat"),
            ("Back to responses.", "responses"),
            ("Bye.", "claude"),
        ):
            await conv.completed(prompt, agent)
        context = await conv.context()

    assert anthropic_fake.rejections == [] and openai_fake.rejections == []
    assert responses_fake.rejections == []
    messages = context["messages"]
    assert [m["provider"] for m in messages if m["type"] == "assistant"] == [
        "anthropic",
        "anthropic",
        "openai-responses",
        "openai-responses",
        "openai",
        "openai-responses",
        "anthropic",
    ]
    issued = [
        item
        for m in messages
        if m["type"] == "assistant"
        for item in m["provider_data"].get("reasoning", [])
    ]
    assert len(issued) == 3 and all(i == responses_fake.reasoning[i["id"]] for i in issued)
    anthropic_opaque = [
        b.get("signature") or b.get("data")
        for m in messages
        if m["type"] == "assistant"
        for b in m["content"]
        if b["type"] in ("thinking", "redacted_thinking") and m["provider"] == "anthropic"
    ]
    assert len(anthropic_opaque) == 4

    # the Responses API: Anthropic's turns as text and calls, its own reasoning items exactly
    back = responses_fake.response_requests[-1].json["input"]
    assert [i for i in back if i["type"] == "reasoning"] == issued[:2]
    text = json.dumps(back)
    for opaque in anthropic_opaque:
        assert opaque not in text
    assert "Need the time." not in text and "Chat thinks." not in text
    assert {
        "type": "function_call",
        "call_id": messages[1]["content"][2]["id"],
        "name": "time_now",
        "arguments": "{}",
    } in back
    # Chat Completions: no reasoning item, no encrypted content, no signature
    chat = json.dumps(openai_fake.chat_requests[-1].json)
    for item in issued:
        assert item["encrypted_content"] not in chat and item["id"] not in chat
    assert "Wait once." not in chat and "reasoning" not in chat
    # Anthropic at the end: its own thinking exactly, nothing of the Responses API's reasoning
    last = anthropic_fake.message_requests[-1].json["messages"]
    final = json.dumps(last)
    for item in issued:
        assert item["encrypted_content"] not in final and "Done waiting." not in final
    assert last[1]["content"][0] == {
        "type": "thinking",
        "thinking": "Need the time.",
        "signature": A.sign("Need the time."),
    }
    call = messages[5]["content"][1]
    assert {"type": "tool_use", "id": call["id"], "name": "wait", "input": {"seconds": 0}} in [
        b for turn in last if turn["role"] == "assistant" for b in turn["content"]
    ]
