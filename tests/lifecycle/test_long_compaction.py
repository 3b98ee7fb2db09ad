"""Issue 10's reproduction: a conversation that needs compaction completes a run, on two
``carryover serve`` processes sharing one PostgreSQL.

9,000 alternating messages of ``u00001 `` + 50 ``a`` (57 characters), a context window they
overflow: before issue 10 the compaction froze its process for 15-19 s, the other process
found the lease expired and marked the run ``interrupted``, nothing was stored, and every
retry froze again. Now counting, choosing the cut and folding run off the event loop, and the
lease keeper renews meanwhile. The servers use the lifecycle lease of 2 s, so a stall of the
loop longer than that would interrupt the run."""

from __future__ import annotations

from typing import Any

from .harness import Servers, client

MESSAGES = 9_000


def long_context() -> dict[str, Any]:
    messages = []
    for i in range(MESSAGES):
        block = [{"type": "text", "text": f"u{i:05d} " + "a" * 50}]
        role = "user" if i % 2 == 0 else "assistant"
        messages.append({"type": role, "content": block})
    return {"system_prompt": "", "summary": "", "messages": messages}


async def test_a_run_that_must_compact_9000_messages_completes_on_two_processes(
    postgres_url: str, servers: Servers
) -> None:
    a, b = await servers.start(postgres_url, 2, context_window=100_000)
    async with client(a) as http_a, client(b) as http_b:
        put = await http_a.put(
            "/conversations/long/context",
            json=long_context(),
            headers={"If-None-Match": "*"},
        )
        assert put.status_code == 201, put.text

        for http, prompt in ((http_a, "compact on A"), (http_b, "then on B")):
            ran = await http.post(
                "/conversations/long/runs",
                json={"prompts": [prompt]},
                headers={"Prefer": "return=minimal"},
            )
            assert ran.status_code == 201, ran.text
            body = ran.json()
            assert (body["status"], body["stored"]) == ("completed", True), body
            if prompt == "compact on A":
                [compaction] = body["compactions"]
                assert compaction["reason"] == "threshold"
                assert compaction["at"] == 0  # right before the run's prompt

        stored = await http_b.get("/conversations/long/context")
        assert stored.status_code == 200
        context = stored.json()
        assert context["summary"]
        assert len(context["messages"]) < MESSAGES
        texts = [m["content"][0]["text"] for m in context["messages"] if m["type"] == "user"]
        assert texts[-2:] == ["compact on A", "then on B"]
        for http in (http_a, http_b):  # both processes still answer
            assert (await http.get("/healthz")).status_code == 200
