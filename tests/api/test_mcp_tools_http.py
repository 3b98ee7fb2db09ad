"""Remote MCP tools over the native API (docs/tools.md, "Remote MCP tools"), on SQLite and
PostgreSQL, against a real MCP server (the ``mcp`` package's ``MCPServer`` on streamable HTTP,
tests/fakes/mcp_server.py).

A profile's servers and a request's ``{"type": "mcp", …}`` entries: the result of a call reaches
the model and the transcript; ``allowed_tools`` is enforced on both sides; approvals pause and
resume; a tool that raises or outlives its timeout is a tool error the run goes past; a server
that cannot be listed fails the run before admission; a URL that is not allowed, or private, is
refused before any connection; cancelling a run reaches the server; headers reach the server
and nothing else; one name in two places is a 422.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from app.config import AgentProfile

from ..fakes.mcp_server import ConnectionProbe, FakeMcp, wait_for
from ..helpers import assert_problem, free_port, until
from .conftest import AppClient, SettingsFactory, start_client

SECRET = "Bearer mcp-secret-7f3a9c"


@pytest.fixture
def fake() -> Iterator[FakeMcp]:
    with FakeMcp("dictionary") as server:
        yield server


def entry(fake: FakeMcp, **overrides: Any) -> dict[str, Any]:
    """A request's MCP tools entry for ``fake`` (its approvals off unless overridden)."""
    return {
        "type": "mcp",
        "server_label": "dict",
        "server_url": fake.url,
        "require_approval": "never",
        **overrides,
    }


def allowing(fake: FakeMcp) -> dict[str, Any]:
    """Settings that let requests name ``fake`` (its loopback address, named explicitly)."""
    return {"mcp_allowed_urls": f"http://127.0.0.1:{fake.port}/"}


def profile_server(url: str, **overrides: Any) -> list[dict[str, Any]]:
    return [{"label": "dict", "url": url, "require_approval": "never", **overrides}]


async def run(client: AppClient, conv: str, prompt: str, **body: Any) -> dict[str, Any]:
    response = await client.post(f"/conversations/{conv}/runs", json={"prompts": [prompt], **body})
    assert response.status_code == 201, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def created(client: AppClient, conv: str = "c") -> str:
    response = await client.post("/conversations", json={"id": conv})
    assert response.status_code == 201, response.text
    return conv


def final_text(answer: dict[str, Any]) -> str:
    return "".join(b["text"] for b in answer["final"]["content"] if b["type"] == "text")


async def test_a_profile_servers_result_reaches_the_model_and_the_transcript(
    app_factory: Callable[..., Any], fake: FakeMcp
) -> None:
    async with app_factory(mcp_servers=profile_server(fake.url)) as client:
        conv = await created(client)
        answer = await run(client, conv, '/tool lookup {"word": "carry"}')
        assert answer["status"] == "completed"
        assert final_text(answer) == 'Tool lookup returned: "definition of carry"'
        call, result = answer["new_messages"][1], answer["new_messages"][2]
        assert call["content"][0] == {
            "type": "tool_call",
            "id": call["content"][0]["id"],
            "name": "lookup",
            "arguments": '{"word": "carry"}',
            "server_label": "dict",
        }
        assert result["content"] == [{"type": "text", "text": "definition of carry"}]
        assert result["is_error"] is False
        assert fake.called("lookup") == [{"word": "carry"}]
        transcript = (await client.get(f"/conversations/{conv}/transcript")).json()["items"]
        kinds = [(e["kind"], e["body"].get("type")) for e in transcript]
        assert ("tool_result", "tool_result") in kinds
        stored = (await client.get(f"/conversations/{conv}/context")).json()
        assert stored["messages"][1]["content"][0]["server_label"] == "dict"


async def test_allowed_tools_hide_the_others_from_the_model_and_the_server(
    app_factory: Callable[..., Any], fake: FakeMcp
) -> None:
    async with app_factory(**allowing(fake)) as client:
        conv = await created(client)
        tools = [entry(fake, allowed_tools=["lookup"])]
        answer = await run(client, conv, '/tool add {"a": 1, "b": 2}', tools=tools)
        result = answer["new_messages"][2]
        assert result["is_error"] is True
        assert "unknown tool 'add'" in result["content"][0]["text"]
        # the call was never stamped as the server's, and the server never saw it
        assert "server_label" not in answer["new_messages"][1]["content"][0]
        assert fake.called("add") == []
        allowed = await run(client, conv, '/tool lookup {"word": "x"}', tools=tools)
        assert final_text(allowed) == 'Tool lookup returned: "definition of x"'


