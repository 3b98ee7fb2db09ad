"""The run queue's store rules (app/store/queue.py), on both engines: arrival order, a claim
started by one process only, waiters that gave up or whose process died, a held ``enqueue``
run whose process died becoming a background run, cancelling a queued run. The time is a
ManualClock's."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.agent.messages import UserMessage
from app.agent.records import Result
from app.clock import ManualClock
from app.store.idempotency import IdempotencyClaim
from app.store.queue import ASYNC_ANSWER_KEY
from tests.repository import Repository

T = "acme"
LEASE = 10.0


@pytest.fixture
async def queue(engine: AsyncEngine, clock: ManualClock) -> Repository:
    repo = Repository(engine, clock)
    await repo.create_conversation(T, "c")
    return repo


async def enqueue(repo: Repository, run_id: str, **options: Any) -> Any:
    values: dict[str, Any] = {
        "if_match": None,
        "prompts": (UserMessage.text(run_id),),
        "agent": "default",
        "on_failure": "keep",
        "owner": "p1",
        "lease_seconds": LEASE,
        "held": False,
    }
    values.update(options)
    return await repo.enqueue_run(T, "c", run_id=run_id, **values)


async def finish(repo: Repository, started: Any) -> None:
    await repo.finish_run(
        T,
        "c",
        started.run.run_id,
        base=started.loaded,
        store=False,
        result=Result(status="completed", context=started.loaded.context),
    )


async def claim(repo: Repository, owner: str = "p2", mine: str | None = None) -> Any:
    return await repo.claim_next(T, "c", owner=owner, lease_seconds=LEASE, mine=mine)


async def test_runs_leave_the_queue_in_arrival_order(queue: Repository) -> None:
    first = await enqueue(queue, "r1")
    assert first.started.run.run_id == "r1" and first.started.run.status == "running"
    for run_id in ("r2", "r3", "r4"):
        queued = await enqueue(queue, run_id)
        assert queued.started is None and queued.run.status == "queued"
    assert await claim(queue) is None  # r1 holds the conversation
    order = ["r1"]
    started = first.started
    while True:
        await finish(queue, started)
        started = await claim(queue)
        if started is None:
            break
        assert started.run.base_etag == started.loaded.etag
        order.append(started.run.run_id)
    assert order == ["r1", "r2", "r3", "r4"]
    assert [r.status for r in await queue.list_runs(T, "c")] == ["completed"] * 4


async def test_two_processes_claiming_at_once_start_the_head_once(queue: Repository) -> None:
    first = await enqueue(queue, "r1")
    await enqueue(queue, "r2")
    await finish(queue, first.started)
    claims = await asyncio.gather(*(claim(queue, owner=f"p{n}") for n in range(4)))
    started = [c for c in claims if c is not None and c.run is not None]
    assert [s.run.run_id for s in started] == ["r2"]
    conv = await queue.get_conversation(T, "c")
    assert conv is not None and conv.active_run_id == "r2"


async def test_a_held_run_is_claimed_by_its_holder_only(
    queue: Repository, clock: ManualClock
) -> None:
    first = await enqueue(queue, "r1")
    await enqueue(queue, "w", held=True, owner="p1", wait_seconds=30)
    await enqueue(queue, "bg")
    await finish(queue, first.started)
    assert await claim(queue, owner="p2") is None  # the head is p1's waiter
    state = await queue.queue_state(T, "c", "w")
    assert (state.status, state.claimable) == ("queued", True)
    assert (await queue.queue_state(T, "c", "bg")).claimable is False
    started = await claim(queue, owner="p1", mine="w")
    assert started.run.run_id == "w" and started.run.lease_owner == "p1"


async def test_waiters_that_gave_up_or_whose_process_died_are_dropped(
    queue: Repository, clock: ManualClock
) -> None:
    first = await enqueue(queue, "r1")
    await enqueue(queue, "short", held=True, wait_seconds=1)
    await enqueue(queue, "orphan", held=True, owner="gone", wait_seconds=60)
    await enqueue(queue, "bg")
    await finish(queue, first.started)
    clock.advance(LEASE + 1)  # "short" is past its bound; "gone" renewed nothing
    assert await queue.renew_holds(["short"], owner="p1", lease_seconds=LEASE) == {"short"}
    started = await claim(queue)
    assert started.run.run_id == "bg"
    assert {r.run_id for r in await queue.list_runs(T, "c")} == {"r1", "bg"}
    assert (await queue.queue_state(T, "c", "short")).status is None


async def test_a_held_enqueue_run_whose_process_died_runs_in_the_background(
    queue: Repository, clock: ManualClock
) -> None:
    first = await enqueue(queue, "r1")
    key = IdempotencyClaim(key="k", request_hash="h", ttl_seconds=3600)
    await enqueue(queue, "held", held=True, owner="gone", idempotency=key)
    await finish(queue, first.started)
    assert await claim(queue) is None  # its holder is alive (for all we know)
    clock.advance(LEASE + 1)
    assert await queue.ready_queues() == [(T, "c")]
    started = await claim(queue)
    assert started.run.run_id == "held" and started.run.lease_owner == "p2"
    # a repeat of its request answers the run's record (its client is gone)
    again = await enqueue(queue, "again", idempotency=key)
    assert again.replay.status_code == 202
    assert again.replay.response == {ASYNC_ANSWER_KEY: True, "run_id": "held"}


async def test_a_cancelled_queued_run_ends_without_running(queue: Repository) -> None:
    first = await enqueue(queue, "r1")
    await enqueue(queue, "doomed")
    await enqueue(queue, "next")
    cancelled = await queue.request_cancel(T, "c", "doomed")
    assert cancelled.status == "cancelled" and cancelled.queue_seq is None
    assert cancelled.error is not None and cancelled.error["kind"] == "aborted"
    await finish(queue, first.started)
    assert (await claim(queue)).run.run_id == "next"


async def test_a_new_run_does_not_overtake_the_queue(queue: Repository) -> None:
    first = await enqueue(queue, "r1")
    await enqueue(queue, "r2")
    await finish(queue, first.started)  # free, but r2 waits to be claimed
    refused = await queue.start_run(
        T,
        "c",
        run_id="fresh",
        if_match=None,
        prompts=(),
        agent="default",
        on_failure="keep",
        owner="p3",
        lease_seconds=LEASE,
    )
    assert refused.run is None and refused.active_run_id == "r2"
    rejected = await enqueue(queue, "fresh", reject_if_busy=True)
    assert rejected.busy == "r2" and rejected.run is None
