"""Items ↔ messages (app/api/v1/items.py): every message the codec carries comes back from its
items with the same content — text, images (bytes and URLs), thinking text and signatures
(empty ones too), redacted thinking, tool call ids, names and raw arguments, tool results."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from app.agent.messages import (
    AnyMessage,
    AssistantMessage,
    ImageBlock,
    TextBlock,
    ToolCallBlock,
    ToolResultMessage,
    UrlSource,
    UserMessage,
)
from app.api.v1.errors import OpenAIError
from app.api.v1.items import ItemKey, item_id, items_of, messages_of, parse_item_id
from app.api.v1.mcp_items import ItemView

from ..agent.strategies import assistant_messages, tool_result_messages, user_messages

RUN = "0f8fad5b-d9cb-469f-a165-70867728950e"


def _data_url(block: object) -> bool:
    return (
        isinstance(block, ImageBlock)
        and isinstance(block.source, UrlSource)
        and block.source.url.startswith("data:")
    )


def _content_only(message: AnyMessage) -> AnyMessage:
    """What an item carries of a message: an assistant's blocks (its provider metadata stays on
    the stored message), a result without ``is_error``."""
    if isinstance(message, AssistantMessage):
        return AssistantMessage(content=message.content)
    if isinstance(message, ToolResultMessage):
        return message.model_copy(update={"is_error": False})
    return message


@settings(max_examples=150, deadline=None)
@given(
    st.one_of(user_messages(), assistant_messages(replayable=True), tool_result_messages()),
    st.integers(min_value=0, max_value=500),
)
def test_a_message_comes_back_from_its_items(message: AnyMessage, index: int) -> None:
    # a URL image whose URL is itself a data: URL comes back as the bytes it holds (OpenAI's
    # input_image has one field for both): the one case where the source's form changes
    assume(not any(_data_url(b) for b in message.content))
    # a call a server executes is one mcp_call item with its result: its own test, below
    assume(not any(isinstance(b, ToolCallBlock) and b.server_label for b in message.content))
    items = items_of(message, RUN, index)
    assert items, "every message is at least one item"
    names = (
        {message.tool_call_id: message.tool_name} if isinstance(message, ToolResultMessage) else {}
    )
    back = messages_of(items, names.get)
    assert back.messages == [_content_only(message)]
    for k, item in enumerate(items):  # ids name the message's run, place and the item's place
        assert parse_item_id(item["id"]) == ItemKey(RUN, index, k)


def test_item_ids_are_the_same_on_every_read() -> None:
    message = UserMessage.text("hello")
    assert items_of(message, RUN, 3) == items_of(message, RUN, 3)
    assert item_id("msg", RUN, 3, 0) == "msg_0f8fad5bd9cb469fa16570867728950e_3_0"
    assert parse_item_id("msg_nothing") is None


def test_system_and_developer_messages_are_instructions() -> None:
    parsed = messages_of(
        [
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        ],
        {}.get,
    )
    assert parsed.system == ["be brief"]
    assert parsed.messages == [UserMessage.text("hi")]


@pytest.mark.parametrize(
    ("item", "param"),
    [
        ({"type": "web_search_call"}, "input[0].type"),
        ({"type": "message", "role": "tool", "content": "x"}, "input[0].role"),
        ({"type": "function_call_output", "call_id": "nope", "output": "x"}, "input[0].call_id"),
        (
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": {}},
            "input[0].arguments",
        ),
    ],
)
def test_an_item_that_cannot_be_a_message_is_a_400_naming_it(item: dict, param: str) -> None:
    with pytest.raises(OpenAIError) as refused:
        messages_of([item], {}.get)
    assert refused.value.status == 400
    assert refused.value.param == param


def _server_turn(is_error: bool = False) -> tuple[AssistantMessage, ToolResultMessage]:
    call = ToolCallBlock(id="call_1", name="lookup", arguments='{"w": 1}', server_label="dict")
    asked = AssistantMessage(content=(TextBlock(text="checking"), call))
    result = ToolResultMessage(
        tool_call_id="call_1",
        tool_name="lookup",
        content=(TextBlock(text="boom" if is_error else "found"),),
        is_error=is_error,
    )
    return asked, result


@pytest.mark.parametrize("is_error", [False, True])
def test_a_server_call_is_one_mcp_call_item_with_its_result(is_error: bool) -> None:
    asked, result = _server_turn(is_error)
    view = ItemView.of([asked, result])
    items = items_of(asked, RUN, 4, view) + items_of(result, RUN, 5, view)
    assert [i["type"] for i in items] == ["message", "mcp_call"]
    call = items[1]
    assert call["id"] == item_id("mcp", RUN, 4, 1)
    assert (call["server_label"], call["name"], call["arguments"]) == ("dict", "lookup", '{"w": 1}')
    if is_error:
        assert call["status"] == "failed" and call["output"] is None
        assert call["error"]["content"] == [{"type": "text", "text": "boom"}]
    else:
        assert call["status"] == "completed" and call["output"] == "found"
    # sent back (a client that keeps its own history): the call and its result again
    back = messages_of(items, {}.get).messages
    assert len(back) == 2
    assert isinstance(back[0], AssistantMessage) and isinstance(back[1], ToolResultMessage)
    [again] = back[0].tool_calls
    assert (again.name, again.arguments, again.server_label) == ("lookup", '{"w": 1}', "dict")
    assert back[1].tool_call_id == again.id and back[1].is_error is is_error


def test_a_server_call_awaiting_approval_is_an_approval_request() -> None:
    asked, _ = _server_turn()
    items = items_of(asked, RUN, 2, ItemView(pending=frozenset({"call_1"})))
    request = items[1]
    assert request == {
        "type": "mcp_approval_request",
        "id": item_id("mcpr", RUN, 2, 1),
        "server_label": "dict",
        "name": "lookup",
        "arguments": '{"w": 1}',
    }
    parsed = messages_of(
        [
            request,
            {
                "type": "mcp_approval_response",
                "approval_request_id": request["id"],
                "approve": True,
            },
        ],
        {}.get,
    )
    [message] = parsed.messages
    assert isinstance(message, AssistantMessage) and message.tool_calls[0].id == request["id"]
    [decision] = parsed.approvals
    assert (decision.approval_request_id, decision.approve) == (request["id"], True)