async def test_a_call_awaiting_approval_is_an_approval_and_resumes_approved_or_denied(
    app_factory: Callable[..., Any], fake: FakeMcp
) -> None:
    async with app_factory(**allowing(fake)) as client:
        conv = await created(client)
        tools = [entry(fake, require_approval=None)]  # left out: every call asks
        paused = await run(client, conv, '/tool lookup {"word": "yes"}', tools=tools)
        assert paused["status"] == "requires_action"
        [call] = paused["required_action"]["tool_calls"]
        assert call["kind"] == "approval" and call["server_label"] == "dict"
        assert fake.called("lookup") == []
        meta = (await client.get(f"/conversations/{conv}")).json()
        assert meta["pending_tool_calls"] == [call]
        # approving needs the server: a run that does not name it is refused, nothing runs
        refused = await client.post(
            f"/conversations/{conv}/runs",
            json={"approvals": [{"tool_call_id": call["id"], "approve": True}]},
        )
        assert_problem(refused, 422, "unexpected-tool-answer")
        assert fake.called("lookup") == []
        approved = await client.post(
            f"/conversations/{conv}/runs",
            json={"approvals": [{"tool_call_id": call["id"], "approve": True}], "tools": tools},
        )
        assert approved.status_code == 201, approved.text
        assert final_text(approved.json()) == 'Tool lookup returned: "definition of yes"'
        assert fake.called("lookup") == [{"word": "yes"}]

        again = await run(client, conv, '/tool lookup {"word": "no"}', tools=tools)
        [call] = again["required_action"]["tool_calls"]
        denied = await client.post(
            f"/conversations/{conv}/runs",
            json={
                "approvals": [{"tool_call_id": call["id"], "approve": False, "reason": "not now"}]
            },
        )
        assert denied.status_code == 201, denied.text
        assert final_text(denied.json()) == 'Tool lookup failed: "denied: not now"'
        assert fake.called("lookup") == [{"word": "yes"}]


async def test_a_tool_that_raises_is_a_tool_error_and_the_run_goes_on(
    app_factory: Callable[..., Any], fake: FakeMcp
) -> None:
    async with app_factory(mcp_servers=profile_server(fake.url)) as client:
        conv = await created(client)
        answer = await run(client, conv, '/tool explode {"reason": "on purpose"}')
        assert answer["status"] == "completed"
        result = answer["new_messages"][2]
        assert result["is_error"] is True
        assert final_text(answer).startswith("Tool explode failed:")


async def test_a_call_past_its_timeout_is_a_tool_error_and_the_run_goes_on(
    app_factory: Callable[..., Any], fake: FakeMcp
) -> None:
    fake.gate("never")  # never opened: only the timeout ends the call
    servers = profile_server(fake.url, call_timeout=1)
    async with app_factory(mcp_servers=servers) as client:
        conv = await created(client)
        answer = await run(client, conv, '/tool hold {"label": "never"}')
        assert answer["status"] == "completed"
        result = answer["new_messages"][2]
        assert result["is_error"] is True
        assert "MCP server 'dict'" in result["content"][0]["text"]
        assert "timed out after 1s" in result["content"][0]["text"]
        await wait_for(fake.cancelled["never"], "the server seeing the call end")


async def test_a_server_that_cannot_be_listed_fails_the_run_before_admission(
    app_factory: Callable[..., Any],
) -> None:
    down = f"http://127.0.0.1:{free_port()}/mcp"  # nothing listens there
    async with app_factory(mcp_servers=profile_server(down, connect_timeout=2)) as client:
        conv = await created(client)
        before = await client.get(f"/conversations/{conv}/context")
        answer = await run(client, conv, "hello")
        assert answer["status"] == "failed"
        assert answer["new_messages"] == [] and answer["final"] is None
        assert "MCP server 'dict'" in answer["error"]["detail"]
        after = await client.get(f"/conversations/{conv}/context")
        assert after.headers["etag"] == before.headers["etag"]
        assert after.json() == before.json()


@pytest.mark.parametrize("allowed", ["", "http://127.0.0.1:1/"])
async def test_a_server_url_that_is_not_allowed_is_refused_without_a_connection(
    app_factory: Callable[..., Any], allowed: str
) -> None:
    with ConnectionProbe() as probe:
        async with app_factory(mcp_allowed_urls=allowed) as client:
            conv = await created(client)
            response = await client.post(
                f"/conversations/{conv}/runs",
                json={
                    "prompts": ["hi"],
                    "tools": [{"type": "mcp", "server_label": "p", "server_url": probe.url()}],
                },
            )
            body = assert_problem(response, 422, "validation-error")
            assert body["errors"][0]["path"] == "body.tools[0].server_url"
            runs = (await client.get(f"/conversations/{conv}/runs")).json()["items"]
            assert runs == []
        assert probe.settled() == 0


