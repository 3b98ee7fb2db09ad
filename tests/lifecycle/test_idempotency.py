"""``Idempotency-Key`` on ``POST …/runs`` across server processes (contract §4): the same key and
body replay the first answer without running again; another body is a 422; while the first
still runs, a 409; keys are scoped to the caller (tenant) and the conversation, and kept for
``CARRYOVER_IDEMPOTENCY_TTL_SECONDS`` — then purged by the lease keeper."""

from __future__ import annotations

import asyncio

from ..fakes.gated_http import PROFILE, GatedOpenAI
from ..helpers import HANG_GUARD_SECONDS
from .harness import (
    Servers,
    all_runs,
    background_run,
    client,
    create_conversation,
    eventually,
    started_run,
)


async def test_same_key_and_body_replays_without_running_again(
    postgres_url: str, servers: Servers
) -> None:
    a, b = await servers.start(postgres_url, 2)
    key = {"Idempotency-Key": "order-42"}
    async with client(a) as http_a, client(b) as http_b:
        conv, _ = await create_conversation(http_a)
        first = await http_a.post(
            f"/conversations/{conv}/runs", headers=key, json={"prompts": ["once"]}
        )
        assert first.status_code == 201 and "idempotent-replayed" not in first.headers
        for http in (http_b, http_a, http_b):  # on either server
            again = await http.post(
                f"/conversations/{conv}/runs", headers=key, json={"prompts": ["once"]}
            )
            assert again.status_code == 201
            assert again.headers["idempotent-replayed"] == "true"
            assert again.json() == first.json()
            assert again.headers["etag"] == first.headers["etag"]
            assert again.headers["location"] == first.headers["location"]
        assert len(await all_runs(http_b, conv)) == 1  # no second run
        context = (await http_b.get(f"/conversations/{conv}/context")).json()
        assert len(context["messages"]) == 2

        # same key, another body: 422, nothing runs
        other = await http_b.post(
            f"/conversations/{conv}/runs", headers=key, json={"prompts": ["twice"]}
        )
        assert other.status_code == 422
        assert other.json()["type"].endswith("/idempotency-key-mismatch")
        other = await http_b.post(
            f"/conversations/{conv}/runs",
            headers=key,
            json={"prompts": ["once"], "on_failure": "discard"},
        )
        assert other.status_code == 422
        assert len(await all_runs(http_b, conv)) == 1

        # the same key on another conversation is another request
        conv2, _ = await create_conversation(http_a)
        elsewhere = await http_b.post(
            f"/conversations/{conv2}/runs", headers=key, json={"prompts": ["once"]}
        )
        assert elsewhere.status_code == 201 and "idempotent-replayed" not in elsewhere.headers
        assert elsewhere.json()["run_id"] != first.json()["run_id"]


async def test_while_the_first_runs_a_repeat_is_409(
    postgres_url: str, servers: Servers, gate: GatedOpenAI
) -> None:
    a, b = await servers.start(postgres_url, 2, **gate.settings())
    key = {"Idempotency-Key": "slow-1"}
    body = {"prompts": ["slow"], "agent": PROFILE}
    async with client(b) as http:
        conv, _ = await create_conversation(http)
        running = background_run(a, conv, "slow", headers=key, agent=PROFILE)
        run_id = await started_run(http, conv)
        held = await gate.arrival("slow")  # the first is in flight until released
        repeat = await http.post(f"/conversations/{conv}/runs", headers=key, json=body)
        assert repeat.status_code == 409, repeat.text
        assert repeat.json()["type"].endswith("/idempotency-key-in-flight")
        assert repeat.json()["run_id"] == run_id
        assert int(repeat.headers["retry-after"]) >= 1
        # with if_busy: wait it is still the same key in flight, not a wait for the lease
        waiting = await http.post(
            f"/conversations/{conv}/runs", headers=key, json={**body, "if_busy": "wait"}
        )
        assert waiting.status_code == 422  # another body (if_busy differs)
        assert not running.done()

        held.release()
        first = await asyncio.wait_for(running, HANG_GUARD_SECONDS)
        assert first.status_code == 201
        replay = await http.post(f"/conversations/{conv}/runs", headers=key, json=body)
        assert replay.headers["idempotent-replayed"] == "true"
        assert replay.json() == first.json()
        assert len(await all_runs(http, conv)) == 1
        assert len(gate.held) == 1  # the model was asked once


