"""Remote MCP tools on ``/v1`` with the official ``openai`` package against a live server (echo
provider) and a real MCP server (tests/fakes/mcp_server.py): OpenAI's ``{"type": "mcp", …}``
tools, ``mcp_call`` items with the result, ``mcp_approval_request`` / ``mcp_approval_response``,
the streaming helper to its final response, ``allowed_tools``, refusals in OpenAI's shape, and
headers that reach the server and nothing else."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from ..fakes.mcp_server import FakeMcp
from ..helpers import served
from .conftest import KEYS, Server

SECRET = "mcp-v1-secret-5be21d"


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeMcp]:
    with FakeMcp("dictionary") as server:
        yield server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, fake: FakeMcp) -> Iterator[Server]:
    keys = ",".join(f"{t}:{k}" for t, k in KEYS.items())
    with served(
        tmp_path_factory.mktemp("v1-mcp"),
        CARRYOVER_API_KEYS=keys,
        CARRYOVER_MCP_ALLOWED_URLS=f"http://127.0.0.1:{fake.port}/",
    ) as url:
        yield Server(url)


def mcp(fake: FakeMcp, **overrides: Any) -> Any:
    return {
        "type": "mcp",
        "server_label": "dict",
        "server_url": fake.url,
        "require_approval": "never",
        **overrides,
    }


def test_a_server_call_is_an_mcp_call_item_with_its_output(server: Server, fake: FakeMcp) -> None:
    client = server.client()
    conversation = client.conversations.create()
    response = client.responses.create(
        model="default",
        input='/tool lookup {"word": "carry"}',
        conversation=conversation.id,
        tools=[mcp(fake)],
    )
    assert response.status == "completed"
    call, message = response.output
    assert call.type == "mcp_call" and message.type == "message"
    assert (call.server_label, call.name, call.arguments) == ("dict", "lookup", '{"word": "carry"}')
    assert call.output == "definition of carry"
    assert call.error is None
    assert response.output_text == 'Tool lookup returned: "definition of carry"'
    items = client.conversations.items.list(conversation.id, order="asc")
    assert [i.type for i in items.data] == ["message", "mcp_call", "message"]
    assert items.data[1].id == call.id
    assert items.data[1].output == "definition of carry"  # type: ignore[union-attr]
    again = client.responses.retrieve(response.id)
    assert again.output[0].model_dump() == call.model_dump()


def test_the_agents_own_tools_are_mcp_calls_of_carryover(server: Server) -> None:
    response = server.client().responses.create(model="default", input="/tool time_now {}")
    call = response.output[0]
    assert call.type == "mcp_call"
    assert call.server_label == "carryover" and call.name == "time_now"
    assert call.output


def test_streamed_the_call_comes_as_mcp_call_events(server: Server, fake: FakeMcp) -> None:
    client = server.client()
    with client.responses.stream(
        model="default", input='/tool lookup {"word": "stream"}', tools=[mcp(fake)]
    ) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert "response.mcp_call.completed" in kinds
    assert kinds.index("response.mcp_call.completed") < kinds.index("response.completed")
    assert [i.type for i in final.output] == ["mcp_call", "message"]
    assert final.output[0].output == "definition of stream"  # type: ignore[union-attr]


def test_approval_requests_are_answered_with_approval_responses(
    server: Server, fake: FakeMcp
) -> None:
    client = server.client()
    conversation = client.conversations.create()
    tools = [mcp(fake, require_approval="always")]
    asked = client.responses.create(
        model="default",
        input='/tool lookup {"word": "ok"}',
        conversation=conversation.id,
        tools=tools,
    )
    [request] = asked.output
    assert request.type == "mcp_approval_request"
    assert (request.server_label, request.name) == ("dict", "lookup")
    before = len(fake.called("lookup"))
    approved = client.responses.create(
        model="default",
        input=[
            {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}
        ],
        conversation=conversation.id,
        tools=tools,
    )
    call = approved.output[0]
    assert call.type == "mcp_call"
    assert call.approval_request_id == request.id
    assert call.output == "definition of ok"
    assert approved.output_text == 'Tool lookup returned: "definition of ok"'
    assert len(fake.called("lookup")) == before + 1

    asked = client.responses.create(
        model="default",
        input='/tool lookup {"word": "no"}',
        previous_response_id=approved.id,
        tools=tools,
    )
    [request] = asked.output
    denied = client.responses.create(
        model="default",
        input=[
            {
                "type": "mcp_approval_response",
                "approval_request_id": request.id,
                "approve": False,
                "reason": "not today",
            }
        ],
        previous_response_id=asked.id,
        tools=tools,
    )
    assert denied.output_text == 'Tool lookup failed: "denied: not today"'
    assert len(fake.called("lookup")) == before + 1


def test_allowed_tools_are_all_the_model_sees(server: Server, fake: FakeMcp) -> None:
    before = len(fake.called("add"))
    response = server.client().responses.create(
        model="default",
        input='/tool add {"a": 1, "b": 2}',
        tools=[mcp(fake, allowed_tools=["lookup"])],
    )
    assert "unknown tool 'add'" in response.output_text
    assert len(fake.called("add")) == before


def test_refusals_are_openai_errors_naming_the_tool(server: Server, fake: FakeMcp) -> None:
    client = server.client()
    with pytest.raises(openai.BadRequestError) as outside:
        client.responses.create(
            model="default",
            input="hi",
            tools=[mcp(fake, server_url="https://mcp.example.com/mcp")],
        )
    assert outside.value.body["param"] == "tools[0].server_url"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as twice:
        client.responses.create(
            model="default", input="hi", tools=[mcp(fake), mcp(fake, server_label="again")]
        )
    assert "both offer a tool named" in twice.value.body["message"]  # type: ignore[index]


def test_headers_reach_the_server_and_are_never_given_back(server: Server, fake: FakeMcp) -> None:
    client = server.client()
    response = client.responses.create(
        model="default",
        input='/tool lookup {"word": "secret"}',
        tools=[mcp(fake, headers={"X-Api-Key": SECRET}, authorization=SECRET + "-oauth")],
    )
    assert response.status == "completed"
    seen = [(h.get("x-api-key"), h.get("authorization")) for h in fake.headers]
    assert (SECRET, f"Bearer {SECRET}-oauth") in seen
    assert SECRET not in response.model_dump_json()
    again = client.responses.retrieve(response.id)
    assert SECRET not in again.model_dump_json()
    conversation = response.conversation
    assert conversation is not None
    items = client.conversations.items.list(conversation.id)
    assert SECRET not in items.model_dump_json()
    with pytest.raises(openai.BadRequestError) as background:
        client.responses.create(
            model="default",
            input="hi",
            background=True,
            tools=[mcp(fake, headers={"X-Api-Key": SECRET})],
        )
    assert background.value.body["param"] == "tools[0].headers"  # type: ignore[index]


def test_store_false_calls_the_server_and_stores_nothing(server: Server, fake: FakeMcp) -> None:
    response = server.client().responses.create(
        model="default", input='/tool lookup {"word": "air"}', store=False, tools=[mcp(fake)]
    )
    assert response.output[0].type == "mcp_call"
    assert response.output_text == 'Tool lookup returned: "definition of air"'


def test_a_tool_that_raises_is_a_failed_mcp_call_and_the_response_goes_on(
    server: Server, fake: FakeMcp
) -> None:
    response = server.client().responses.create(
        model="default", input='/tool explode {"reason": "v1"}', tools=[mcp(fake)]
    )
    assert response.status == "completed"
    call = response.output[0]
    assert call.type == "mcp_call" and call.status == "failed"
    assert call.output is None and call.error is not None
    assert response.output_text.startswith("Tool explode failed:")


def test_a_server_that_is_down_fails_the_response_naming_it(server: Server, fake: FakeMcp) -> None:
    down = f"http://127.0.0.1:{fake.port}/nothing-here"  # allowed, but no MCP server there
    response = server.client().responses.create(
        model="default", input="hello", tools=[mcp(fake, server_label="gone", server_url=down)]
    )
    assert response.status == "failed"
    assert response.error is not None and "MCP server 'gone'" in response.error.message
    assert response.output == []


def test_cancelling_a_background_response_reaches_the_server(server: Server, fake: FakeMcp) -> None:
    from ..fakes.mcp_server import wait_for_thread

    fake.gate("v1-slow")
    client = server.client()
    started = client.responses.create(
        model="default",
        input='/tool hold {"label": "v1-slow"}',
        tools=[mcp(fake)],
        background=True,
    )
    wait_for_thread(fake.arrived["v1-slow"], "the call reaching the server")
    client.responses.cancel(started.id)
    wait_for_thread(fake.cancelled["v1-slow"], "the server seeing the cancellation")
