"""Several server processes, one database, many clients on one conversation (contract §4 step 2):
``if_busy: wait`` loses nothing and duplicates nothing; ``if_busy: reject`` answers either a
completed run or a 409 naming the active run; ``carryover serve --workers 2`` on both engines."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import pytest

from app.store.tables import parse_etag

from ..fakes.gated_http import PROFILE, GatedOpenAI
from ..helpers import HANG_GUARD_SECONDS, user_texts
from .harness import (
    Server,
    Servers,
    all_runs,
    all_transcript,
    client,
    create_conversation,
    stored_context,
)

CLIENTS = 16


async def _wait_runs(gate: GatedOpenAI, targets: list[Server], conv: str) -> list[dict[str, Any]]:
    """CLIENTS concurrent ``if_busy: wait`` runs, spread over the targets, whose model answers
    one request after the other; their answers."""

    async def one(i: int) -> dict[str, Any]:
        async with client(targets[i % len(targets)]) as http:
            answer = await http.post(
                f"/conversations/{conv}/runs",
                json={"prompts": [f"client {i}"], "if_busy": "wait", "agent": PROFILE},
            )
        assert answer.status_code == 201, answer.text
        body: dict[str, Any] = answer.json()
        assert answer.headers["etag"] == body["etag"]
        return body

    releaser = asyncio.create_task(gate.release_in_order(CLIENTS))
    answers = await asyncio.gather(*(one(i) for i in range(CLIENTS)))
    await releaser
    return answers


async def _check_chain(
    http: httpx.AsyncClient, conv: str, created_etag: str, answers: list[dict[str, Any]]
) -> None:
    """Every prompt stored exactly once; the runs form one chain of versions."""
    assert all(a["status"] == "completed" and a["stored"] for a in answers), answers
    etags = [a["etag"] for a in answers]
    assert len(set(etags)) == len(etags), "two runs answered the same ETag"
    # each run's base is the previous run's result: one chain from the created state
    by_base = {a["base_etag"]: a for a in answers}
    assert len(by_base) == len(answers), "two runs started from the same state"
    chain, etag = [], created_etag
    while etag in by_base:
        chain.append(by_base[etag])
        etag = by_base[etag]["etag"]
    assert len(chain) == len(answers)
    versions = [parse_etag(a["etag"]) for a in chain]
    assert all(v is not None for v in versions)
    numbers = [v[1] for v in versions if v is not None]
    assert numbers == sorted(set(numbers)), "versions are not strictly increasing"

    context, current = await stored_context(http, conv)
    assert current == chain[-1]["etag"]
    prompts = [user_texts(a["prompts"])[0] for a in chain]
    assert user_texts(context["messages"]) == prompts
    assert sorted(prompts) == sorted(f"client {i}" for i in range(CLIENTS))

    runs = await all_runs(http, conv)
    assert sorted(r["run_id"] for r in runs) == sorted(a["run_id"] for a in answers)
    assert all(r["status"] == "completed" for r in runs)
    entries = await all_transcript(http, conv)
    transcript_prompts = [e["body"]["content"][0]["text"] for e in entries if e["kind"] == "prompt"]
    assert transcript_prompts == prompts
    seqs = [e["seq"] for e in entries]
    assert seqs == list(range(1, len(entries) + 1))


async def test_wait_on_two_servers_loses_and_duplicates_nothing(
    postgres_url: str, servers: Servers, gate: GatedOpenAI
) -> None:
    a, b = await servers.start(postgres_url, 2, **gate.settings())
    async with client(a) as http:
        conv, created = await create_conversation(http)
        answers = await _wait_runs(gate, [a, b], conv)
        await _check_chain(http, conv, created, answers)


async def test_reject_on_two_servers_is_a_run_or_a_409_naming_the_active_run(
    postgres_url: str, servers: Servers, gate: GatedOpenAI
) -> None:
    a, b = await servers.start(postgres_url, 2, **gate.settings())
    async with client(a) as http:
        conv, created = await create_conversation(http)

    async def one(i: int) -> httpx.Response:
        async with client((a, b)[i % 2]) as http:
            return await http.post(
                f"/conversations/{conv}/runs",
                json={"prompts": [f"client {i}"], "agent": PROFILE},
            )

    # one run takes the conversation and its model holds it: every other client is refused
    tasks = [asyncio.create_task(one(i)) for i in range(CLIENTS)]
    held = await gate.arrival()
    pending = set(tasks)
    async with asyncio.timeout(HANG_GUARD_SECONDS):
        while len(pending) > 1:
            _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
    held.release()
    completed: list[dict[str, Any]] = []
    refused: list[httpx.Response] = []
    for answer in await asyncio.gather(*tasks):
        if answer.status_code == 201:
            assert answer.json()["status"] == "completed", answer.text
            completed.append(answer.json())
        else:
            refused.append(answer)
    assert len(completed) == 1 and len(refused) == CLIENTS - 1
    assert user_texts(completed[0]["prompts"]) == [held.prompt]
    assert len(gate.held) == 1  # the refused ones never reached the model

    async with client(b) as http:
        runs = {r["run_id"]: r for r in await all_runs(http, conv)}
        for answer in refused:
            assert answer.status_code == 409, answer.text
            assert answer.headers["content-type"] == "application/problem+json"
            problem = answer.json()
            assert problem["type"].endswith("/run-in-progress")
            assert problem["active_run_id"] in runs  # a real run of this conversation
            assert int(answer.headers["retry-after"]) >= 1
        # nothing but the completed runs ran, and each is stored once, in one chain
        assert sorted(runs) == sorted(c["run_id"] for c in completed)
        context, etag = await stored_context(http, conv)
        by_base = {c["base_etag"]: c for c in completed}
        chain, tag = [], created
        while tag in by_base:
            chain.append(by_base[tag])
            tag = by_base[tag]["etag"]
        assert len(chain) == len(completed) and tag == etag
        assert user_texts(context["messages"]) == [user_texts(c["prompts"])[0] for c in chain]


@pytest.mark.parametrize("engine", ["postgresql", "sqlite"])
async def test_serve_with_two_workers(
    engine: str, postgres_url: str, sqlite_url: str, servers: Servers, gate: GatedOpenAI
) -> None:
    """``--workers 2`` starts two worker processes that share the leases through the database."""
    url = postgres_url if engine == "postgresql" else sqlite_url
    [server] = await servers.start(url, workers=2, **gate.settings())
    assert len(server.pids()) >= 3, "a supervisor and two workers"
    prefix = f"workers-{uuid.uuid4().hex[:8]}"
    async with client(server) as http:
        conv, created = await create_conversation(http, id=f"{prefix}-0")
        answers = await _wait_runs(gate, [server], conv)
        await _check_chain(http, conv, created, answers)

    # Both workers take runs: each process keeps its leases under an owner of its own. The
    # kernel hands connections to whichever worker accepts first, so send bursts of new
    # connections (one conversation each), all held in flight together, until both answered.
    async def one(i: int) -> None:
        async with client(server) as http:
            conv, _ = await create_conversation(http, id=f"{prefix}-{i}")
            answer = await http.post(
                f"/conversations/{conv}/runs", json={"prompts": ["spread"], "agent": PROFILE}
            )
            assert answer.status_code == 201 and answer.json()["status"] == "completed"

    async def burst_in_flight(burst: int) -> None:
        runs = asyncio.gather(*(one(burst * 20 + i) for i in range(1, 21)))
        await gate.arrival("spread", count=(burst + 1) * 20)  # the whole burst is in flight
        gate.release_all()
        await runs

    owners: set[str] = set()
    for burst in range(10):
        await burst_in_flight(burst)
        owners = await _lease_owners(url, prefix)
        if len(owners) == 2:
            break
    assert len(owners) == 2, owners
    async with client(server) as http:
        metrics = await http.get("/metrics")
    assert metrics.status_code == 200
    assert "carryover_runs_total" in metrics.text


async def _lease_owners(url: str, prefix: str) -> set[str]:
    from sqlalchemy import select

    from app.store.db import make_engine, read_transaction
    from app.store.tables import runs

    engine = make_engine(url)
    try:
        async with read_transaction(engine) as conn:
            rows = await conn.execute(
                select(runs.c.lease_owner)
                .where(runs.c.conversation_id.startswith(prefix))
                .distinct()
            )
            return {row[0] for row in rows}
    finally:
        await engine.dispose()
