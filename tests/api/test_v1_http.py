"""``/v1`` over HTTP on both database engines (the official SDK drives it in tests/v1): items
paged through a fork, what the native middleware refuses answered in OpenAI's shape, a
conversation's responses read as runs and its runs as responses."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from .conftest import AppClient, SettingsFactory, apps


def assert_error(response: httpx.Response, status: int, param: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json", response.text
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["message"], body
    if param is not None:
        assert body["error"]["param"] == param, body
    error: dict[str, Any] = body["error"]
    return error


async def respond(client: AppClient, **body: Any) -> dict[str, Any]:
    answer = await client.post("/v1/responses", json={"model": "default", **body})
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()
    return found


async def test_items_of_a_tree_of_responses(client: AppClient) -> None:
    first = await respond(client, input="one")
    conversation = first["conversation"]["id"]
    second = await respond(client, input="two", previous_response_id=first["id"])
    branch = await respond(client, input="2b", previous_response_id=first["id"])
    assert second["conversation"]["id"] == conversation
    assert branch["conversation"]["id"] != conversation

    ascending = await client.get(f"/v1/conversations/{conversation}/items?order=asc")
    items = ascending.json()["data"]
    assert [i["role"] for i in items] == ["user", "assistant", "user", "assistant"]
    assert items[2]["content"] == [{"type": "input_text", "text": "two"}]
    assert ascending.json()["first_id"] == items[0]["id"]
    assert ascending.json()["has_more"] is False
    # a page of two after the first item, newest first from the end
    page = await client.get(
        f"/v1/conversations/{conversation}/items",
        params={"order": "asc", "limit": 2, "after": items[0]["id"]},
    )
    assert [i["id"] for i in page.json()["data"]] == [items[1]["id"], items[2]["id"]]
    assert page.json()["has_more"] is True
    newest = await client.get(f"/v1/conversations/{conversation}/items", params={"limit": 1})
    assert [i["id"] for i in newest.json()["data"]] == [items[-1]["id"]]
    # the response's output is the conversation's item, by the same id
    assert second["output"][0]["id"] == items[3]["id"]
    one = await client.get(f"/v1/conversations/{conversation}/items/{items[3]['id']}")
    assert one.json() == items[3]

    # input may name a stored item by reference
    referenced = await respond(
        client,
        input=[{"type": "item_reference", "id": items[0]["id"]}],
        conversation=conversation,
    )
    assert referenced["output"][0]["content"][0]["text"].endswith('You said: "one"')
    missing = await client.post(
        "/v1/responses",
        json={
            "model": "default",
            "input": [{"type": "item_reference", "id": "msg_nope"}],
            "conversation": conversation,
        },
    )
    assert_error(missing, 400, "input[0].id")

    # every run is a response, and every response a run
    runs = (await client.get(f"/conversations/{conversation}/runs")).json()["items"]
    assert ["resp_" + r["run_id"] for r in runs] == [first["id"], second["id"], referenced["id"]]
    native = await client.post(f"/conversations/{conversation}/runs", json={"prompts": ["n"]})
    as_response = await client.get(f"/v1/responses/resp_{native.json()['run_id']}")
    assert as_response.json()["output"][0]["content"][0]["text"].endswith('You said: "n"')


async def test_refusals_of_the_native_middleware_have_openai_shape(
    make_settings: SettingsFactory,
) -> None:
    async with apps(make_settings)(
        max_body_bytes=2048, max_image_bytes=1024, api_keys="t:secret-key"
    ) as client:
        missing = await client.get("/v1/models")
        assert assert_error(missing, 401)["code"] == "invalid_api_key"
        client.headers["Authorization"] = "Bearer secret-key"
        too_large = await client.post(
            "/v1/responses", json={"model": "default", "input": "x" * 4096}
        )
        assert_error(too_large, 400)
        malformed = await client.post(
            "/v1/responses", content=b"{", headers={"content-type": "application/json"}
        )
        assert_error(malformed, 400)
        assert_error(await client.get("/v1/nothing"), 404)
        assert_error(await client.get("/v1/responses/resp_none/input_items"), 404)
        # the native API keeps its problems
        native = await client.get("/conversations/none")
        assert native.headers["content-type"] == "application/problem+json"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "x", "temperature": "hot"}, "temperature"),
        ({"input": [{"type": "nonsense"}]}, "input[0].type"),
        ({"input": "x", "conversation": "c", "previous_response_id": "resp_x"}, None),
        ({"input": "x", "conversation": "c", "store": False}, "store"),
    ],
)
async def test_a_bad_request_is_a_400_naming_the_parameter(
    client: AppClient, body: dict[str, Any], param: str | None
) -> None:
    answer = await client.post("/v1/responses", json={"model": "default", **body})
    error = assert_error(answer, 400, param)
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "metadata",
    [
        {"k": "a\u0000b"},
        {"a\u0000b": "v"},
        {"k": "v" * 513},  # max_metadata_value_chars
        {f"k{i}": "v" for i in range(65)},  # max_metadata_keys
    ],
)
async def test_metadata_with_a_nul_or_past_the_limits_is_a_400_and_writes_nothing(
    client: AppClient, metadata: dict[str, str]
) -> None:
    refused = await client.post("/v1/conversations", json={"metadata": metadata})
    assert_error(refused, 400)
    for store in (True, False):
        answer = await client.post(
            "/v1/responses",
            json={"model": "default", "input": "hi", "metadata": metadata, "store": store},
        )
        assert_error(answer, 400)
    assert (await client.get("/conversations")).json()["items"] == []
    created = (await client.post("/v1/conversations", json={"metadata": {"k": "v"}})).json()
    replaced = await client.post(f"/v1/conversations/{created['id']}", json={"metadata": metadata})
    assert_error(replaced, 400)
    kept = await client.get(f"/v1/conversations/{created['id']}")
    assert kept.json()["metadata"] == {"k": "v"}


async def test_a_system_text_with_a_nul_or_over_the_limit_is_a_400_and_writes_nothing(
    make_settings: SettingsFactory,
) -> None:
    """A system or developer item and ``instructions`` become a system prompt, which never
    holds NUL (PostgreSQL's text column cannot) nor more than ``max_text_chars``, as natively."""
    async with apps(make_settings)(max_text_chars=100) as client:
        system = {"role": "system", "content": "be\u0000brief"}
        refused = await client.post("/v1/conversations", json={"items": [system]})
        assert_error(refused, 400, "items[0].content")
        long = {"role": "developer", "content": [{"type": "input_text", "text": "x" * 101}]}
        assert_error(await client.post("/v1/conversations", json={"items": [long]}), 400)
        for body in (
            {"input": [system, {"role": "user", "content": "hi"}]},
            {"input": "hi", "instructions": "be\u0000brief"},
            {"input": "hi", "instructions": "x" * 101},
        ):
            answer = await client.post("/v1/responses", json={"model": "default", **body})
            assert_error(answer, 400)
        assert (await client.get("/conversations")).json()["items"] == []
        fine = {"role": "system", "content": "x" * 100}
        created = await client.post("/v1/conversations", json={"items": [fine]})
        assert created.status_code == 200, created.text
        context = await client.get(f"/conversations/{created.json()['id']}/context")
        assert context.json()["system_prompt"] == "x" * 100


async def test_items_over_the_limits_are_a_400_and_nothing_is_added_or_created(
    make_settings: SettingsFactory,
) -> None:
    """/v1 items are stored as they are: a text block over ``max_text_chars`` is refused before
    anything is written, on each way in, as natively."""
    async with apps(make_settings)(max_text_chars=100) as client:
        long = {"role": "user", "content": "x" * 101}
        refused = await client.post("/v1/conversations", json={"items": [long]})
        assert_error(refused, 400)
        stateless = await client.post(
            "/v1/responses",
            json={"model": "default", "input": [long, {"role": "user", "content": "hi"}]},
        )
        assert_error(stateless, 400)
        assert (await client.get("/conversations")).json()["items"] == []
        made = (await client.post("/v1/conversations", json={})).json()["id"]
        added = await client.post(f"/v1/conversations/{made}/items", json={"items": [long]})
        assert_error(added, 400)
        response = await client.post(
            "/v1/responses", json={"model": "default", "conversation": made, "input": [long]}
        )
        assert_error(response, 400)
        assert (await client.get(f"/conversations/{made}/context")).json()["messages"] == []
        assert (await client.get(f"/conversations/{made}/runs")).json()["items"] == []


async def test_items_a_run_could_not_store_are_an_error_not_a_list_of_added_items(
    make_settings: SettingsFactory,
) -> None:
    """Past the checks made before anything is written, the run that appends the items may
    still store nothing (here: the context would pass max_context_messages). The answer says
    so; it never lists items as added that were not, and a conversation made for them is not
    kept."""
    async with apps(make_settings)(max_context_messages=2) as client:
        three = [{"role": "user", "content": f"m{i}"} for i in range(3)]
        refused = await client.post("/v1/conversations", json={"items": three})
        error = assert_error(refused, 400, "items")
        assert error["code"] == "run_context_too_large", error
        assert (await client.get("/conversations")).json()["items"] == []
        made = (await client.post("/v1/conversations", json={})).json()["id"]
        added = await client.post(f"/v1/conversations/{made}/items", json={"items": three})
        assert assert_error(added, 400, "items")["code"] == "run_context_too_large"
        assert (await client.get(f"/conversations/{made}/context")).json()["messages"] == []
        said = {"role": "assistant", "content": "ok"}
        history = [three[0], said, three[1], said]  # stored first, then the response runs
        stateless = await client.post(
            "/v1/responses", json={"model": "default", "input": [*history, three[2]]}
        )
        assert assert_error(stateless, 400, "input")["code"] == "run_context_too_large"
        assert [c["id"] for c in (await client.get("/conversations")).json()["items"]] == [made]


@pytest.mark.parametrize("bad", ["a%00b", "a%20b", "x" * 129])
async def test_an_id_no_conversation_or_response_can_have_is_not_found(
    client: AppClient, bad: str
) -> None:
    """Ids are looked up only when they fit the native grammar: on PostgreSQL a NUL cannot even
    be sent as a parameter (it was a 500)."""
    for method, url, body in [
        ("GET", f"/v1/conversations/{bad}", None),
        ("POST", f"/v1/conversations/{bad}", {"metadata": {}}),
        ("DELETE", f"/v1/conversations/{bad}", None),
        ("GET", f"/v1/conversations/{bad}/items", None),
        ("POST", f"/v1/conversations/{bad}/items", {"items": []}),
        ("GET", f"/v1/conversations/{bad}/items/msg_x", None),
        ("GET", f"/v1/responses/resp_{bad}", None),
        ("DELETE", f"/v1/responses/resp_{bad}", None),
        ("POST", f"/v1/responses/resp_{bad}/cancel", None),
        ("GET", f"/v1/responses/resp_{bad}/input_items", None),
    ]:
        assert_error(await client.request(method, url, json=body), 404)
    raw = bad.replace("%00", "\u0000").replace("%20", " ")
    for field, value, status in [
        ("conversation", raw, 404),
        ("conversation", {"id": raw}, 404),
        ("previous_response_id", f"resp_{raw}", 400),
    ]:
        answer = await client.post(
            "/v1/responses", json={"model": "default", "input": "hi", field: value}
        )
        assert_error(answer, status)
    assert (await client.get("/conversations")).json()["items"] == []


async def test_a_failed_response_read_back_keeps_its_error_message(
    make_settings: SettingsFactory,
) -> None:
    async with apps(make_settings)(max_context_messages=2) as client:
        three = [{"role": "user", "content": f"m{i}"} for i in range(3)]
        answer = await client.post("/v1/responses", json={"model": "default", "input": three})
        live = answer.json()
        assert live["status"] == "failed", live
        assert "max_context_messages" in live["error"]["message"], live["error"]
        # the input is what the client can change: not the service's fault
        assert live["error"]["code"] == "invalid_prompt", live["error"]
        read = (await client.get(f"/v1/responses/{live['id']}")).json()
        assert (read["status"], read["error"]) == ("failed", live["error"])


async def test_v1_requests_are_counted_under_their_own_route_templates(client: AppClient) -> None:
    await client.get("/v1/conversations/nothing-here")
    await client.get("/conversations/nothing-here")
    text = (await client.get("/metrics")).text
    assert 'route="/v1/conversations/{conversation_id}"' in text
    assert 'route="/conversations/{conversation_id}"' in text
    assert 'route="/v1/conversations/nothing-here"' not in text


async def test_unstored_responses_count_in_usage_and_are_refused_once_the_quota_is_spent(
    client: AppClient,
) -> None:
    from app.store.quotas import QuotaStore

    svc: Any = client.app.state.services
    quotas = QuotaStore(svc.engine, svc.runs.clock)
    for stream in (False, True):
        answer = await client.post(
            "/v1/responses",
            json={"model": "default", "input": "hello", "store": False, "stream": stream},
        )
        assert answer.status_code == 200, answer.text
    [today] = (await client.get("/usage")).json()["days"]
    assert today["runs"] == 2
    assert today["input_tokens"] > 0 and today["output_tokens"] > 0
    spent = today["input_tokens"] + today["output_tokens"]
    assert (await client.get("/conversations")).json()["items"] == []  # still nothing stored

    await quotas.set("default", tokens_per_day=spent)
    for stream in (False, True):
        refused = await client.post(
            "/v1/responses",
            json={"model": "default", "input": "again", "store": False, "stream": stream},
        )
        error = assert_error(refused, 429)
        assert error["code"] == "rate_limit_exceeded", error
        assert int(refused.headers["retry-after"]) >= 1
    [after] = (await client.get("/usage")).json()["days"]
    assert after["runs"] == 2  # a refused response is not counted


async def test_a_stored_response_refused_by_the_quota_leaves_no_conversation(
    client: AppClient,
) -> None:
    from app.store.quotas import QuotaStore

    svc: Any = client.app.state.services
    first = await client.post("/v1/responses", json={"model": "default", "input": "one"})
    assert first.status_code == 200, first.text
    second = await client.post(
        "/v1/responses",
        json={"model": "default", "input": "two", "previous_response_id": first.json()["id"]},
    )
    assert second.status_code == 200, second.text
    listed = (await client.get("/conversations")).json()["items"]
    assert len(listed) == 1
    await QuotaStore(svc.engine, svc.runs.clock).set("default", tokens_per_day=1)
    # a new conversation, and a fork from the first (older) response: both refused, neither kept
    for body in ({}, {"previous_response_id": first.json()["id"]}):
        refused = await client.post(
            "/v1/responses", json={"model": "default", "input": "three", **body}
        )
        assert_error(refused, 429)
        assert (await client.get("/conversations")).json()["items"] == listed
