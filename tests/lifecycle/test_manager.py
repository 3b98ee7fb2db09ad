"""The run manager and the lease queries in-process, on both engines: the races the process
tests can only hit by chance (a cancel while the outcome is written, a stop before the run's
task began, a lease lost to another process), shutdown, and the in-progress gauge."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import event, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.agent.messages import UserMessage
from app.api.views import run_view
from app.clock import ManualClock
from app.config import Settings
from app.observability import RUNS_IN_PROGRESS
from app.service.runs import ActiveRun, RunManager, RunRequest, ShuttingDown
from app.store.db import write_transaction
from app.store.tables import runs, utcnow
from tests.repository import Repository

from ..fakes.gated import GatedProvider, gated_pool
from ..helpers import until


@pytest.fixture
def gate() -> GatedProvider:
    """Holds the provider request of every run whose prompt starts with "held"."""
    return GatedProvider(hold=lambda prompt: prompt.startswith("held"))


@pytest.fixture
def clocked_repo(engine: AsyncEngine, clock: ManualClock) -> Repository:
    """A store whose time moves only when the test advances ``clock`` (leases, TTLs)."""
    return Repository(engine, clock)


@pytest.fixture
async def manager(
    repo: Repository, database_url: str, gate: GatedProvider
) -> AsyncIterator[RunManager]:
    settings = Settings(database_url=database_url, lease_seconds=2.0, busy_wait_seconds=5.0)
    pool = gated_pool(settings, gate)
    runs_ = RunManager(repo, pool, settings)
    try:
        yield runs_
    finally:
        gate.open()
        await runs_.aclose()
        await pool.aclose()


async def _start(manager: RunManager, conv: str, prompt: str, **body: Any) -> ActiveRun:
    request = RunRequest(prompts=(UserMessage.text(prompt),), **body)
    started = await manager.start("default", conv, request, if_match=None)
    assert isinstance(started, ActiveRun)
    return started


async def _answer(manager: RunManager, active: ActiveRun) -> dict[str, Any]:
    finished = await asyncio.wait_for(
        manager.wait(active, on_disconnect="continue", disconnected=None), 20
    )
    return run_view(finished).body()


def _gauge() -> float:
    return RUNS_IN_PROGRESS._value.get()  # type: ignore[attr-defined, no-any-return]


async def test_a_cancel_while_the_outcome_is_written_keeps_the_answer(
    manager: RunManager, repo: Repository, monkeypatch: pytest.MonkeyPatch
) -> None:
    await repo.create_conversation("default", "c1")
    writing, release = asyncio.Event(), asyncio.Event()
    finish = repo.runs.finish_run

    async def slow_finish(*args: Any, **kwargs: Any) -> Any:
        writing.set()
        await release.wait()
        return await finish(*args, **kwargs)

    monkeypatch.setattr(repo.runs, "finish_run", slow_finish)
    active = await _start(manager, "c1", "hello")
    await asyncio.wait_for(writing.wait(), 10)
    await manager.cancel("default", "c1", active.run_id)  # the row still says running
    manager.stop(active)
    release.set()
    body = await _answer(manager, active)
    assert body["status"] == "completed" and body["stored"] is True


async def test_a_run_stopped_before_its_task_began_ends_cancelled(
    manager: RunManager, repo: Repository
) -> None:
    await repo.create_conversation("default", "c1")
    before = _gauge()
    active = await _start(manager, "c1", "held: never")
    assert _gauge() == before + 1
    manager.stop(active)  # no await in between: the task has not begun
    body = await _answer(manager, active)
    assert body["status"] == "cancelled" and body["stored"] is False  # nothing was admitted
    assert _gauge() == before and not manager.active
    conv = await repo.get_conversation("default", "c1")
    assert conv is not None and conv.active_run_id is None


async def test_a_run_that_lost_its_lease_is_stopped_and_stores_nothing(
    manager: RunManager, repo: Repository
) -> None:
    await repo.create_conversation("default", "c1")
    loaded = await repo.load_context("default", "c1")
    active = await _start(manager, "c1", "held: paused")
    # as if this process had been paused past its lease: another process marks it interrupted
    async with write_transaction(repo.engine) as conn:
        await conn.execute(
            update(runs)
            .where(runs.c.run_id == active.run_id)
            .values(lease_expires_at=utcnow() - timedelta(seconds=1))
        )
    assert await repo.interrupt_expired() == 1
    await manager.start_keeper()  # its next renewal finds the run is no longer its own
    body = await _answer(manager, active)
    assert body["status"] == "interrupted" and body["stored"] is False
    assert body["etag"] == loaded.etag
    record = await repo.get_run("default", "c1", active.run_id)
    assert record is not None and record.run.status == "interrupted"
    assert record.new_messages == ()
    assert (await repo.load_context("default", "c1")).context.messages == ()
    assert await repo.list_transcript("default", "c1") == []


async def test_finish_is_fenced_by_the_lease(clocked_repo: Repository, clock: ManualClock) -> None:
    """The store refuses the outcome of a run another process marked interrupted, even when
    nothing was written since (the conditional write alone would let it through)."""
    from app.agent.messages import AssistantMessage, TextBlock, UserMessage
    from app.agent.records import Result

    await clocked_repo.create_conversation("default", "c1")
    prompt = UserMessage.text("late")
    started = await clocked_repo.start_run(
        "default",
        "c1",
        run_id="r1",
        if_match=None,
        prompts=(prompt,),
        agent="default",
        on_failure="keep",
        owner="me",
        lease_seconds=0.001,
    )
    assert started.loaded is not None
    clock.advance(0.01)
    assert await clocked_repo.interrupt_expired() == 1
    answer = AssistantMessage(
        content=(TextBlock(text="too late"),), provider="echo", model="echo", stop_reason="end_turn"
    )
    context = started.loaded.context.model_copy(update={"messages": (prompt, answer)})
    result = Result(
        status="completed", context=context, new_messages=(prompt, answer), final=answer
    )
    outcome = await clocked_repo.finish_run(
        "default", "c1", "r1", base=started.loaded, result=result, store=True
    )
    assert outcome.status == "interrupted" and outcome.stored is False
    assert outcome.etag == started.loaded.etag
    stored = await clocked_repo.load_context("default", "c1")
    assert stored.etag == started.loaded.etag and stored.context.messages == ()


async def test_renewal_is_one_statement_that_reports_cancels_and_losses(repo: Repository) -> None:
    for conv in ("c1", "c2", "c3"):
        await repo.create_conversation("default", conv)
        await repo.start_run(
            "default",
            conv,
            run_id=f"r-{conv}",
            if_match=None,
            prompts=(),
            agent="default",
            on_failure="keep",
            owner="me",
            lease_seconds=30,
        )
    await repo.request_cancel("default", "c2", "r-c2")
    async with write_transaction(repo.engine) as conn:  # r-c3 went to another process
        await conn.execute(
            update(runs).where(runs.c.run_id == "r-c3").values(lease_owner="someone else")
        )
    with _statements(repo) as executed:
        renewal = await repo.renew_leases(["r-c1", "r-c2", "r-c3"], owner="me", lease_seconds=30)
    assert renewal.renewed == {"r-c1", "r-c2"}
    assert renewal.cancel_requested == {"r-c2"}
    # one statement for every run of the process, however many (BEGIN aside)
    assert [s.split()[0] for s in executed if not s.startswith("BEGIN")] == ["UPDATE"]


@contextmanager
def _statements(repo: Repository) -> Iterator[list[str]]:
    executed: list[str] = []

    def after(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        executed.append(statement.strip())

    event.listen(repo.engine.sync_engine, "after_cursor_execute", after)
    try:
        yield executed
    finally:
        event.remove(repo.engine.sync_engine, "after_cursor_execute", after)


async def test_waiting_for_a_busy_conversation_polls_with_reads(
    manager: RunManager, repo: Repository
) -> None:
    """``if_busy: wait`` tries to take the lease once, then reads until the conversation looks
    free: waiters do not queue writes (on SQLite every write takes the one write lock)."""
    await repo.create_conversation("default", "c1")
    held = await repo.start_run(
        "default",
        "c1",
        run_id="holder",
        if_match=None,
        prompts=(),
        agent="default",
        on_failure="keep",
        owner="other",
        lease_seconds=30,
    )
    assert held.loaded is not None
    assert await repo.lease_holder("default", "c1") == "holder"
    with _statements(repo) as executed:
        waiting = asyncio.create_task(_start(manager, "c1", "after you", if_busy="wait"))

        async def polled() -> bool | None:  # it has read the lease holder a few times
            return True if sum(s.startswith("SELECT") for s in executed) > 2 else None

        await until(polled, what="the waiter to poll")
        attempts = [s for s in executed if "FOR UPDATE" in s or s == "BEGIN IMMEDIATE"]
        assert len(attempts) == 1  # the first try; the polls since were reads
        assert sum(s.startswith("SELECT") for s in executed) > 2
        assert not waiting.done()
        from app.agent.records import Result

        await repo.finish_run(
            "default",
            "c1",
            "holder",
            base=held.loaded,
            store=False,
            result=Result(status="completed", context=held.loaded.context),
        )
        assert await repo.lease_holder("default", "c1") is None
        active = await asyncio.wait_for(waiting, 10)
    body = await _answer(manager, active)
    assert body["status"] == "completed" and body["base_etag"] == held.loaded.etag


async def test_shutdown_cancels_runs_and_refuses_new_ones(
    manager: RunManager, repo: Repository, gate: GatedProvider
) -> None:
    await repo.create_conversation("default", "c1")
    await repo.create_conversation("default", "c2")
    active = await _start(manager, "c1", "held: in flight")
    held = await gate.arrival("held: in flight")  # admitted, and its model is answering
    manager.keeper.shutdown()
    body = await _answer(manager, active)
    assert body["status"] == "cancelled" and body["stored"] is True  # keep: prompt admitted
    assert held.cancelled  # the stop cut the provider request off
    with pytest.raises(ShuttingDown):
        await _start(manager, "c2", "too late")
    conv = await repo.get_conversation("default", "c1")
    assert conv is not None and conv.active_run_id is None


async def test_keys_of_runs_in_flight_outlive_their_retention(
    clocked_repo: Repository, clock: ManualClock
) -> None:
    from app.store.errors import IdempotencyInFlight
    from app.store.stores import IdempotencyClaim

    await clocked_repo.create_conversation("default", "c1")
    claim = IdempotencyClaim(key="k", request_hash="h", ttl_seconds=1)
    started = await clocked_repo.start_run(
        "default",
        "c1",
        run_id="r1",
        if_match=None,
        prompts=(),
        agent="default",
        on_failure="keep",
        owner="me",
        lease_seconds=30,
        idempotency=claim,
    )
    assert started.loaded is not None
    clock.advance(1.1)
    assert await clocked_repo.purge_idempotency_keys() == 0  # still running: the key stays, and
    with pytest.raises(IdempotencyInFlight):  # a repeat is still "in flight", not a new request
        await clocked_repo.start_run(
            "default",
            "c1",
            run_id="r2",
            if_match=None,
            prompts=(),
            agent="default",
            on_failure="keep",
            owner="me",
            lease_seconds=30,
            idempotency=claim,
        )
    from app.agent.records import Result

    outcome = await clocked_repo.finish_run(
        "default",
        "c1",
        "r1",
        base=started.loaded,
        result=Result(status="completed", context=started.loaded.context),
        store=True,
    )
    await clocked_repo.keep_answer(
        "default", "c1", "r1", status_code=201, response={"status": outcome.status}
    )
    assert await clocked_repo.purge_idempotency_keys() == 1


async def test_takeovers_and_sweeps_of_expired_leases_do_not_deadlock(
    clocked_repo: Repository, clock: ManualClock
) -> None:
    """After a crash, clients taking conversations over and sweepers marking the same runs
    interrupted lock rows in one order: none of them fails."""
    convs = [f"c{i}" for i in range(20)]
    for conv in convs:
        await clocked_repo.create_conversation("default", conv)
        await clocked_repo.start_run(
            "default",
            conv,
            run_id=f"dead-{conv}",
            if_match=None,
            prompts=(),
            agent="default",
            on_failure="keep",
            owner="dead",
            lease_seconds=0.001,
        )
    clock.advance(0.01)

    async def take(conv: str) -> None:
        started = await clocked_repo.start_run(
            "default",
            conv,
            run_id=f"new-{conv}",
            if_match=None,
            prompts=(),
            agent="default",
            on_failure="keep",
            owner="alive",
            lease_seconds=30,
        )
        assert started.run is not None

    results = await asyncio.gather(
        *(take(conv) for conv in convs),
        *(clocked_repo.interrupt_expired() for _ in range(4)),
        return_exceptions=True,
    )
    assert [r for r in results if isinstance(r, BaseException)] == []
    assert sum(r for r in results if isinstance(r, int)) <= len(convs)
    for conv in convs:
        record = await clocked_repo.get_run("default", conv, f"dead-{conv}")
        assert record is not None and record.run.status == "interrupted"
