"""``DELETE /v1/conversations/{id}/items/{item_id}`` (docs/openai.md): the context gets a new
version without the item (a call and its output go together), the item is gone from the
listing and the lookup, the transcript keeps the original entries and appends an
``item_deleted`` entry, and the version before is still readable; an item folded into the
summary is a 400 that changes nothing; an unknown one is a 404."""

from __future__ import annotations

from typing import Any

from .conftest import AppClient, SettingsFactory, start_client
from .test_v1_http import assert_error, respond

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


async def items(client: AppClient, conv: str) -> list[dict[str, Any]]:
    got = await client.get(f"/v1/conversations/{conv}/items", params={"order": "asc"})
    assert got.status_code == 200, got.text
    data: list[dict[str, Any]] = got.json()["data"]
    return data


async def context(client: AppClient, conv: str) -> dict[str, Any]:
    got = await client.get(f"/conversations/{conv}/context")
    assert got.status_code == 200, got.text
    body: dict[str, Any] = got.json()
    body["etag"] = got.headers["etag"]
    return body


async def transcript(client: AppClient, conv: str) -> list[dict[str, Any]]:
    got = await client.get(f"/conversations/{conv}/transcript", params={"limit": 200})
    assert got.status_code == 200, got.text
    entries: list[dict[str, Any]] = got.json()["items"]
    return entries


def texts(ctx: dict[str, Any]) -> list[str]:
    return [b.get("text", "") for m in ctx["messages"] for b in m["content"] if "text" in b]


async def test_deleting_a_user_message_writes_a_version_without_it(client: AppClient) -> None:
    first = await respond(client, input="one")
    conv = first["conversation"]["id"]
    await respond(client, input="two", conversation=conv)
    before = await context(client, conv)
    versions = (await client.get(f"/conversations/{conv}/versions")).json()["items"]
    version = max(int(v["version"]) for v in versions)
    entries = await transcript(client, conv)
    [two] = [
        i
        for i in await items(client, conv)
        if i.get("role") == "user" and "two" in str(i["content"])
    ]

    deleted = await client.delete(f"/v1/conversations/{conv}/items/{two['id']}")
    assert deleted.status_code == 200, deleted.text
    body = deleted.json()
    assert body["id"] == conv and body["object"] == "conversation"
    assert set(body) == {"id", "object", "created_at", "metadata"}

    assert two["id"] not in [i["id"] for i in await items(client, conv)]
    assert_error(await client.get(f"/v1/conversations/{conv}/items/{two['id']}"), 404)
    after = await context(client, conv)
    assert after["etag"] != before["etag"]
    assert "two" not in texts(after) and "two" in texts(before)
    assert len(after["messages"]) == len(before["messages"]) - 1
    # the version before is still readable, the transcript kept everything and says so
    old = await client.get(f"/conversations/{conv}/context", params={"version": version})
    assert old.status_code == 200, old.text
    assert old.json()["messages"] == before["messages"]
    now = await transcript(client, conv)
    assert now[: len(entries)] == entries
    assert [e["kind"] for e in now[len(entries) :]] == ["context_replaced", "item_deleted"]
    assert now[-1]["body"]["items"] == [two["id"]]
    # deleting it again: it is gone
    assert_error(await client.delete(f"/v1/conversations/{conv}/items/{two['id']}"), 404)
    # the conversation goes on from the new context
    await respond(client, input="three", conversation=conv)


