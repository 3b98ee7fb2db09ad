"""Provider failures through the whole service (issue 4.2): what the run record
(``GET …/runs/{id}``) and the stored context (``GET …/context``) hold afterwards.

- overflow → compaction → retry, and an overflow with nothing left to fold;
- 429 with ``retry-after`` (the real retry policy: the wait is honoured), and a 429 that stays;
- 529 overloaded (recovered, exhausted, and as an ``error`` event after content streamed);
- a burst of 5xx answers (recovered, and longer than ``max_retries``);
- a stream cut half-way (Anthropic: a thinking block that never got its signature; OpenAI: a
  tool call that never finished);
- a bad API key: ``failed``, not retried, and the key appears nowhere;
- hostile streams (issue 11): malformed chunks (retried, every cut attempt recorded, also as
  an SSE client sees them) and Anthropic events out of order (fatal, one request).

Retries before anything streamed are not attempts: they leave no message in the run record
(docs/decisions.md); an attempt that streamed something before failing is recorded.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.agent.compaction import SUMMARY_PREFIX, SUMMARY_SYSTEM_PROMPT
from app.agent.messages import MAX_TOKEN_COUNT
from app.agent.retry import RetryPolicy
from app.config import AgentProfile
from tests.fakes import anthropic_fake as A
from tests.fakes import openai_fake as O

from .conftest import (
    CLAUDE,
    GPT,
    Conversation,
    Serve,
    attempts,
    fast_retries,
    kinds,
)

PROBLEMS = "https://carryover.dev/problems/"


def claude(fake: A.AnthropicFake, **fields: Any) -> AgentProfile:
    values: dict[str, Any] = {
        "provider": "anthropic",
        "model": CLAUDE,
        "base_url": fake.base_url,
        "thinking_budget": 1024,
        "max_output_tokens": 4096,
    }
    return AgentProfile(**{**values, **fields})


def gpt(fake: O.OpenAIFake, **fields: Any) -> AgentProfile:
    return AgentProfile(**{"provider": "openai", "model": GPT, "base_url": fake.base_url, **fields})


@pytest.fixture
def keys(
    monkeypatch: pytest.MonkeyPatch, anthropic_fake: A.AnthropicFake, openai_fake: O.OpenAIFake
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", anthropic_fake.api_key)
    monkeypatch.setenv("OPENAI_API_KEY", openai_fake.api_key)


def failed_attempt(message: dict[str, Any], kind: str, status: int | None = None) -> None:
    assert message["type"] == "assistant" and message["stop_reason"] == "error"
    assert message["error"]["kind"] == kind, message["error"]
    if status is not None:
        assert message["error"]["status"] == status


# --- overflow --------------------------------------------------------------------------------


@pytest.mark.usefixtures("keys")
async def test_anthropic_overflow_compacts_and_retries(
    serve: Serve,
    anthropic_fake: A.AnthropicFake,
) -> None:
    anthropic_fake.add(
        A.Reply([A.Thinking("Easy."), A.Text("nvim is a vim fork.")]),
        A.Error.overflow(),  # run 2, first attempt
        A.Reply([A.Thinking("Summarize."), A.Text("The user asked what nvim is: a vim fork.")]),
        A.Reply([A.Thinking("Using the summary."), A.Text("It is extensible in Lua.")]),
        A.Reply([A.Text("Yes.")]),  # run 3 replays summary + kept messages
    )
    async with serve(agents={"claude": claude(anthropic_fake, max_retries=0)}) as client:
        conv = await Conversation.create(client, "Be brief.")
        first = await conv.completed("What is nvim?", "claude")
        posted = await conv.completed("How does it differ from vim?", "claude")
        record = await conv.record(posted["run_id"])
        context = await conv.context()
        await conv.completed("Really?", "claude")
        transcript = await conv.transcript()

    assert anthropic_fake.rejections == []
    # the run record: the prompt, the failed attempt, the answer after the retry
    assert record["status"] == "completed" and record["error"] is None
    assert kinds(record["new_messages"]) == ["user", "assistant", "assistant"]
    failed, final = attempts(record)
    failed_attempt(failed, "overflow", 400)
    assert failed["content"] == [] and "prompt is too long" in failed["error"]["message"]
    assert final == record["final"] and final["stop_reason"] == "end_turn"
    assert final["content"][1] == {"type": "text", "text": "It is extensible in Lua."}
    (compaction,) = record["compactions"]
    assert compaction["reason"] == "overflow" and compaction["previous_summary"] == ""
    assert compaction["summary"] == "The user asked what nvim is: a vim fork."
    assert compaction["folded"] == first["context"]["messages"]  # thinking and signature too
    assert compaction["tokens_after"] < compaction["tokens_before"]
    # the stored record says what the POST answered
    for name in ("new_messages", "final", "compactions", "usage", "etag", "status"):
        assert record[name] == posted[name]
    # the stored context: the summary, then the current turn; the failed attempt is not in it
    assert context["summary"] == compaction["summary"]
    assert kinds(context["messages"]) == ["user", "assistant"]
    assert context["messages"][1] == final
    # what the fake was sent: the summary request, then the retry with the summary first
    summary_request = anthropic_fake.message_requests[2].json
    assert summary_request["system"] == SUMMARY_SYSTEM_PROMPT and "tools" not in summary_request
    assert "nvim is a vim fork." in summary_request["messages"][0]["content"][0]["text"]
    retry = anthropic_fake.message_requests[3].json["messages"]
    assert retry == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": SUMMARY_PREFIX + compaction["summary"]},
                {"type": "text", "text": "How does it differ from vim?"},
            ],
        }
    ]
    # run 3 replayed the kept assistant turn with its signed thinking
    assert anthropic_fake.message_requests[4].json["messages"][1]["content"][0] == {
        "type": "thinking",
        "thinking": "Using the summary.",
        "signature": A.sign("Using the summary."),
    }
    # the transcript keeps the failed attempt (flagged) and the compaction where it happened
    run2 = [(e["kind"], e["failed"]) for e in transcript if e["run_id"] == posted["run_id"]]
    assert run2 == [("prompt", False), ("attempt", True), ("compaction", False), ("attempt", False)]


@pytest.mark.usefixtures("keys")
async def test_openai_overflow_compacts_and_retries_then_fails_when_nothing_is_left(
    serve: Serve,
    openai_fake: O.OpenAIFake,
) -> None:
    openai_fake.add(
        O.Reply(tool_calls=[O.ToolCall("wait", '{"seconds":0}')]),
        O.Reply(text="Waited."),
        O.Error.overflow(),  # run 2
        O.Reply(text="Summary: the user had the assistant wait."),
        O.Reply(text="Fine."),
        # run 3: overflow, compaction, overflow again with only the prompt left to fold
        O.Error.overflow(),
        O.Reply(text="Summary again."),
        O.Error.overflow(),
    )
    async with serve(agents={"gpt": gpt(openai_fake, max_retries=0)}) as client:
        conv = await Conversation.create(client)
        first = await conv.completed("Wait.", "gpt")
        second = await conv.completed("Now?", "gpt")
        third = await conv.run("Huge prompt.", "gpt")
        record = await conv.record(third["run_id"])
        context = await conv.context()

    assert openai_fake.rejections == []
    (compaction,) = second["compactions"]
    # the tool call and its result are folded together, never split
    assert kinds(compaction["folded"]) == ["user", "assistant", "tool_result", "assistant"]
    assert compaction["folded"] == first["context"]["messages"]
    assert compaction["folded"][1]["content"][0]["arguments"] == '{"seconds":0}'
    failed_attempt(attempts(second)[0], "overflow", 400)
    assert openai_fake.chat_requests[4].json["messages"][0] == {
        "role": "user",
        "content": SUMMARY_PREFIX + compaction["summary"],
    }

    # run 3: overflow, compaction of run 2's turn, overflow again with only the prompt left
    assert record["status"] == "failed" and third["status"] == "failed"
    problem = record["error"]
    assert problem["type"] == PROBLEMS + "run-context-overflow"
    assert problem["kind"] == "overflow" and problem["code"] == "nothing_to_compact"
    assert [c["reason"] for c in record["compactions"]] == ["overflow"]
    assert record["compactions"][0]["previous_summary"] == compaction["summary"]
    assert kinds(record["new_messages"]) == ["user", "assistant", "assistant"]
    for message in attempts(record):
        failed_attempt(message, "overflow", 400)
    assert record["final"] == attempts(record)[-1]
    # on_failure keep: the completed compaction and the prompt are stored, no failed attempt
    assert third["stored"] is True
    assert context["summary"] == "Summary again."
    assert context["messages"] == [
        {"type": "user", "content": [{"type": "text", "text": "Huge prompt."}]}
    ]


# --- 429 -------------------------------------------------------------------------------------


@pytest.mark.usefixtures("keys")
async def test_rate_limit_waits_for_retry_after(
    serve: Serve,
    anthropic_fake: A.AnthropicFake,
    openai_fake: O.OpenAIFake,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The service's own retry policy: it waits what ``retry-after`` says (the delay it
    chose before each retry is recorded; no test asserts how fast anything is)."""
    waits: list[tuple[float | None, float]] = []  # (retry-after the error said, delay waited)
    delay = RetryPolicy.delay

    def recorded(self: RetryPolicy, retry: int, retry_after: float | None) -> float:
        waits.append((retry_after, delay(self, retry, retry_after)))
        return waits[-1][1]

    monkeypatch.setattr(RetryPolicy, "delay", recorded)
    anthropic_fake.add(A.Error.rate_limit(retry_after="1"), A.Reply([A.Text("Hi.")]))
    openai_fake.add(O.Error.rate_limit(retry_after="1", retry_after_ms="600"), O.Reply(text="Hi."))
    profiles = {
        "claude": claude(anthropic_fake, max_retries=2),
        "gpt": gpt(openai_fake, max_retries=2),
    }
    async with serve(agents=profiles) as client:
        conv = await Conversation.create(client)
        by_claude = await conv.completed("Hello.", "claude")
        by_gpt = await conv.completed("Hello again.", "gpt")
        context = await conv.context()

    assert waits == [(1.0, 1.0), (0.6, 0.6)]  # retry-after: 1; then retry-after-ms: 600 wins
    assert len(anthropic_fake.requests) == len(openai_fake.chat_requests) == 2
    # a retry before anything streamed is not an attempt: only the answer is recorded
    for body in (by_claude, by_gpt):
        assert kinds(body["new_messages"]) == ["user", "assistant"]
        assert body["final"]["stop_reason"] == "end_turn" and body["error"] is None
    assert kinds(context["messages"]) == ["user", "assistant", "user", "assistant"]


