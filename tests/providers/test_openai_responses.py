"""OpenAIResponsesProvider against the strict fake Responses API, over real HTTP: what a
stateless request carries, what an answer becomes, and the reasoning items replayed exactly."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import pytest

from app.agent.messages import (
    MAX_TOKEN_COUNT,
    AssistantMessage,
    Base64Source,
    ImageBlock,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
    ToolResultMessage,
    UrlSource,
    Usage,
    UserMessage,
)
from app.agent.providers.base import MessageStart, MessageStop, ProviderRequest, ToolSpec
from app.agent.providers.openai_responses import OpenAIResponsesProvider, build_input
from tests.fakes.openai_responses_fake import (
    Call,
    Reasoning,
    Refusal,
    Reply,
    ResponsesFake,
    Text,
    encrypt,
)

from ._drive import answer, attempt, failure

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\nfake-image-bytes").decode()
TOOLS = (ToolSpec("lookup", "Look a thing up.", {"type": "object", "properties": {}}),)


@pytest.fixture(params=[True, False], ids=["stream", "json"])
async def provider(
    request: pytest.FixtureRequest, responses_fake: ResponsesFake
) -> AsyncIterator[OpenAIResponsesProvider]:
    p = OpenAIResponsesProvider(
        api_key=responses_fake.api_key,
        base_url=responses_fake.base_url,
        model="gpt-fake",
        timeout=10,
        stream=request.param,
    )
    yield p
    await p.aclose()


def req(
    *messages: UserMessage | AssistantMessage | ToolResultMessage,
    system: str = "Be brief.",
    tools: tuple[ToolSpec, ...] = (),
    **fields: Any,
) -> ProviderRequest:
    return ProviderRequest(
        system_prompt=system, messages=messages, tools=tools, model="gpt-fake", **fields
    )


def sent(fake: ResponsesFake) -> dict[str, Any]:
    return fake.response_requests[-1].json


# --- the request and the answer ----------------------------------------------------------------


async def test_text_is_asked_statelessly(
    provider: OpenAIResponsesProvider, responses_fake: ResponsesFake
) -> None:
    responses_fake.add(Reply([Text("Hello, wörld! 👋")], input_tokens=21, id="resp_abc"))
    message = await answer(provider, req(UserMessage.text("hi")))
    assert message.content == (TextBlock(text="Hello, wörld! 👋"),)
    assert message.stop_reason == "end_turn"
    assert message.response_id == "resp_abc" and message.model == "gpt-fake"
    assert message.usage == Usage(input_tokens=21, output_tokens=9)
    assert message.provider == "openai-responses" and message.provider_data == {}
    body = sent(responses_fake)
    assert responses_fake.response_requests[-1].path == "/v1/responses"
    assert body["store"] is False
    assert body["include"] == ["reasoning.encrypted_content"]
    assert body["instructions"] == "Be brief."
    assert body["input"] == [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    ]
    assert "tools" not in body and "text" not in body
    assert body.get("stream") is (True if provider.stream_mode else None)


async def test_an_empty_system_prompt_sends_no_instructions(
    provider: OpenAIResponsesProvider, responses_fake: ResponsesFake
) -> None:
    responses_fake.add(Reply([Text("ok")]))
    await answer(provider, req(UserMessage.text("hi"), system=""))
    assert "instructions" not in sent(responses_fake)


async def test_the_stream_starts_with_the_response_and_ends_with_its_stop(
    responses_fake: ResponsesFake,
) -> None:
    responses_fake.add(Reply([Text("abcdefg")], chunk_size=2, id="resp_1"))
    p = OpenAIResponsesProvider(api_key=responses_fake.api_key, base_url=responses_fake.base_url)
    result = await attempt(p, req(UserMessage.text("hi")))
    await p.aclose()
    assert result.events[0] == MessageStart(response_id="resp_1", model="gpt-fake")
    assert isinstance(result.events[-1], MessageStop)
    assert [e.text for e in result.events if hasattr(e, "text")] == ["ab", "cd", "ef", "g"]


async def test_usage_counts_cached_and_reasoning_tokens(
    provider: OpenAIResponsesProvider, responses_fake: ResponsesFake
) -> None:
    responses_fake.add(
        Reply(
            [Reasoning("Think."), Text("ok")],
            input_tokens=1200,
            cached_tokens=1024,
            output_tokens=300,
            reasoning_tokens=256,
        )
    )
    message = await answer(provider, req(UserMessage.text("hi")))
    assert message.usage == Usage(input_tokens=1200, output_tokens=300, cache_read_tokens=1024)
    assert message.provider_data["reasoning_tokens"] == 256


async def test_a_count_past_any_real_one_is_kept_at_the_maximum(
    provider: OpenAIResponsesProvider, responses_fake: ResponsesFake
) -> None:
    responses_fake.add(Reply([Text("ok")], input_tokens=10**30, output_tokens=2**63))
    message = await answer(provider, req(UserMessage.text("hi")))
    assert message.usage == Usage(input_tokens=MAX_TOKEN_COUNT, output_tokens=MAX_TOKEN_COUNT)


async def test_settings_tools_and_the_output_schema_are_sent_natively(
    provider: OpenAIResponsesProvider, responses_fake: ResponsesFake
) -> None:
    from app.agent.structured import OutputSchema

    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    responses_fake.add(Reply([Text('{"a": "x"}')]))
    await answer(
        provider,
        req(
            UserMessage.text("hi"),
            tools=TOOLS,
            max_output_tokens=300,
            temperature=0.5,
            output_schema=OutputSchema("thing", schema, True),
        ),
    )
    body = sent(responses_fake)
    assert body["tools"] == [
        {
            "type": "function",
            "name": "lookup",
            "description": "Look a thing up.",
            "parameters": {"type": "object", "properties": {}},
            "strict": False,
        }
    ]
    assert body["max_output_tokens"] == 300 and body["temperature"] == 0.5
    assert body["text"] == {
        "format": {"type": "json_schema", "name": "thing", "schema": schema, "strict": True}
    }


async def test_a_refusal_is_text_that_stops_as_a_refusal(
    provider: OpenAIResponsesProvider, responses_fake: ResponsesFake
) -> None:
    responses_fake.add(Reply([Refusal("I can't help with that.")]))
    message = await answer(provider, req(UserMessage.text("hi")))
    assert message.content == (TextBlock(text="I can't help with that."),)
    assert message.stop_reason == "refusal"


async def test_an_incomplete_response_stops_at_its_token_limit(
    provider: OpenAIResponsesProvider, responses_fake: ResponsesFake
) -> None:
    responses_fake.add(Reply([Text("cut sh")], incomplete="max_output_tokens"))
    message = await answer(provider, req(UserMessage.text("hi")))
    assert message.stop_reason == "max_tokens" and message.content == (TextBlock(text="cut sh"),)


async def test_items_sent_whole_without_deltas(responses_fake: ResponsesFake) -> None:
    """A server that streams every item only in its ``output_item.done``."""
    responses_fake.add(
        Reply([Reasoning(["One.", "Two."]), Text("hi"), Call("lookup", "{}")], whole_items=True)
    )
    p = OpenAIResponsesProvider(api_key=responses_fake.api_key, base_url=responses_fake.base_url)
    message = await answer(p, req(UserMessage.text("hi"), tools=TOOLS))
    await p.aclose()
    assert message.content[0] == ThinkingBlock(thinking="One.\n\nTwo.")
    assert message.content[1:] == (
        TextBlock(text="hi"),
        ToolCallBlock(id=message.tool_calls[0].id, name="lookup", arguments="{}"),
    )


# --- reasoning and tool calls, replayed ----------------------------------------------------------


async def test_reasoning_and_calls_come_back_exactly_as_issued(
    provider: OpenAIResponsesProvider, responses_fake: ResponsesFake
) -> None:
    raw = '{"q":  "nvim" ,"n":1}'  # spacing and order as the model wrote them
    responses_fake.add(
        Reply([Reasoning(["Need to look.", "Then answer."]), Call("lookup", raw)]),
        Reply([Reasoning("Done."), Text("Found it.")]),
        Reply([Text("Bye.")]),
    )
    question = UserMessage.text("What is nvim?")
    first = await answer(provider, req(question, tools=TOOLS))
    assert first.stop_reason == "tool_use"
    call = first.tool_calls[0]
    assert call.arguments == raw and call.name == "lookup"
    assert first.content[0] == ThinkingBlock(thinking="Need to look.\n\nThen answer.")
    (item,) = first.provider_data["reasoning"]
    assert item == responses_fake.reasoning[item["id"]]
    assert item["encrypted_content"] == encrypt(item["id"], "Need to look.Then answer.")
    result = ToolResultMessage(
        tool_call_id=call.id, tool_name="lookup", content=(TextBlock(text="a vim fork"),)
    )
    second = await answer(provider, req(question, first, result, tools=TOOLS))
    items = sent(responses_fake)["input"]
    assert items[1] == item  # the reasoning item as received: id, summary, encrypted content
    assert items[2] == {
        "type": "function_call",
        "call_id": call.id,
        "name": "lookup",
        "arguments": raw,
    }
    assert items[3] == {"type": "function_call_output", "call_id": call.id, "output": "a vim fork"}
    history = (question, first, result, second, UserMessage.text("Thanks."))
    await answer(provider, req(*history, tools=TOOLS))
    items = sent(responses_fake)["input"]
    assert [i["type"] for i in items] == [
        "message",
        "reasoning",
        "function_call",
        "function_call_output",
        "reasoning",
        "message",
        "message",
    ]
    assert items[5] == {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "Found it."}],
    }
    assert responses_fake.rejections == []


async def test_a_changed_reasoning_item_is_refused(
    provider: OpenAIResponsesProvider, responses_fake: ResponsesFake
) -> None:
    responses_fake.add(Reply([Reasoning("Plan."), Text("hi")]))
    first = await answer(provider, req(UserMessage.text("hi")))
    (item,) = first.provider_data["reasoning"]
    for changed in (
        {**item, "encrypted_content": item["encrypted_content"][:-2] + "xx"},
        {**item, "summary": [{"type": "summary_text", "text": "Plan!"}]},
        {**item, "id": "rs_other"},
    ):
        tampered = first.model_copy(update={"provider_data": {"reasoning": [changed]}})
        refused = await failure(
            provider, req(UserMessage.text("hi"), tampered, UserMessage.text("?"))
        )
        assert refused.error is not None and refused.error.kind == "fatal"
        assert refused.error.status == 400
    assert len(responses_fake.rejections) == 3


async def test_reasoning_that_cannot_be_replayed_is_left_out(
    provider: OpenAIResponsesProvider, responses_fake: ResponsesFake
) -> None:
    """A reasoning item without its encrypted content (a server that ignored ``include``) and
    one that nothing followed (an answer cut while the model reasoned) are not sent: the API
    would refuse them on every later request."""
    responses_fake.add(
        Reply([Reasoning("Hidden.", encrypted=False), Text("one")]),
        Reply([Reasoning("Still thinking...")], incomplete="max_output_tokens"),
        Reply([Text("three")]),
    )
    first = await answer(provider, req(UserMessage.text("1")))
    second = await answer(provider, req(UserMessage.text("1"), first, UserMessage.text("2")))
    assert second.stop_reason == "max_tokens"
    assert second.content == (ThinkingBlock(thinking="Still thinking..."),)
    history = (UserMessage.text("1"), first, UserMessage.text("2"), second, UserMessage.text("3"))
    await answer(provider, req(*history))
    assert [i["type"] for i in sent(responses_fake)["input"]] == ["message"] * 4
    assert responses_fake.rejections == []


async def test_images_from_users_and_tools(
    provider: OpenAIResponsesProvider, responses_fake: ResponsesFake
) -> None:
    responses_fake.add(Reply([Text("a cat")]))
    call = AssistantMessage(
        content=(ToolCallBlock(id="call_1", name="lookup", arguments="{}"),), provider="anthropic"
    )
    image = ImageBlock(source=Base64Source(media_type="image/png", data=PNG))
    await answer(
        provider,
        req(
            UserMessage(
                content=(
                    TextBlock(text="look"),
                    image,
                    ImageBlock(source=UrlSource(url="https://example.com/a.png")),
                )
            ),
            call,
            ToolResultMessage(
                tool_call_id="call_1",
                tool_name="lookup",
                content=(TextBlock(text="here"), image),
                is_error=True,
            ),
            tools=TOOLS,
        ),
    )
    items = sent(responses_fake)["input"]
    assert items[0]["content"] == [
        {"type": "input_text", "text": "look"},
        {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}", "detail": "auto"},
        {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "auto"},
    ]
    assert items[2] == {
        "type": "function_call_output",
        "call_id": "call_1",
        "output": [
            {"type": "input_text", "text": "here"},
            {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}", "detail": "auto"},
        ],
    }


def test_build_input_is_the_input_as_sent() -> None:
    message = AssistantMessage(
        content=(
            ThinkingBlock(thinking="x"),
            TextBlock(text="a"),
            TextBlock(text=""),
            TextBlock(text="b"),
        )
    )
    assert build_input([message]) == [
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "a"}, {"type": "output_text", "text": "b"}],
        }
    ]


# --- the fake is as strict as the API ------------------------------------------------------------


def _post(fake: ResponsesFake, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    import httpx

    answer = httpx.post(
        f"{fake.base_url}/responses",
        json=body,
        headers={"authorization": f"Bearer {fake.api_key}"},
        timeout=10,
    )
    return answer.status_code, answer.json()


def _user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"store": True}, "'store': false"),
        ({"store": None}, "'store': false"),
        ({"previous_response_id": "resp_1"}, "Unknown parameter: 'previous_response_id'"),
        ({"temprature": 1}, "Unknown parameter: 'temprature'"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
            "flat",
        ),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {}, "x": 1}}}, "x"),
        ({"input": [{**_user("hi"), "name": "me"}]}, "Unknown parameter: 'input[0].name'"),
        (
            {
                "input": [
                    _user("hi"),
                    {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                ]
            },
            "No tool output found for function call c",
        ),
        (
            {
                "input": [
                    _user("hi"),
                    {"type": "function_call_output", "call_id": "c", "output": "x"},
                ]
            },
            "No tool call found for function call output with call_id c",
        ),
    ],
)
def test_the_fake_refuses_what_the_api_refuses(
    responses_fake: ResponsesFake, change: dict[str, Any], says: str
) -> None:
    responses_fake.add(Reply([Text("never sent")]))
    body = {"model": "m", "store": False, "input": [_user("hi")], **change}
    status, answer = _post(responses_fake, body)
    assert status == 400, answer
    assert says in answer["error"]["message"]
    assert answer["error"]["type"] == "invalid_request_error"
    assert len(responses_fake.answers) == 1  # a refused request takes no answer


def test_the_fake_wants_reasoning_encrypted_and_followed(responses_fake: ResponsesFake) -> None:
    responses_fake.add(Reply([Reasoning("Plan."), Text("hi")], id="resp_1"), Reply([Text("ok")]))
    include = ["reasoning.encrypted_content"]
    status, first = _post(
        responses_fake, {"model": "m", "store": False, "include": include, "input": [_user("hi")]}
    )
    assert status == 200
    reasoning, said = first["output"]
    replay = [_user("hi"), reasoning, said, _user("more")]
    status, answer = _post(responses_fake, {"model": "m", "store": False, "input": replay})
    assert status == 400 and "include" in answer["error"]["message"]
    without = {k: v for k, v in reasoning.items() if k != "encrypted_content"}
    status, answer = _post(
        responses_fake,
        {"model": "m", "store": False, "include": include, "input": [_user("hi"), without, said]},
    )
    assert status == 400 and "Items are not persisted" in answer["error"]["message"]
    status, answer = _post(
        responses_fake,
        {
            "model": "m",
            "store": False,
            "include": include,
            "input": [_user("hi"), reasoning, _user("x")],
        },
    )
    assert status == 400 and "without its required following item" in answer["error"]["message"]
    status, _ = _post(
        responses_fake, {"model": "m", "store": False, "include": include, "input": replay}
    )
    assert status == 200