async def test_keys_are_scoped_per_tenant(postgres_url: str, servers: Servers) -> None:
    keys = "acme:acme-key-0123456789,globex:globex-key-0123456789"
    a, b = await servers.start(postgres_url, 2, api_keys=keys)
    acme = {"Authorization": "Bearer acme-key-0123456789"}
    globex = {"Authorization": "Bearer globex-key-0123456789"}
    async with client(a, headers=acme) as http_acme, client(b, headers=globex) as http_globex:
        # the same conversation id in both tenants, the same key and body
        for http in (http_acme, http_globex):
            created = await http.post("/conversations", json={"id": "shared-id"})
            assert created.status_code == 201, created.text
        key = {"Idempotency-Key": "tenant-key"}
        ran = []
        for http in (http_acme, http_globex):
            answer = await http.post(
                "/conversations/shared-id/runs", headers=key, json={"prompts": ["mine"]}
            )
            assert answer.status_code == 201 and "idempotent-replayed" not in answer.headers
            ran.append(answer.json()["run_id"])
        assert ran[0] != ran[1]
        # each tenant replays its own answer only
        for http, run_id in zip((http_acme, http_globex), ran, strict=True):
            again = await http.post(
                "/conversations/shared-id/runs", headers=key, json={"prompts": ["mine"]}
            )
            assert again.headers["idempotent-replayed"] == "true"
            assert again.json()["run_id"] == run_id
            assert [r["run_id"] for r in await all_runs(http, "shared-id")] == [run_id]
        # and never sees the other's run
        peek = await http_globex.get(f"/conversations/shared-id/runs/{ran[0]}")
        assert peek.status_code == 404
    async with client(a) as anonymous:
        refused = await anonymous.post(
            "/conversations/shared-id/runs", headers=key, json={"prompts": ["mine"]}
        )
        assert refused.status_code == 401


async def test_expired_keys_are_purged_and_no_longer_replay(
    postgres_url: str, servers: Servers
) -> None:
    [server] = await servers.start(postgres_url, idempotency_ttl_seconds=1)
    key = {"Idempotency-Key": "short-lived"}
    async with client(server) as http:
        conv, _ = await create_conversation(http)
        first = await http.post(
            f"/conversations/{conv}/runs", headers=key, json={"prompts": ["again later"]}
        )
        assert first.status_code == 201
        assert await _stored_keys(postgres_url, conv) == ["short-lived"]

        # the keeper deletes the key once past its retention, without anyone asking for it
        async def purged() -> bool | None:
            return True if await _stored_keys(postgres_url, conv) == [] else None

        await eventually(purged, within=20, interval=0.2, what="the expired key to be purged")
        again = await http.post(
            f"/conversations/{conv}/runs", headers=key, json={"prompts": ["again later"]}
        )
        assert again.status_code == 201 and "idempotent-replayed" not in again.headers
        assert again.json()["run_id"] != first.json()["run_id"]
        assert len(await all_runs(http, conv)) == 2


async def _stored_keys(url: str, conv: str) -> list[str]:
    from sqlalchemy import select

    from app.store.db import make_engine, read_transaction
    from app.store.tables import idempotency_keys

    engine = make_engine(url)
    try:
        async with read_transaction(engine) as conn:
            rows = await conn.execute(
                select(idempotency_keys.c.key).where(idempotency_keys.c.conversation_id == conv)
            )
            return [row[0] for row in rows]
    finally:
        await engine.dispose()
