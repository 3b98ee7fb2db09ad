"""The official ``openai`` package, unmodified, drives ``/v1`` of a live server (echo provider):
conversations carried over responses, items in order with stable ids, the streaming helper to
its final response, a function tool round trip, ``store: false``, errors in OpenAI's shape with
the SDK's exception classes, tenancy — and every conversation written stays replayable."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import openai
import pytest

from app.agent.codec import load_context
from app.agent.replay import validate_context

from .conftest import KEYS, Server

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


@pytest.fixture(autouse=True)
def every_conversation_stays_replayable(server: Server) -> Iterator[None]:
    """After each test, every conversation the tests wrote through ``/v1`` so far, for every
    tenant, read natively, is a context the replay rules accept."""
    yield
    for tenant in KEYS:
        with server.native(tenant) as native:
            listed = native.get("/conversations", params={"limit": 200}).json()["items"]
            for conversation in listed:
                body = native.get(f"/conversations/{conversation['id']}/context").json()
                validate_context(load_context(body), allow_open_batch=True)


def test_the_replay_check_reads_what_v1_wrote(server: Server) -> None:
    """The check above is not empty: a conversation written through /v1 is listed natively."""
    conversation = server.client().conversations.create(items=[{"role": "user", "content": "hi"}])
    with server.native() as native:
        listed = native.get("/conversations", params={"limit": 200}).json()["items"]
        assert conversation.id in [c["id"] for c in listed]
        assert len(native.get(f"/conversations/{conversation.id}/context").json()["messages"]) == 1


def test_models_are_the_agent_profiles(server: Server) -> None:
    models = server.client().models.list()
    assert [m.id for m in models.data] == ["default"]


def test_a_conversation_is_carried_over_two_responses(server: Server) -> None:
    client = server.client()
    conversation = client.conversations.create(metadata={"topic": "editors"})
    first = client.responses.create(
        model="default", input="What is nvim?", conversation=conversation.id
    )
    assert first.status == "completed"
    assert first.output_text == 'Echo: I saw 1 message. You said: "What is nvim?"'
    second = client.responses.create(
        model="default",
        input="And vim?",
        conversation={"id": conversation.id},
        metadata={"turn": "2"},
        instructions="Be brief.",
    )
    assert second.output_text == 'Echo: I saw 3 messages. You said: "And vim?"'
    assert second.usage is not None and second.usage.total_tokens > 0

    # one conversation, seen through both surfaces: the responses are its native runs
    with server.native() as native:
        runs = native.get(f"/conversations/{conversation.id}/runs").json()["items"]
        assert ["resp_" + r["run_id"] for r in runs] == [first.id, second.id]
        context = native.get(f"/conversations/{conversation.id}/context").json()
        assert len(context["messages"]) == 4
        assert native.get(f"/conversations/{conversation.id}").json()["metadata"] == {
            "topic": "editors"
        }
    assert client.responses.retrieve(first.id).output_text == first.output_text
    # what the request said is kept with its run
    again = client.responses.retrieve(second.id)
    assert (again.metadata, again.instructions) == ({"turn": "2"}, "Be brief.")


def test_previous_response_id_chains_form_a_tree(server: Server) -> None:
    client = server.client()
    first = client.responses.create(model="default", input="one", instructions="Be brief.")
    second = client.responses.create(model="default", input="two", previous_response_id=first.id)
    assert second.output_text == 'Echo: I saw 3 messages. You said: "two"'
    trunk = _conversation_of(server, first.id)
    assert _conversation_of(server, second.id) == trunk  # at the head: continued

    # an older response forks: a new conversation from the context right after it
    branch = client.responses.create(model="default", input="2b", previous_response_id=first.id)
    assert branch.output_text == 'Echo: I saw 3 messages. You said: "2b"'
    forked = _conversation_of(server, branch.id)
    assert forked != trunk
    # each branch goes on without touching the other
    on_trunk = client.responses.create(
        model="default", input="three", previous_response_id=second.id
    )
    on_branch = client.responses.create(model="default", input="3b", previous_response_id=branch.id)
    assert on_trunk.output_text == 'Echo: I saw 5 messages. You said: "three"'
    assert on_branch.output_text == 'Echo: I saw 5 messages. You said: "3b"'
    # store: false continues from any response and stores nothing
    unstored = client.responses.create(
        model="default", input="aside", previous_response_id=first.id, store=False
    )
    assert unstored.output_text == 'Echo: I saw 3 messages. You said: "aside"'
    with server.native() as native:
        texts = {
            conversation: [
                m["content"][0]["text"]
                for m in native.get(f"/conversations/{conversation}/context").json()["messages"]
                if m["type"] == "user"
            ]
            for conversation in (trunk, forked)
        }
        assert texts == {trunk: ["one", "two", "three"], forked: ["one", "2b", "3b"]}
        # instructions were for their response only: the stored system prompt is unchanged
        assert native.get(f"/conversations/{trunk}").json()["system_prompt"] == ""
    with pytest.raises(openai.BadRequestError) as unknown:
        client.responses.create(model="default", input="x", previous_response_id="resp_nope")
    assert unknown.value.body["param"] == "previous_response_id"  # type: ignore[index]


def _conversation_of(server: Server, response_id: str) -> str:
    found = server.client().responses.retrieve(response_id)
    assert found.conversation is not None
    return found.conversation.id


def test_items_are_listed_in_order_with_ids_stable_across_reads(server: Server) -> None:
    client = server.client()
    conversation = client.conversations.create(
        items=[{"type": "message", "role": "user", "content": "Hello"}]
    )
    client.responses.create(model="default", input="What is nvim?", conversation=conversation.id)
    added = client.conversations.items.create(
        conversation.id,
        items=[
            {"type": "message", "role": "user", "content": "noted"},
            {"type": "message", "role": "assistant", "content": "ok"},
        ],
    )
    assert [i.type for i in added.data] == ["message", "message"]

    ascending = client.conversations.items.list(conversation.id, order="asc")
    texts = [(i.role, i.content[0].text) for i in ascending.data]  # type: ignore[union-attr]
    assert texts == [
        ("user", "Hello"),
        ("user", "What is nvim?"),
        ("assistant", 'Echo: I saw 2 messages. You said: "What is nvim?"'),
        ("user", "noted"),
        ("assistant", "ok"),
    ]
    ids = [i.id for i in ascending.data]
    assert [i.id for i in client.conversations.items.list(conversation.id).data] == ids[::-1]
    assert ascending.data[-1].id == added.data[-1].id

    # paging one at a time walks the same ids (the SDK follows `after` and `has_more`)
    paged = [i.id for i in client.conversations.items.list(conversation.id, limit=1, order="asc")]
    assert paged == ids
    one = client.conversations.items.retrieve(ids[2], conversation_id=conversation.id)
    assert one.id == ids[2]

    # compaction folds messages into the summary; it never removes an item
    with server.native() as native:
        native.post(f"/conversations/{conversation.id}/compact").raise_for_status()
        assert native.get(f"/conversations/{conversation.id}/context").json()["summary"]
    again = client.conversations.items.list(conversation.id, order="asc")
    assert [i.id for i in again.data] == ids

    # an item that would break the pairing of a call and its output is refused
    with pytest.raises(openai.BadRequestError):
        client.conversations.items.create(
            conversation.id,
            items=[{"type": "function_call_output", "call_id": "nope", "output": "x"}],
        )


def test_the_streaming_helper_reaches_the_final_response(server: Server) -> None:
    client = server.client()
    conversation = client.conversations.create()
    with client.responses.stream(
        model="default", input="stream me", conversation=conversation.id
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created"
    assert events[-1].type == "response.completed"
    assert final.output_text == 'Echo: I saw 1 message. You said: "stream me"'
    stored = client.responses.retrieve(final.id)
    assert [i.id for i in stored.output] == [i.id for i in final.output]
    items = client.conversations.items.list(conversation.id)
    assert items.data[0].id == final.output[0].id


def test_a_function_tool_round_trip(server: Server) -> None:
    client = server.client()
    conversation = client.conversations.create()
    asked = client.responses.create(
        model="default",
        input='/tool get_weather {"city": "Paris"}',
        conversation=conversation.id,
        tools=[WEATHER],  # type: ignore[list-item]
    )
    [call] = asked.output
    assert call.type == "function_call"
    assert call.name == "get_weather"
    assert call.arguments == '{"city": "Paris"}'  # the raw string, as the model wrote it

    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="default", input="hello?", conversation=conversation.id)
    assert call.call_id in refused.value.body["message"]  # type: ignore[index]

    answered = client.responses.create(
        model="default",
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        conversation=conversation.id,
        tools=[WEATHER],  # type: ignore[list-item]
    )
    assert "sunny" in answered.output_text
    inputs = client.responses.input_items.list(answered.id)
    assert [i.type for i in inputs.data] == ["function_call_output"]

    # streamed, the call comes as function_call events the SDK's helper accepts
    with client.responses.stream(
        model="default",
        input='/tool get_weather {"city": "Lyon"}',
        conversation=conversation.id,
        tools=[WEATHER],  # type: ignore[list-item]
    ) as stream:
        kinds = [e.type for e in stream]
        [streamed] = stream.get_final_response().output
    assert "response.function_call_arguments.done" in kinds
    assert streamed.type == "function_call"
    assert streamed.arguments == '{"city": "Lyon"}'


def test_store_false_stores_nothing(server: Server) -> None:
    client = server.client()
    with server.native() as native:
        before = native.get("/conversations").json()["items"]
        history = [
            {"type": "message", "role": "user", "content": "Hi"},
            {"type": "message", "role": "assistant", "content": "Hello!"},
            {"type": "message", "role": "user", "content": "Again"},
        ]
        answer = client.responses.create(model="default", input=history, store=False)
        assert answer.output_text == 'Echo: I saw 3 messages. You said: "Again"'
        with client.responses.stream(model="default", input="streamed", store=False) as stream:
            streamed = stream.get_final_response()
        assert streamed.output_text == 'Echo: I saw 1 message. You said: "streamed"'
        for unstored in (answer, streamed):
            with pytest.raises(openai.NotFoundError):
                client.responses.retrieve(unstored.id)
        assert native.get("/conversations").json()["items"] == before


def test_errors_have_openai_shape_and_the_sdk_classes(server: Server) -> None:
    client = server.client()
    with pytest.raises(openai.BadRequestError) as unknown_model:
        client.responses.create(model="gpt-nope", input="hi")
    assert unknown_model.value.body == {  # the inner error object
        "message": "The model 'gpt-nope' does not exist",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }
    with pytest.raises(openai.BadRequestError) as unknown_field:
        client.responses.create(model="default", input="hi", extra_body={"bogus": 1})
    assert unknown_field.value.body["param"] == "bogus"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve("conv_missing")
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_missing")
    with pytest.raises(openai.AuthenticationError) as unauthorized:
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0).models.list()
    assert set(unauthorized.value.body) == {"message", "type", "param", "code"}  # type: ignore[arg-type]


def test_a_busy_conversation_is_a_409_conversation_locked(server: Server) -> None:
    client = server.client()
    conversation = client.conversations.create(
        items=[{"type": "message", "role": "user", "content": "kept"}]
    )
    [kept] = client.conversations.items.list(conversation.id).data
    stream = client.responses.create(
        model="default", input="/sleep 30", conversation=conversation.id, stream=True
    )
    created = next(iter(stream))  # the run holds the conversation from here on
    assert created.type == "response.created"
    try:
        with pytest.raises(openai.ConflictError) as locked:
            client.responses.create(model="default", input="hi", conversation=conversation.id)
        assert locked.value.body["code"] == "conversation_locked"  # type: ignore[index]
        with pytest.raises(openai.ConflictError):
            client.conversations.items.create(
                conversation.id, items=[{"type": "message", "role": "user", "content": "x"}]
            )
        with pytest.raises(openai.ConflictError) as deleting:
            client.conversations.items.delete(kept.id, conversation_id=conversation.id)
        assert deleting.value.body["code"] == "conversation_locked"  # type: ignore[index]
    finally:
        cancelled = client.responses.cancel(created.response.id)
        assert cancelled.id == created.response.id
        drain = threading.Thread(target=lambda: list(stream))
        drain.start()
        drain.join(timeout=60)
        stream.close()


def test_another_tenants_objects_are_404(server: Server) -> None:
    alpha, beta = server.client("alpha"), server.client("beta")
    response = alpha.responses.create(model="default", input="mine")
    assert response.conversation is not None
    with pytest.raises(openai.NotFoundError):
        beta.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError):
        beta.conversations.retrieve(response.conversation.id)
    with pytest.raises(openai.NotFoundError):
        beta.conversations.items.list(response.conversation.id)


def test_metadata_is_replaced_and_a_conversation_deleted(server: Server) -> None:
    client = server.client()
    conversation = client.conversations.create(metadata={"a": "1", "b": "2"})
    updated = client.conversations.update(conversation.id, metadata={"b": "3"})
    assert updated.metadata == {"b": "3"}
    deleted = client.conversations.delete(conversation.id)
    assert deleted.deleted is True
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(conversation.id)


def test_a_background_response_and_its_resumed_stream(server: Server) -> None:
    client = server.client()
    conversation = client.conversations.create()
    started = client.responses.create(
        model="default", input="in the background", conversation=conversation.id, background=True
    )
    assert started.status in ("queued", "in_progress")
    assert started.background is True
    # its events, from storage, to the end (no polling): then it has completed
    events = list(client.responses.retrieve(started.id, stream=True))
    assert events[0].type == "response.created"
    assert events[-1].type == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done = client.responses.retrieve(started.id)
    assert (done.status, done.background) == ("completed", True)
    assert done.output_text == 'Echo: I saw 1 message. You said: "in the background"'

    # resumed after event 3: the same events, numbered as before
    resumed = list(client.responses.retrieve(started.id, stream=True, starting_after=3))
    assert [(e.type, e.sequence_number) for e in resumed] == [
        (e.type, e.sequence_number) for e in events[4:]
    ]
    # the SDK's helper asks for the whole stream and drops what it saw itself
    with client.responses.stream(response_id=started.id, starting_after=3) as stream:
        assert stream.get_final_response().output_text == done.output_text


def test_a_background_stream_is_read_to_its_final_response(server: Server) -> None:
    client = server.client()
    with client.responses.stream(model="default", input="both", background=True) as stream:
        final = stream.get_final_response()
    assert final.output_text == 'Echo: I saw 1 message. You said: "both"'
    assert client.responses.retrieve(final.id).status == "completed"


def test_a_session_keeps_its_history_as_items_and_runs_statelessly(server: Server) -> None:
    """What OpenAI's Agents SDK session (``OpenAIConversationsSession``) sends: an empty
    conversation, the history read in order, the user's input added as an item, a stateless
    response on the history (user items with their ``id`` and ``status``, assistant items
    without an id), its output added as items — a tool turn included."""
    client = server.client()
    session = client.conversations.create(items=[])

    def turn(user_input: list[dict[str, object]]) -> openai.types.responses.Response:
        client.conversations.items.create(session.id, items=user_input)  # type: ignore[arg-type]
        history = [
            item.model_dump(exclude_none=True)
            for item in client.conversations.items.list(session.id, order="asc")
        ]
        for item in history:
            if item.get("role") == "assistant":
                del item["id"]
        answer = client.responses.create(
            model="default",
            input=history,  # type: ignore[arg-type]
            tools=[WEATHER],  # type: ignore[list-item]
            include=[],
            store=False,
        )
        output = [item.model_dump(exclude_none=True) for item in answer.output]
        client.conversations.items.create(session.id, items=output)  # type: ignore[arg-type]
        return answer

    first = turn([{"type": "message", "role": "user", "content": "Hi"}])
    assert first.output_text == 'Echo: I saw 1 message. You said: "Hi"'
    asked = turn(
        [{"type": "message", "role": "user", "content": '/tool get_weather {"city": "Oslo"}'}]
    )
    [call] = asked.output
    assert call.type == "function_call"
    answered = turn([{"type": "function_call_output", "call_id": call.call_id, "output": "cold"}])
    assert "cold" in answered.output_text
    kinds = [i.type for i in client.conversations.items.list(session.id, order="asc")]
    assert kinds == [
        "message",
        "message",
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]