@pytest.mark.usefixtures("keys")
async def test_rate_limit_that_stays_fails_the_run_after_max_retries(
    serve: Serve,
    openai_fake: O.OpenAIFake,
) -> None:
    openai_fake.add(O.Reply(text="Earlier."))
    openai_fake.default = O.Error.rate_limit(retry_after="1")
    async with serve(
        agents={"gpt": gpt(openai_fake, max_retries=2)}, pool=fast_retries("gpt")
    ) as client:
        conv = await Conversation.create(client)
        await conv.completed("First.", "gpt")
        body = await conv.run("Second.", "gpt", on_failure="discard")
        record = await conv.record(body["run_id"])
        context = await conv.context()

    assert len(openai_fake.chat_requests) == 1 + 3  # the attempt and 2 retries
    assert record["status"] == "failed" and record["stored"] is False
    problem = record["error"]
    assert problem["type"] == PROBLEMS + "run-provider-unavailable"
    assert (problem["kind"], problem["provider_status"], problem["code"]) == (
        "retryable",
        429,
        "rate_limit_exceeded",
    )
    assert problem["detail"].endswith("(after 2 retries)")
    assert kinds(record["new_messages"]) == ["user", "assistant"]
    failed_attempt(record["final"], "retryable", 429)
    # on_failure discard: the stored context is the first run's, the record keeps everything
    assert kinds(context["messages"]) == ["user", "assistant"]
    assert body["etag"] == body["base_etag"]


