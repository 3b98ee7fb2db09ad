"""``DELETE /v1/responses/{id}`` (docs/openai.md): the response is gone from ``/v1`` (404, and
400 as a ``previous_response_id``), its conversation is unchanged (items, context, and natively
the run record and transcript); deleting it again is a 404."""

from __future__ import annotations

from .conftest import AppClient
from .test_v1_http import assert_error, respond


async def test_a_deleted_response_is_gone_from_v1_and_its_conversation_unchanged(
    client: AppClient,
) -> None:
    first = await respond(client, input="one")
    conv = first["conversation"]["id"]
    items = (await client.get(f"/v1/conversations/{conv}/items")).json()["data"]
    context = (await client.get(f"/conversations/{conv}/context")).content

    deleted = await client.delete(f"/v1/responses/{first['id']}")
    assert deleted.status_code == 200, deleted.text
    assert deleted.json() == {"id": first["id"], "object": "response", "deleted": True}

    assert_error(await client.get(f"/v1/responses/{first['id']}"), 404)
    assert_error(await client.get(f"/v1/responses/{first['id']}/input_items"), 404)
    assert_error(await client.delete(f"/v1/responses/{first['id']}"), 404)
    follow = await client.post(
        "/v1/responses",
        json={"model": "default", "input": "x", "previous_response_id": first["id"]},
    )
    assert_error(follow, 400, "previous_response_id")

    assert (await client.get(f"/v1/conversations/{conv}/items")).json()["data"] == items
    assert (await client.get(f"/conversations/{conv}/context")).content == context
    run_id = first["id"].removeprefix("resp_")
    assert (await client.get(f"/conversations/{conv}/runs/{run_id}")).status_code == 200
    # the conversation goes on
    await respond(client, input="two", conversation=conv)
