"""The webhook outbox (issue 13) on both engines: a delivery per matching endpoint is written
in the run's outcome transaction (and none when the outcome is refused); claims are leased and
disjoint; settling backs off, then fails after the last attempt. And the signature scheme
against the Standard Webhooks example."""

from __future__ import annotations

import asyncio

from sqlalchemy.ext.asyncio import AsyncEngine

from app.clock import ManualClock
from app.service.webhooks import sign, verify
from app.store.tables import runs
from tests.repository import Repository

from .builders import completed_run, user

T = "acme"


async def finished_run(repo: Repository, conv: str = "c") -> str:
    base = await repo.load_context(T, conv)
    run = await repo.insert_run(T, conv, base_etag=base.etag, prompts=[user("p")])
    await repo.finish_run(
        T, conv, run.run_id, base=base, result=completed_run(base.context), store=True
    )
    return run.run_id


async def test_the_outcome_transaction_writes_a_delivery_per_matching_endpoint(
    repo: Repository,
) -> None:
    await repo.create_conversation(T, "c")
    wanted = await repo.add_webhook(T, "http://a.test/", ["run.completed"])
    await repo.add_webhook(T, "http://b.test/", ["run.failed"])  # not this event
    await repo.add_webhook("other", "http://c.test/", ["run.completed"])  # not this tenant
    run_id = await finished_run(repo)
    found = await repo.list_deliveries()
    assert [(d.webhook_id, d.run_id, d.event, d.status) for d in found] == [
        (wanted.id, run_id, "run.completed", "pending")
    ]
    assert wanted.secret.startswith("whsec_")


async def test_a_refused_outcome_writes_no_delivery(repo: Repository) -> None:
    await repo.create_conversation(T, "c")
    await repo.add_webhook(T, "http://a.test/", ["run.completed", "run.interrupted"])
    base = await repo.load_context(T, "c")
    run = await repo.insert_run(T, "c", base_etag=base.etag, prompts=[user("p")])
    async with repo.engine.begin() as conn:  # another process marked it interrupted
        await conn.execute(
            runs.update().where(runs.c.run_id == run.run_id).values(status="interrupted")
        )
    outcome = await repo.finish_run(
        T, "c", run.run_id, base=base, result=completed_run(base.context), store=True
    )
    assert outcome.status == "interrupted"
    assert await repo.list_deliveries() == []  # the finish rolled back, its delivery too


async def test_claims_are_leased_and_disjoint_and_attempts_back_off_then_fail(
    engine: AsyncEngine,
) -> None:
    clock = ManualClock()
    repo = Repository(engine, clock)
    await repo.create_conversation(T, "c")
    await repo.add_webhook(T, "http://a.test/", ["run.completed"])
    for _ in range(3):
        await finished_run(repo)
    first, second = await asyncio.gather(
        repo.claim_deliveries("w1", lease_seconds=1000, limit=2),
        repo.claim_deliveries("w2", lease_seconds=1000, limit=2),
    )
    ids1, ids2 = {d.id for d, _ in first}, {d.id for d, _ in second}
    assert len(ids1 | ids2) == 3 and not ids1 & ids2  # every one, once
    assert await repo.claim_deliveries("w3", lease_seconds=30, limit=10) == []  # all leased

    (delivery, _), *_ = first

    async def claim() -> list[str]:
        return [d.id for d, _ in await repo.claim_deliveries("w1", lease_seconds=30, limit=10)]

    async def attempt(owner: str, error: str | None) -> str | None:
        return await repo.settle_delivery(
            delivery.id,
            owner,
            delivered=error is None,
            error=error,
            max_attempts=3,
            backoff_seconds=10.0,
        )

    assert await attempt("w2", None) is None  # not its lease: nothing changes
    assert await attempt("w1", "HTTP 500") == "pending"
    clock.advance(9)
    assert delivery.id not in await claim()
    clock.advance(1)  # 10 s after the first failure
    assert await claim() == [delivery.id]
    assert await attempt("w1", "timeout") == "pending"
    clock.advance(19)
    assert delivery.id not in await claim()  # twice as long now: 20 s
    clock.advance(1)
    assert await claim() == [delivery.id]
    assert await attempt("w1", "HTTP 503") == "failed"  # the third and last attempt
    [row] = [d for d in await repo.list_deliveries() if d.id == delivery.id]
    assert (row.status, row.attempts, row.last_error) == ("failed", 3, "HTTP 503")


def test_the_signature_is_the_standard_webhooks_example() -> None:
    # the example of the Standard Webhooks reference libraries' tests
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    msg_id, timestamp, body = "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, b'{"test": 2432232314}'
    signature = sign(secret, msg_id, timestamp, body)
    assert signature == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    headers = {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": f"v1,bm90IGl0 {signature}",  # several, space-separated
    }
    assert verify(secret, headers, body)
    assert not verify(secret, headers, body + b" ")
    assert not verify(secret, {**headers, "webhook-timestamp": str(timestamp + 1)}, body)


async def test_a_run_of_a_dead_process_is_announced_interrupted(engine: AsyncEngine) -> None:
    clock = ManualClock()
    repo = Repository(engine, clock)
    await repo.create_conversation(T, "c")
    hook = await repo.add_webhook(T, "http://a.test/", ["run.interrupted"])
    started = await repo.start_run(
        T,
        "c",
        run_id="00000000-0000-0000-0000-00000000dead",
        if_match=None,
        prompts=[user("p")],
        agent="default",
        on_failure="keep",
        owner="gone",
        lease_seconds=5,
    )
    assert started.run is not None
    clock.advance(6)
    assert await repo.interrupt_expired() == 1
    [delivery] = await repo.list_deliveries()
    assert (delivery.webhook_id, delivery.run_id, delivery.event) == (
        hook.id,
        started.run.run_id,
        "run.interrupted",
    )
