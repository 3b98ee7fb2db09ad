"""The run service through its own interface, on both engines: a RunRequest in, a FinishedRun
out; run records; cancel; idempotent answers; and time that moves only when the test says."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from app.agent.messages import UserMessage
from app.errors import CarryoverError
from app.service.runs import ActiveRun, FinishedRun, Idempotency, Replayed, RunRequest

from .conftest import TENANT, Services


def request(*prompts: str, **options: Any) -> RunRequest:
    return RunRequest(prompts=tuple(UserMessage.text(p) for p in prompts), **options)


async def run(services: Services, conv: str, req: RunRequest, **kw: Any) -> FinishedRun:
    active = await services.runs.start(TENANT, conv, req, if_match=None, **kw)
    assert isinstance(active, ActiveRun)
    return await asyncio.wait_for(
        services.runs.wait(active, on_disconnect="continue", disconnected=None), 20
    )


def answer(finished: FinishedRun) -> tuple[int, dict[str, Any]]:
    return 201, {"run_id": finished.run.run_id, "status": finished.outcome.status}


async def test_a_run_returns_its_row_result_and_outcome(services: Services) -> None:
    await services.conversations.create(TENANT, "c1")
    finished = await run(services, "c1", request("hello"))
    assert finished.outcome.status == "completed" and finished.outcome.stored
    assert finished.result.final is not None
    assert finished.run.conversation_id == "c1"
    loaded = await services.conversations.get_context(TENANT, "c1")
    assert not isinstance(loaded, type(None))
    assert loaded.etag == finished.outcome.etag == finished.outcome.result_etag

    record = await services.runs.record(TENANT, "c1", finished.run.run_id)
    assert record.run.status == "completed" and record.final == finished.result.final
    page = await services.runs.records(TENANT, "c1", limit=1)
    assert [r.run.run_id for r in page.items] == [finished.run.run_id] and not page.more


async def test_refusals_name_their_problem_type(services: Services) -> None:
    await services.conversations.create(TENANT, "c1")
    with pytest.raises(CarryoverError) as info:
        await services.runs.start(TENANT, "nope", request("x"), if_match=None)
    assert info.value.slug == "not-found"
    with pytest.raises(CarryoverError) as info:
        await services.runs.start(TENANT, "c1", request("x", agent="ghost"), if_match=None)
    assert (info.value.slug, info.value.status) == ("validation-error", 422)
    with pytest.raises(CarryoverError) as info:
        await services.runs.record(TENANT, "c1", "no-such-run")
    assert (info.value.slug, info.value.status) == ("not-found", 404)

    finished = await run(services, "c1", request("done"))
    with pytest.raises(CarryoverError) as info:
        await services.runs.cancel(TENANT, "c1", finished.run.run_id)
    assert (info.value.slug, info.value.status) == ("run-not-active", 409)


async def test_a_busy_conversation_is_refused_and_a_cancel_ends_the_run(
    services: Services,
) -> None:
    await services.conversations.create(TENANT, "c1")
    active = await services.runs.start(TENANT, "c1", request("/sleep 30 long"), if_match=None)
    assert isinstance(active, ActiveRun)
    with pytest.raises(CarryoverError) as info:
        await services.runs.start(TENANT, "c1", request("me too"), if_match=None)
    assert info.value.slug == "run-in-progress"
    assert info.value.extras == {"active_run_id": active.run_id}
    assert info.value.headers == {"Retry-After": "1"}  # no finished run yet (docs/faults.md)

    record = await services.runs.cancel(TENANT, "c1", active.run_id)
    assert record.run.run_id == active.run_id
    finished = await services.runs.wait(active, on_disconnect="continue", disconnected=None)
    assert finished.outcome.status == "cancelled"


async def test_an_idempotent_answer_is_rendered_from_the_committed_outcome(
    services: Services,
) -> None:
    await services.conversations.create(TENANT, "c1")
    key = Idempotency("k1", "hash-1", answer)
    first = await run(services, "c1", request("once"), idempotency=key)
    again = await services.runs.start(TENANT, "c1", request("once"), if_match=None, idempotency=key)
    assert again == Replayed(201, {"run_id": first.run.run_id, "status": "completed"})
    with pytest.raises(CarryoverError) as info:
        await services.runs.start(
            TENANT,
            "c1",
            request("other"),
            if_match=None,
            idempotency=Idempotency("k1", "h2", answer),
        )
    assert (info.value.slug, info.value.status) == ("idempotency-key-mismatch", 422)


async def test_an_idempotency_key_expires_by_the_clock_without_sleeping(
    services: Services,
) -> None:
    """Retention is ``idempotency_ttl_seconds`` (600 here) of the injected clock: the test
    moves the clock instead of waiting."""
    await services.conversations.create(TENANT, "c1")
    key = Idempotency("k1", "hash-1", answer)
    first = await run(services, "c1", request("once"), idempotency=key)

    services.clock.advance(599)
    assert await services.repo.purge_idempotency_keys() == 0
    replay = await services.runs.start(
        TENANT, "c1", request("once"), if_match=None, idempotency=key
    )
    assert isinstance(replay, Replayed) and replay.body["run_id"] == first.run.run_id

    services.clock.advance(2)  # past the retention: the same key starts a new run
    second = await run(services, "c1", request("once"), idempotency=key)
    assert second.run.run_id != first.run.run_id


async def test_the_keeper_purges_expired_keys_by_the_clock(services: Services) -> None:
    await services.conversations.create(TENANT, "c1")
    await run(services, "c1", request("once"), idempotency=Idempotency("k1", "h", answer))
    services.clock.advance(601)
    assert await services.repo.purge_idempotency_keys() == 1


async def test_a_lease_expires_by_the_clock(services: Services) -> None:
    """A run whose process stopped renewing (lease 30 s here) is interrupted once the clock
    passes its lease, and only then."""
    await services.conversations.create(TENANT, "c1")
    started = await services.repo.start_run(
        TENANT,
        "c1",
        run_id="dead",
        if_match=None,
        prompts=(),
        agent="default",
        on_failure="keep",
        owner="a process that died",
        lease_seconds=30,
    )
    assert started.run is not None
    services.clock.advance(29)
    assert await services.repo.interrupt_expired() == 0
    assert await services.repo.lease_holder(TENANT, "c1") == "dead"
    services.clock.advance(2)
    assert await services.repo.lease_holder(TENANT, "c1") is None
    assert await services.repo.interrupt_expired() == 1
    record = await services.runs.record(TENANT, "c1", "dead")
    assert record.run.status == "interrupted"
