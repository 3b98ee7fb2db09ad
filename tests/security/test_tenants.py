"""A conversation belongs to its tenant and is invisible (404) to every other one, on every
route (contract §6): metadata, context GET/PUT, runs POST/list/get, transcript, listing, cancel,
compact, delete and Idempotency-Key replay. Another tenant may use the same conversation id:
it is a different conversation."""

from __future__ import annotations

import asyncio
from typing import Any

from ..fakes.gated import GatedProvider
from ..helpers import assert_problem
from .conftest import Tenants, snapshot

CONV = "shared-id"


async def acme_conversation(tenants: Tenants) -> dict[str, Any]:
    """acme's conversation CONV, with a context, a run and an idempotent run."""
    acme = tenants.acme
    created = await acme.post("/conversations", json={"id": CONV, "system_prompt": "acme only"})
    assert created.status_code == 201
    ran = await acme.post(
        f"/conversations/{CONV}/runs",
        json={"prompts": ["acme secret"]},
        headers={"Idempotency-Key": "key-1"},
    )
    assert ran.status_code == 201 and ran.json()["status"] == "completed"
    context = await acme.get(f"/conversations/{CONV}/context")
    return {
        "run_id": ran.json()["run_id"],
        "etag": context.headers["etag"],
        "context": context.json(),
    }


def assert_not_found(response: Any) -> None:
    body = assert_problem(response, 404, "not-found")
    assert "acme" not in body["detail"]


async def test_another_tenant_sees_nothing_of_a_conversation(
    tenants: Tenants, database_url: str
) -> None:
    acme = await acme_conversation(tenants)
    before = await snapshot(database_url)
    globex, base = tenants.globex, f"/conversations/{CONV}"
    run = f"{base}/runs/{acme['run_id']}"
    context = {"system_prompt": "globex was here", "messages": []}
    for response in [
        await globex.get(base),
        await globex.get(f"{base}/context"),
        await globex.get(f"{base}/context", headers={"If-None-Match": acme["etag"]}),
        await globex.put(f"{base}/context", json=context, headers={"If-Match": acme["etag"]}),
        await globex.put(f"{base}/context", json=context, headers={"If-Match": "*"}),
        await globex.post(f"{base}/runs", json={"prompts": ["hi"]}),
        await globex.post(
            f"{base}/runs",
            json={"prompts": ["hi"]},
            headers={"If-Match": acme["etag"], "Idempotency-Key": "key-1"},
        ),
        await globex.get(f"{base}/runs"),
        await globex.get(run),
        await globex.post(f"{run}/cancel"),
        await globex.post(f"{base}/compact", json={}),
        await globex.get(f"{base}/transcript"),
        await globex.delete(base),
        await globex.delete(base, headers={"If-Match": acme["etag"]}),
    ]:
        assert_not_found(response)
    assert (await globex.get("/conversations")).json() == {"items": [], "next_cursor": None}
    assert await snapshot(database_url) == before
    # and acme still has all of it
    assert (await tenants.acme.get(f"{base}/context")).json() == acme["context"]


async def test_the_same_id_in_two_tenants_is_two_conversations(
    tenants: Tenants, database_url: str
) -> None:
    acme = await acme_conversation(tenants)
    globex, base = tenants.globex, f"/conversations/{CONV}"
    created = await globex.put(
        f"{base}/context", json={"system_prompt": "globex"}, headers={"If-None-Match": "*"}
    )
    assert created.status_code == 201
    # the same Idempotency-Key and body as acme's first run: a new run, not acme's answer
    ran = await globex.post(
        f"{base}/runs", json={"prompts": ["acme secret"]}, headers={"Idempotency-Key": "key-1"}
    )
    assert ran.status_code == 201 and "idempotent-replayed" not in ran.headers
    assert ran.json()["run_id"] != acme["run_id"]
    assert ran.json()["context"]["system_prompt"] == "globex"
    assert_not_found(await globex.get(f"{base}/runs/{acme['run_id']}"))
    [globex_run] = (await globex.get(f"{base}/runs")).json()["items"]
    assert globex_run["run_id"] == ran.json()["run_id"]
    # acme's replay is still acme's
    again = await tenants.acme.post(
        f"{base}/runs", json={"prompts": ["acme secret"]}, headers={"Idempotency-Key": "key-1"}
    )
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json()["run_id"] == acme["run_id"]
    # each lists only its own, and deleting one leaves the other
    for client, prompt in ((tenants.acme, "acme only"), (globex, "globex")):
        [item] = (await client.get("/conversations")).json()["items"]
        assert (item["id"], item["system_prompt"]) == (CONV, prompt)
    assert (await globex.delete(base)).status_code == 204
    assert (await tenants.acme.get(f"{base}/context")).json() == acme["context"]
    transcript = (await tenants.acme.get(f"{base}/transcript")).json()["items"]
    assert "globex" not in str(transcript)


async def test_an_active_run_of_one_tenant_neither_blocks_nor_shows_to_another(
    gated_tenants: Tenants, gate: GatedProvider
) -> None:
    tenants = gated_tenants
    base = f"/conversations/{CONV}"
    for client in (tenants.acme, tenants.globex):
        assert (await client.post("/conversations", json={"id": CONV})).status_code == 201
    slow = asyncio.create_task(tenants.acme.post(f"{base}/runs", json={"prompts": ["held"]}))
    try:
        held = await gate.arrival("held")  # acme's run is in flight until released
        active = (await tenants.acme.get(base)).json()["active_run_id"]
        assert active
        assert (await tenants.globex.get(base)).json()["active_run_id"] is None
        assert_not_found(await tenants.globex.post(f"{base}/runs/{active}/cancel"))
        assert_not_found(await tenants.globex.get(f"{base}/runs/{active}"))
        # globex's conversation of the same id is not busy
        ran = await tenants.globex.post(f"{base}/runs", json={"prompts": ["quick"]})
        assert ran.status_code == 201 and ran.json()["status"] == "completed"
        assert not slow.done()  # all of that while acme's run was in flight
    finally:
        gate.release_all()
        finished = await slow
    assert finished.json()["status"] == "completed"  # the cancel attempt did nothing
    assert not held.cancelled


async def test_a_key_of_an_unknown_tenant_sees_nothing_either(tenants: Tenants) -> None:
    await acme_conversation(tenants)
    stranger = tenants.as_key("acme-key-9f2c0d7e4b1")  # one character short of acme's
    assert_problem(await stranger.get(f"/conversations/{CONV}"), 401, "unauthorized")