async def test_deleting_a_function_call_deletes_its_output_and_vice_versa(
    client: AppClient,
) -> None:
    first = await respond(client, input="one")
    conv = first["conversation"]["id"]
    for city in ("Oslo", "Bergen"):
        asked = await respond(
            client,
            input=f'/tool get_weather {{"city": "{city}"}}',
            conversation=conv,
            tools=[WEATHER],
        )
        [call] = [o for o in asked["output"] if o["type"] == "function_call"]
        output = {"type": "function_call_output", "call_id": call["call_id"], "output": city}
        await respond(client, input=[output], conversation=conv, tools=[WEATHER])
    listed = await items(client, conv)
    calls = [i for i in listed if i["type"] == "function_call"]
    outputs = [i for i in listed if i["type"] == "function_call_output"]
    assert len(calls) == 2 and len(outputs) == 2
    before = await context(client, conv)

    deleted = await client.delete(f"/v1/conversations/{conv}/items/{calls[0]['id']}")
    assert deleted.status_code == 200, deleted.text
    left = [i["id"] for i in await items(client, conv)]
    assert calls[0]["id"] not in left and outputs[0]["id"] not in left
    assert calls[1]["id"] in left and outputs[1]["id"] in left
    after = await context(client, conv)
    ids = [m.get("tool_call_id") for m in after["messages"]]
    assert calls[0]["call_id"] not in ids and calls[1]["call_id"] in ids
    assert len(after["messages"]) < len(before["messages"])

    # the output this time: its call goes too
    deleted = await client.delete(f"/v1/conversations/{conv}/items/{outputs[1]['id']}")
    assert deleted.status_code == 200, deleted.text
    left = [i["id"] for i in await items(client, conv)]
    assert calls[1]["id"] not in left and outputs[1]["id"] not in left
    kinds = [m["type"] for m in (await context(client, conv))["messages"]]
    assert "tool_result" not in kinds
    await respond(client, input="go on", conversation=conv)


async def test_an_item_folded_into_the_summary_is_a_400_and_nothing_changes(
    client: AppClient,
) -> None:
    first = await respond(client, input="one")
    conv = first["conversation"]["id"]
    for word in ("two", "three", "four"):
        await respond(client, input=word, conversation=conv)
    compact = await client.post(f"/conversations/{conv}/compact")
    assert compact.status_code in (200, 201), compact.text
    before = await context(client, conv)
    assert "one" not in texts(before)  # folded
    [one] = [i for i in await items(client, conv) if i.get("content", [{}])[0].get("text") == "one"]
    entries = await transcript(client, conv)

    refused = await client.delete(f"/v1/conversations/{conv}/items/{one['id']}")
    error = assert_error(refused, 400, "item_id")
    assert one["id"] in error["message"]
    assert (await context(client, conv)) == before
    assert await transcript(client, conv) == entries
    assert one["id"] in [i["id"] for i in await items(client, conv)]


async def test_an_unknown_item_is_a_404(client: AppClient) -> None:
    first = await respond(client, input="one")
    conv = first["conversation"]["id"]
    before = await context(client, conv)
    [item] = [i for i in await items(client, conv) if i.get("role") == "user"]
    unknown = item["id"][:-1] + "7"
    assert_error(await client.delete(f"/v1/conversations/{conv}/items/{unknown}"), 404)
    assert_error(await client.delete(f"/v1/conversations/{conv}/items/nonsense"), 404)
    other = (await respond(client, input="elsewhere"))["conversation"]["id"]
    # an item of another conversation is not one of this one's
    assert_error(await client.delete(f"/v1/conversations/{other}/items/{item['id']}"), 404)
    assert (await context(client, conv)) == before


async def test_another_tenants_item_is_a_404(make_settings: SettingsFactory) -> None:
    app, client = await start_client(make_settings(api_keys="acme:key-a,umbrella:key-b"))
    a, b = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}
    async with app.router.lifespan_context(app), client:
        made = await client.post(
            "/v1/conversations", json={"items": [{"role": "user", "content": "mine"}]}, headers=a
        )
        assert made.status_code == 200, made.text
        conv = made.json()["id"]
        [item] = (await client.get(f"/v1/conversations/{conv}/items", headers=a)).json()["data"]
        path = f"/v1/conversations/{conv}/items/{item['id']}"
        assert_error(await client.delete(path, headers=b), 404)
        assert (await client.get(path, headers=a)).status_code == 200
        assert (await client.delete(path, headers=a)).status_code == 200
        assert_error(await client.get(path, headers=a), 404)