# --- 529 -------------------------------------------------------------------------------------


@pytest.mark.usefixtures("keys")
async def test_overloaded_is_retried_with_the_service_backoff(
    serve: Serve,
    anthropic_fake: A.AnthropicFake,
) -> None:
    """Two 529s without retry-after, then an answer: the real policy's backoff (0.5 s, 1 s)."""
    anthropic_fake.add(
        A.Error.overloaded(),
        A.Error.overloaded(),
        A.Reply([A.Thinking("Finally."), A.Text("Here.")]),
    )
    async with serve(agents={"claude": claude(anthropic_fake, max_retries=2)}) as client:
        conv = await Conversation.create(client)
        body = await conv.completed("Hello.", "claude")
        record = await conv.record(body["run_id"])

    assert len(anthropic_fake.message_requests) == 3
    assert kinds(record["new_messages"]) == ["user", "assistant"]
    assert record["final"]["content"][1]["text"] == "Here."


@pytest.mark.usefixtures("keys")
async def test_overloaded_past_max_retries_fails_and_the_next_run_continues(
    serve: Serve,
    anthropic_fake: A.AnthropicFake,
) -> None:
    anthropic_fake.add(
        A.Reply([A.Thinking("One."), A.Text("First answer.")]),
        A.Error.overloaded(),
        A.Error.overloaded(),  # run 2: the attempt and its one retry
        A.Reply([A.Thinking("Two."), A.Text("Answering both.")]),  # run 3
    )
    async with serve(
        agents={"claude": claude(anthropic_fake, max_retries=1)}, pool=fast_retries("claude")
    ) as client:
        conv = await Conversation.create(client)
        await conv.completed("First.", "claude")
        failed = await conv.run("Second.", "claude")
        record = await conv.record(failed["run_id"])
        context = await conv.context()
        await conv.completed("Third.", "claude")

    assert anthropic_fake.rejections == []
    assert record["status"] == "failed" and record["stored"] is True
    problem = record["error"]
    assert problem["type"] == PROBLEMS + "run-provider-unavailable"
    assert problem["title"] == "The model provider stayed unavailable"
    assert (problem["kind"], problem["provider_status"], problem["code"]) == (
        "retryable",
        529,
        "overloaded_error",
    )
    assert problem["detail"] == ("anthropic: HTTP 529 overloaded_error: Overloaded (after 1 retry)")
    assert kinds(record["new_messages"]) == ["user", "assistant"]
    failed_attempt(record["final"], "retryable", 529)
    # on_failure keep: the prompt is stored, the failed attempt is not
    assert kinds(context["messages"]) == ["user", "assistant", "user"]
    # run 3 sends both unanswered prompts as one user turn, after the signed first answer
    sent = anthropic_fake.message_requests[-1].json["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert [b["text"] for b in sent[2]["content"]] == ["Second.", "Third."]


@pytest.mark.usefixtures("keys")
async def test_overloaded_error_event_after_content_is_a_recorded_attempt(
    serve: Serve,
    anthropic_fake: A.AnthropicFake,
) -> None:
    anthropic_fake.add(
        A.Reply(
            [A.Thinking("Let me see."), A.Text("The answer is")],
            error_event=("overloaded_error", "Overloaded"),
        ),
        A.Reply([A.Thinking("Again."), A.Text("The answer is 42.")]),
    )
    async with serve(
        agents={"claude": claude(anthropic_fake, max_retries=1)}, pool=fast_retries("claude")
    ) as client:
        conv = await Conversation.create(client)
        body = await conv.completed("Answer?", "claude")
        context = await conv.context()

    first, final = attempts(body)
    failed_attempt(first, "retryable", 529)
    assert "error event overloaded_error" in first["error"]["message"]
    # everything that arrived before the error, signature included
    assert first["content"] == [
        {"type": "thinking", "thinking": "Let me see.", "signature": A.sign("Let me see.")},
        {"type": "text", "text": "The answer is"},
    ]
    assert body["final"] == final and final["content"][1]["text"] == "The answer is 42."
    assert context["messages"] == [body["new_messages"][0], final]


# --- 5xx burst -------------------------------------------------------------------------------


@pytest.mark.usefixtures("keys")
async def test_a_burst_of_server_errors(serve: Serve, openai_fake: O.OpenAIFake) -> None:
    openai_fake.add(
        O.Error.server(500),
        O.Error.server(502),
        O.Error.server(503),
        O.Reply(tool_calls=[O.ToolCall("time_now", "{}")]),
        O.Error.server(500),
        O.Reply(text="It is now."),
        # run 2: one more 5xx than max_retries allows
        O.Error.server(500),
        O.Error.server(503),
        O.Error.server(502),
        O.Error.server(504),
    )
    async with serve(
        agents={"gpt": gpt(openai_fake, max_retries=3)}, pool=fast_retries("gpt")
    ) as client:
        conv = await Conversation.create(client)
        recovered = await conv.completed("Time?", "gpt")
        failed = await conv.run("Again?", "gpt")
        record = await conv.record(failed["run_id"])
        context = await conv.context()

    assert openai_fake.rejections == []
    assert len(openai_fake.chat_requests) == 10
    assert kinds(recovered["new_messages"]) == ["user", "assistant", "tool_result", "assistant"]
    assert record["status"] == "failed"
    problem = record["error"]
    assert (problem["kind"], problem["provider_status"]) == ("retryable", 504)
    assert problem["type"] == PROBLEMS + "run-provider-unavailable"
    assert problem["detail"].endswith("(after 3 retries)")
    assert kinds(record["new_messages"]) == ["user", "assistant"]
    failed_attempt(record["final"], "retryable", 504)
    assert kinds(context["messages"]) == ["user", "assistant", "tool_result", "assistant", "user"]


# --- cut streams -----------------------------------------------------------------------------


@pytest.mark.usefixtures("keys")
async def test_anthropic_stream_cut_before_the_signature(
    serve: Serve,
    anthropic_fake: A.AnthropicFake,
) -> None:
    """A thinking block cut before its signature can never be replayed: the cut attempt is a
    failed attempt in the run record, never part of the context; the retry answers."""
    anthropic_fake.add(
        # message_start, ping, content_block_start, 2 thinking deltas, then the connection drops
        A.Reply(
            [A.Thinking("Let me think about it.", stream_signature=False), A.Text("No.")],
            chunk_size=4,
            cut_after=5,
        ),
        A.Reply([A.Thinking("Thought."), A.ToolUse("wait", {"seconds": 0})]),
        A.Reply([A.Thinking(""), A.Text("Done.")]),
        A.Reply([A.Text("Next.")]),
    )
    async with serve(
        agents={"claude": claude(anthropic_fake, max_retries=2)}, pool=fast_retries("claude")
    ) as client:
        conv = await Conversation.create(client)
        body = await conv.completed("Think, then wait.", "claude")
        record = await conv.record(body["run_id"])
        context = await conv.context()
        await conv.completed("Next.", "claude")

    assert anthropic_fake.rejections == []
    assert kinds(record["new_messages"]) == [
        "user",
        "assistant",
        "assistant",
        "tool_result",
        "assistant",
    ]
    cut = record["new_messages"][1]
    failed_attempt(cut, "retryable")
    assert "connection failed" in cut["error"]["message"]
    assert cut["content"] == [{"type": "thinking", "thinking": "Let me t", "signature": ""}]
    assert record["final"]["content"][1]["text"] == "Done."
    assert cut not in context["messages"]
    assert kinds(context["messages"]) == ["user", "assistant", "tool_result", "assistant"]
    # nothing of the cut attempt was ever sent back
    for request in anthropic_fake.message_requests[1:]:
        assert "Let me t" not in json.dumps(request.json["messages"])


@pytest.mark.usefixtures("keys")
async def test_openai_stream_ending_inside_a_tool_call(
    serve: Serve,
    openai_fake: O.OpenAIFake,
) -> None:
    """A stream that ends cleanly before its finish chunk: the half-streamed call is recorded
    in the failed attempt and never run; the retry's call is."""
    openai_fake.add(
        # role chunk, then 2 of the call's argument fragments, then the body just ends
        O.Reply(
            tool_calls=[O.ToolCall("fail", '{"reason": "must not run"}', id="call_cut")],
            chunk_size=8,
            end_after=3,
        ),
        O.Reply(tool_calls=[O.ToolCall("wait", '{"seconds": 0}', id="call_ok")]),
        O.Reply(text="Waited."),
    )
    async with serve(
        agents={"gpt": gpt(openai_fake, max_retries=1)}, pool=fast_retries("gpt")
    ) as client:
        conv = await Conversation.create(client)
        body = await conv.completed("Wait.", "gpt")
        record = await conv.record(body["run_id"])
        context = await conv.context()

    assert kinds(record["new_messages"]) == [
        "user",
        "assistant",
        "assistant",
        "tool_result",
        "assistant",
    ]
    cut = record["new_messages"][1]
    failed_attempt(cut, "retryable")
    assert "finish_reason" in cut["error"]["message"]
    assert cut["content"] == [
        {"type": "tool_call", "id": "call_cut", "name": "fail", "arguments": '{"reason": "must'}
    ]
    results = [m for m in record["new_messages"] if m["type"] == "tool_result"]
    assert [r["tool_call_id"] for r in results] == ["call_ok"]
    assert "call_cut" not in json.dumps(context)
    assert kinds(context["messages"]) == ["user", "assistant", "tool_result", "assistant"]


# --- bad key ---------------------------------------------------------------------------------


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_bad_key_fails_the_run_without_retrying_or_leaking_it(
    serve: Serve,
    anthropic_fake: A.AnthropicFake,
    openai_fake: O.OpenAIFake,
    monkeypatch: pytest.MonkeyPatch,
    provider: str,
) -> None:
    bad = "team-QZXJ-not-the-key-WVUT"  # no sk- prefix: the fake echoes it masked, tea***WVUT
    monkeypatch.setenv("WRONG_KEY", bad)
    profile = (
        gpt(openai_fake, api_key_env="WRONG_KEY")
        if provider == "openai"
        else claude(anthropic_fake, api_key_env="WRONG_KEY")
    )
    async with serve(agents={"p": profile}) as client:  # default max_retries (4)
        conv = await Conversation.create(client)
        body = await conv.run("Hello.", "p")
        record = await conv.record(body["run_id"])
        context = await conv.context()
        transcript = await conv.transcript()

    fake = openai_fake if provider == "openai" else anthropic_fake
    assert len(fake.requests) == 1  # fatal: not retried
    assert fake.rejections[0]["error"]["type"] in ("invalid_request_error", "authentication_error")
    assert body["status"] == record["status"] == "failed"
    problem = record["error"]
    assert problem == body["error"]
    assert problem["type"] == PROBLEMS + "run-provider-error"
    assert problem["title"] == "The model provider refused the request"
    assert (problem["kind"], problem["provider_status"]) == ("fatal", 401)
    assert "authentication failed" in problem["detail"]
    assert kinds(record["new_messages"]) == ["user", "assistant"]
    failed_attempt(record["final"], "fatal", 401)
    assert kinds(context["messages"]) == ["user"]  # on_failure keep: the prompt stays
    everything = json.dumps([body, record, context, transcript])
    for secret in (bad, "QZXJ", "WVUT"):
        assert secret not in everything


async def test_a_missing_key_is_refused_before_anything_runs(
    serve: Serve,
    anthropic_fake: A.AnthropicFake,
) -> None:
    """No key at all is a configuration problem, not a run: 503, no run record, no request."""
    async with serve(agents={"claude": claude(anthropic_fake)}) as client:
        conv = await Conversation.create(client)
        response = await client.post(
            f"/conversations/{conv.id}/runs", json={"prompts": ["Hello."], "agent": "claude"}
        )
        runs = await client.get(f"/conversations/{conv.id}/runs")
        context = await conv.context()

    assert response.status_code == 503
    assert response.headers["content-type"].startswith("application/problem+json")
    assert "ANTHROPIC_API_KEY" in response.json()["detail"]
    assert runs.json()["items"] == [] and context["messages"] == []
    assert anthropic_fake.requests == []


# --- hostile streams (issue 11, point 4) -----------------------------------------------------


@pytest.mark.usefixtures("keys")
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_malformed_chunks_fail_the_run_as_the_providers_fault_and_keep_the_prompt(
    serve: Serve,
    anthropic_fake: A.AnthropicFake,
    openai_fake: O.OpenAIFake,
    provider: str,
) -> None:
    """A chunk cut in the middle of its JSON on every attempt: ``failed`` with a provider
    problem, the prompt and every partial attempt in the record and the transcript, the prompt
    in the stored context (``on_failure: keep``), and the next run answers."""
    fake: Any
    if provider == "openai":
        fake, profile = openai_fake, gpt(openai_fake, max_retries=1)
        # events: the role chunk, "The ", "answ", then the cut chunk
        broken: Any = O.Reply(text="The answer is 42.", chunk_size=4, malformed_at=3)
        good: Any = O.Reply(text="Answering both.")
    else:
        fake, profile = anthropic_fake, claude(anthropic_fake, max_retries=1)
        # events: message_start, ping, thinking start, "Hmm.", signature, stop, text start,
        # "The ", "answ", then the cut chunk
        broken = A.Reply([A.Thinking("Hmm."), A.Text("The answer is 42.")], malformed_at=9)
        good = A.Reply([A.Thinking("Both."), A.Text("Answering both.")])
    fake.add(broken, broken, good)
    async with serve(agents={"p": profile}, pool=fast_retries("p")) as client:
        conv = await Conversation.create(client)
        body = await conv.run("What is the answer?", "p")
        record = await conv.record(body["run_id"])
        context = await conv.context()
        transcript = await conv.transcript()
        after = await conv.completed("Still there?", "p")

    assert fake.rejections == []
    assert body["status"] == record["status"] == "failed"
    assert body["stored"] is True and record["stored"] is True
    problem = record["error"]
    assert problem == body["error"]
    assert problem["type"] == PROBLEMS + "run-provider-unavailable"
    assert (problem["kind"], problem["code"]) == ("retryable", "malformed_stream")
    assert problem["detail"].startswith(f"{provider}: malformed stream data (JSONDecodeError)")
    assert problem["detail"].endswith("(after 1 retry)")
    # the prompt and both cut attempts, each with what arrived before the broken chunk
    assert kinds(record["new_messages"]) == ["user", "assistant", "assistant"]
    for attempt in attempts(record):
        failed_attempt(attempt, "retryable")
        assert attempt["content"][-1] == {"type": "text", "text": "The answ"}
    assert record["final"] == attempts(record)[-1]
    # on_failure keep: the prompt is stored, the failed attempts are not
    assert context["messages"] == [record["new_messages"][0]]
    run = [(e["kind"], e["failed"]) for e in transcript if e["run_id"] == body["run_id"]]
    assert run == [("prompt", False), ("attempt", True), ("attempt", True)]
    # the next run sends both prompts and answers
    assert kinds(after["context"]["messages"]) == ["user", "user", "assistant"]
    assert len(fake.requests) == 3


@pytest.mark.usefixtures("keys")
async def test_a_streamed_run_that_meets_a_malformed_chunk_finishes_with_the_failure(
    serve: Serve, openai_fake: O.OpenAIFake
) -> None:
    """The SSE client sees the prompt's ``message`` event, the cut attempt's deltas and its
    ``message`` (stop_reason error), then ``run.finished`` with the failed run — the same
    record ``GET …/runs/{id}`` and the transcript hold."""
    openai_fake.add(O.Reply(text="The answer is 42.", chunk_size=4, malformed_at=3))
    async with serve(agents={"p": gpt(openai_fake, max_retries=0)}) as client:
        conv = await Conversation.create(client)
        response = await client.post(
            f"/conversations/{conv.id}/runs",
            headers={"Accept": "text/event-stream"},
            json={"prompts": ["What is the answer?"], "agent": "p"},
        )
        events = [
            (
                chunk.split("\n")[0].removeprefix("event: "),
                json.loads(chunk.split("\n")[1].removeprefix("data: ")),
            )
            for chunk in response.text.strip().split("\n\n")
        ]
        record = await conv.record(events[-1][1]["run_id"])
        context = await conv.context()
        transcript = await conv.transcript()

    assert response.status_code == 201
    names = [name for name, _ in events]
    assert names[0] == "run.started" and names[-1] == "run.finished"
    messages = [data for name, data in events if name == "message"]
    assert messages == record["new_messages"]
    assert kinds(messages) == ["user", "assistant"]
    failed_attempt(messages[1], "retryable")
    deltas = "".join(d["text"] for name, d in events if name == "delta" and d["kind"] == "text")
    assert deltas == "The answ" == messages[1]["content"][0]["text"]
    finished = events[-1][1]
    assert finished["status"] == "failed" and finished["stored"] is True
    assert finished["error"]["type"] == PROBLEMS + "run-provider-unavailable"
    assert finished["error"]["code"] == "malformed_stream"
    assert context["messages"] == [messages[0]]
    run = [(e["kind"], e["failed"]) for e in transcript if e["run_id"] == record["run_id"]]
    assert run == [("prompt", False), ("attempt", True)]


@pytest.mark.usefixtures("keys")
async def test_anthropic_events_out_of_order_fail_the_run_at_once(
    serve: Serve, anthropic_fake: A.AnthropicFake
) -> None:
    start = {
        "type": "message_start",
        "message": {"id": "msg_x", "type": "message", "role": "assistant", "content": []},
    }
    orphan = {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "text_delta", "text": "orphan"},
    }
    anthropic_fake.add(
        A.RawSSE([("message_start", start), ("content_block_delta", orphan)]),
        A.Reply([A.Thinking("Fine."), A.Text("Working again.")]),
    )
    async with serve(agents={"claude": claude(anthropic_fake)}) as client:  # max_retries 4
        conv = await Conversation.create(client)
        body = await conv.run("Hello?", "claude")
        context = await conv.context()
        after = await conv.completed("Again?", "claude")

    assert len(anthropic_fake.message_requests) == 2  # fatal: not retried
    assert body["status"] == "failed" and body["stored"] is True
    problem = body["error"]
    assert problem["type"] == PROBLEMS + "run-provider-error"
    assert (problem["kind"], problem["code"]) == ("fatal", "protocol_error")
    assert "content_block_delta for block 0 before its content_block_start" in problem["detail"]
    assert kinds(body["new_messages"]) == ["user", "assistant"]
    assert kinds(context["messages"]) == ["user"]
    assert kinds(after["context"]["messages"]) == ["user", "user", "assistant"]


