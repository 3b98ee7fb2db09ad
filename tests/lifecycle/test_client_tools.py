"""Pending client calls and approvals survive a process restart (issue 12): they are read from
the stored context alone, so a real ``carryover serve`` killed and started again shows them and
accepts their answers."""

from __future__ import annotations

import pytest

from .harness import Servers, client, create_conversation

LOOKUP = {"name": "lookup", "parameters": {"type": "object"}}


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
async def test_pending_calls_survive_a_restart(
    engine: str, request: pytest.FixtureRequest, servers: Servers
) -> None:
    url = request.getfixturevalue(f"{engine}_url" if engine == "sqlite" else "postgres_url")
    [server] = await servers.start(url, approval_required="time_now")
    async with client(server) as http:
        conv, _ = await create_conversation(http)
        other, _ = await create_conversation(http)
        paused = await http.post(
            f"/conversations/{conv}/runs",
            json={"prompts": ['/tool lookup {"q": 1}'], "tools": [LOOKUP]},
        )
        gated = await http.post(
            f"/conversations/{other}/runs", json={"prompts": ["/tool time_now {}"]}
        )
        assert paused.json()["status"] == gated.json()["status"] == "requires_action"
        before = (await http.get(f"/conversations/{conv}")).json()["pending_tool_calls"]
        approval = (await http.get(f"/conversations/{other}")).json()["pending_tool_calls"]
        assert [c["kind"] for c in before + approval] == ["client", "approval"]

    server.kill()
    await servers.restart(server)

    async with client(server) as http:
        assert (await http.get(f"/conversations/{conv}")).json()["pending_tool_calls"] == before
        assert (await http.get(f"/conversations/{other}")).json()["pending_tool_calls"] == approval
        refused = await http.post(f"/conversations/{conv}/runs", json={"prompts": ["hello?"]})
        assert refused.status_code == 409
        result = {
            "type": "tool_result",
            "tool_call_id": before[0]["id"],
            "tool_name": "lookup",
            "content": [{"type": "text", "text": "the answer is 42"}],
        }
        done = await http.post(f"/conversations/{conv}/runs", json={"prompts": [result]})
        assert done.json()["status"] == "completed", done.text
        assert "the answer is 42" in done.json()["final"]["content"][0]["text"]
        approved = await http.post(
            f"/conversations/{other}/runs",
            json={"approvals": [{"tool_call_id": approval[0]["id"], "approve": True}]},
        )
        assert approved.json()["status"] == "completed", approved.text