async def test_a_private_server_url_is_refused_unless_its_allowed_entry_names_it(
    app_factory: Callable[..., Any],
) -> None:
    with ConnectionProbe() as probe:
        named = f"http://mcp.internal.example:{probe.port}/"
        literal = f"http://127.0.0.1:{probe.port}/"
        async with app_factory(mcp_allowed_urls=f"{named},{literal}") as client:
            client.app.state.services.runs.state.mcp.resolver = _resolves_to_loopback
            conv = await created(client)
            response = await client.post(
                f"/conversations/{conv}/runs",
                json={
                    "prompts": ["hi"],
                    "tools": [{"type": "mcp", "server_label": "p", "server_url": named + "mcp"}],
                },
            )
            body = assert_problem(response, 422, "validation-error")
            assert "loopback" in body["detail"]
            assert probe.settled() == 0
            # an allowed entry that names the private address itself is the operator's yes
            answer = await run(
                client,
                conv,
                "hi",
                tools=[{"type": "mcp", "server_label": "p", "server_url": literal + "mcp"}],
            )
            assert answer["status"] == "failed"  # the probe answers nothing: not listable
            assert "MCP server 'p'" in answer["error"]["detail"]
            assert probe.settled() > 0


async def _resolves_to_loopback(host: str, port: int) -> list[Any]:
    import ipaddress

    return [ipaddress.ip_address("127.0.0.1")]


async def test_cancelling_a_run_reaches_the_server(
    app_factory: Callable[..., Any], fake: FakeMcp
) -> None:
    fake.gate("slow")
    async with app_factory(mcp_servers=profile_server(fake.url)) as client:
        conv = await created(client)
        started = await client.post(
            f"/conversations/{conv}/runs",
            json={"prompts": ['/tool hold {"label": "slow"}']},
            headers={"Prefer": "respond-async"},
        )
        assert started.status_code == 202, started.text
        run_id = started.json()["run_id"]
        await wait_for(fake.arrived["slow"], "the call reaching the server")
        cancel = await client.post(f"/conversations/{conv}/runs/{run_id}/cancel")
        assert cancel.status_code in (200, 202), cancel.text
        await wait_for(fake.cancelled["slow"], "the server seeing the cancellation")

        async def ended() -> dict[str, Any] | None:
            record = (await client.get(f"/conversations/{conv}/runs/{run_id}")).json()
            return record if record["status"] != "running" else None

        record = await until(ended, what="the run to end")
        assert record["status"] == "cancelled"
        result = record["new_messages"][-1]
        assert result["type"] == "tool_result" and result["is_error"] is True
        assert "interrupted" in result["content"][0]["text"]