# --- absurd usage ----------------------------------------------------------------------------


@pytest.mark.usefixtures("keys")
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_token_count_past_any_real_one_is_kept_at_the_maximum(
    serve: Serve, anthropic_fake: A.AnthropicFake, openai_fake: O.OpenAIFake, provider: str
) -> None:
    """A provider reporting 10**30 tokens sent garbage, not an answer to refuse: the run
    completes with the count kept at MAX_TOKEN_COUNT (stored as a number every database
    integer holds), and the conversation is free for the next run."""
    huge = 10**30
    if provider == "openai":
        openai_fake.add(O.Reply(text="big", prompt_tokens=huge, completion_tokens=2**63))
        openai_fake.add(O.Reply(text="next"))
        profile = gpt(openai_fake)
    else:
        anthropic_fake.add(A.Reply([A.Text("big")], input_tokens=huge, output_tokens=2**63))
        anthropic_fake.add(A.Reply([A.Text("next")]))
        profile = claude(anthropic_fake, thinking_budget=None)
    async with serve(agents={"p": profile}) as client:
        conv = await Conversation.create(client)
        first = await conv.completed("Hello.", "p")
        assert first["usage"]["input_tokens"] == MAX_TOKEN_COUNT
        assert first["usage"]["output_tokens"] == MAX_TOKEN_COUNT
        assert (await conv.record(first["run_id"]))["usage"] == first["usage"]
        assert (await client.get(f"/conversations/{conv.id}")).json()["active_run_id"] is None
        await conv.completed("Again.", "p")
        usage = (await client.get("/usage")).json()["days"][0]
        assert usage["input_tokens"] >= MAX_TOKEN_COUNT