async def test_headers_reach_the_server_and_nothing_else(
    app_factory: Callable[..., Any], fake: FakeMcp, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with app_factory(**allowing(fake)) as client:
        conv = await created(client)
        tools = [entry(fake, headers={"Authorization": SECRET})]
        answer = await run(client, conv, '/tool lookup {"word": "key"}', tools=tools)
        assert answer["status"] == "completed"
        assert SECRET in [h.get("authorization") for h in fake.headers]
        run_id = answer["run_id"]
        reads = [
            await client.get(f"/conversations/{conv}/runs/{run_id}"),
            await client.get(f"/conversations/{conv}/runs"),
            await client.get(f"/conversations/{conv}/transcript"),
            await client.get(f"/conversations/{conv}/context"),
            await client.get(f"/conversations/{conv}/runs/{run_id}/events"),
            await client.get(f"/conversations/{conv}/export"),
        ]
        for read in reads:
            assert read.status_code == 200, read.text
            assert SECRET not in read.text and "mcp-secret" not in read.text
        assert "mcp-secret" not in caplog.text
        # a background or queued run cannot keep them: refused before anything is stored
        for extra in ({"headers": {"Prefer": "respond-async"}}, {"if_busy": "enqueue"}):
            headers = extra.get("headers", {})
            body = {"prompts": ["hi"], "tools": tools}
            if "if_busy" in extra:
                body["if_busy"] = extra["if_busy"]
            refused = await client.post(f"/conversations/{conv}/runs", json=body, headers=headers)
            problem = assert_problem(refused, 422, "validation-error")
            assert problem["errors"][0]["path"] == "body.tools[0].headers"
            assert "mcp-secret" not in refused.text


async def test_one_name_in_two_places_is_refused(
    app_factory: Callable[..., Any], fake: FakeMcp
) -> None:
    async with app_factory(**allowing(fake)) as client:
        conv = await created(client)
        twice = [entry(fake), entry(fake, server_label="again")]
        response = await client.post(
            f"/conversations/{conv}/runs", json={"prompts": ["hi"], "tools": twice}
        )
        problem = assert_problem(response, 422, "validation-error")
        assert problem["errors"][0]["path"] == "body.tools[1]"
        assert "both offer a tool named" in problem["detail"]
        client_named = [
            {"name": "lookup", "parameters": {"type": "object"}},
            entry(fake),
        ]
        response = await client.post(
            f"/conversations/{conv}/runs", json={"prompts": ["hi"], "tools": client_named}
        )
        problem = assert_problem(response, 422, "validation-error")
        assert "lookup" in problem["detail"]
        runs = (await client.get(f"/conversations/{conv}/runs")).json()["items"]
        assert runs == []


async def test_a_server_offering_a_name_of_the_agents_own_tools_is_refused(
    app_factory: Callable[..., Any],
) -> None:
    async def time_now() -> str:
        """A clash with the built-in tool."""
        return "never"

    with FakeMcp("clash", extra_tools={"time_now": time_now}) as clash:
        async with app_factory(**allowing(clash)) as client:
            conv = await created(client)
            response = await client.post(
                f"/conversations/{conv}/runs",
                json={"prompts": ["hi"], "tools": [entry(clash)]},
            )
            problem = assert_problem(response, 422, "validation-error")
            assert "already a server tool" in problem["detail"]


async def test_listings_are_cached_between_runs(
    app_factory: Callable[..., Any], fake: FakeMcp
) -> None:
    async with app_factory(mcp_servers=profile_server(fake.url)) as client:
        conv = await created(client)
        for word in ("a", "b", "c"):
            await run(client, conv, f'/tool lookup {{"word": "{word}"}}')
        cache = client.app.state.services.runs.state.mcp.client.cache
        assert cache.fetches == 1


async def test_readyz_reports_each_profiles_mcp_servers_without_failing_readiness(
    app_factory: Callable[..., Any], fake: FakeMcp
) -> None:
    down = f"http://127.0.0.1:{free_port()}/mcp"
    servers = [*profile_server(fake.url), *profile_server(down, label="gone", connect_timeout=2)]
    async with app_factory(mcp_servers=servers) as client:
        got = await client.get("/readyz")
        assert got.status_code == 200, got.text
        body = got.json()
        assert body["status"] == "ready"
        reported = body["profiles"]["default"]["mcp_servers"]
        assert reported["dict"] == {"reachable": True, "reason": None}
        assert reported["gone"]["reachable"] is False
        assert "could not connect" in reported["gone"]["reason"]


async def test_a_pending_calls_kind_is_stored_with_it_not_inferred_from_the_profile(
    make_settings: SettingsFactory,
) -> None:
    # profile "bare" has no server tools, so a client tool may be called time_now; the default
    # profile has a server tool time_now: inferred from it, the call would await an approval
    app, client = await start_client(make_settings(agents={"bare": AgentProfile(tools=())}))
    async with app.router.lifespan_context(app), client:
        conv = await created(client)
        paused = await run(
            client,
            conv,
            "/tool time_now {}",
            agent="bare",
            tools=[{"name": "time_now", "parameters": {"type": "object"}}],
        )
        [call] = paused["required_action"]["tool_calls"]
        assert call["kind"] == "client"
        answered = await client.post(
            f"/conversations/{conv}/runs",
            json={
                "prompts": [
                    {
                        "type": "tool_result",
                        "tool_call_id": call["id"],
                        "tool_name": "time_now",
                        "content": [{"type": "text", "text": "noon"}],
                    }
                ],
                "agent": "default",
            },
        )
        assert answered.status_code == 201, answered.text
        assert final_text(answered.json()) == 'Tool time_now returned: "noon"'


async def test_a_background_run_keeps_its_servers_without_headers_and_calls_them(
    app_factory: Callable[..., Any], fake: FakeMcp
) -> None:
    async with app_factory(**allowing(fake)) as client:
        conv = await created(client)
        started = await client.post(
            f"/conversations/{conv}/runs",
            json={"prompts": ['/tool lookup {"word": "later"}'], "tools": [entry(fake)]},
            headers={"Prefer": "respond-async"},
        )
        assert started.status_code == 202, started.text
        run_id = started.json()["run_id"]

        async def ended() -> dict[str, Any] | None:
            record = (await client.get(f"/conversations/{conv}/runs/{run_id}")).json()
            return record if record["status"] not in ("queued", "running") else None

        record = await until(ended, what="the background run to end")
        assert record["status"] == "completed", record
        assert final_text(record) == 'Tool lookup returned: "definition of later"'
