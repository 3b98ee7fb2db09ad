"""Per-tenant quotas through HTTP (docs/operations.md "Quotas"): a spent quota answers 429
``quota-exceeded`` with Retry-After and the RateLimit headers and nothing runs; tokens are
settled when a run ends; ``GET /usage`` matches the run records."""

from __future__ import annotations

from typing import Any

from app.store.quotas import QuotaStore

from ..helpers import assert_problem
from .conftest import AppClient

TENANT = "default"  # the tenant of a service without API keys


def quotas(client: AppClient) -> QuotaStore:
    svc: Any = client.app.state.services
    return QuotaStore(svc.engine, svc.runs.clock)


async def runs_of(client: AppClient, conv: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = (await client.get(f"/conversations/{conv}/runs")).json()["items"]
    return items


async def test_runs_per_minute_refuses_with_headers_and_runs_nothing(client: AppClient) -> None:
    await quotas(client).set(TENANT, runs_per_minute=2)
    await client.post("/conversations", json={"id": "c"})
    for prompt in ("one", "two"):
        assert (
            await client.post("/conversations/c/runs", json={"prompts": [prompt]})
        ).status_code == 201
    before = (await client.get("/conversations/c")).json()
    refused = await client.post("/conversations/c/runs", json={"prompts": ["three"]})
    problem = assert_problem(refused, 429, "quota-exceeded")
    assert problem["limit"] == "runs_per_minute" and problem["quota"] == 2
    assert problem["used"] == 2
    assert 1 <= int(refused.headers["retry-after"]) <= 61
    assert refused.headers["ratelimit-policy"] == '"runs-per-minute";q=2;w=60'
    assert refused.headers["ratelimit"] == (
        f'"runs-per-minute";r=0;t={refused.headers["retry-after"]}'
    )
    # nothing ran: no run record, the conversation as it was
    assert len(await runs_of(client, "c")) == 2
    assert (await client.get("/conversations/c")).json() == before
    usage = (await client.get("/usage")).json()
    assert usage["days"][0]["runs"] == 2
    assert usage["quota"]["runs_last_minute"] == 2
    assert usage["quota"]["limits"]["runs_per_minute"] == 2


async def test_tokens_per_day_refuse_once_spent_and_usage_matches_the_records(
    client: AppClient,
) -> None:
    await client.post("/conversations", json={"id": "c"})
    first = (await client.post("/conversations/c/runs", json={"prompts": ["hello"]})).json()
    spent = first["usage"]["input_tokens"] + first["usage"]["output_tokens"]
    # a budget the first run already overshot: it was recorded, the next is refused
    await quotas(client).set(TENANT, tokens_per_day=spent)
    refused = await client.post("/conversations/c/runs", json={"prompts": ["again"]})
    problem = assert_problem(refused, 429, "quota-exceeded")
    assert problem["limit"] == "tokens_per_day" and problem["used"] == spent
    assert refused.headers["ratelimit-policy"] == f'"tokens-per-day";q={spent};w=86400'
    # raising it lets runs start again
    await quotas(client).set(TENANT, tokens_per_day=spent * 10)
    second = (await client.post("/conversations/c/runs", json={"prompts": ["more"]})).json()
    assert second["status"] == "completed"

    records = await runs_of(client, "c")
    usage = (await client.get("/usage")).json()
    [today] = usage["days"]
    assert today["runs"] == len(records) == 2
    assert today["input_tokens"] == sum(r["usage"]["input_tokens"] for r in records)
    assert today["output_tokens"] == sum(r["usage"]["output_tokens"] for r in records)
    assert usage["quota"]["tokens_today"] == today["input_tokens"] + today["output_tokens"]
    assert usage["tenant"] == TENANT


async def test_usage_without_quota(client: AppClient) -> None:
    usage = (await client.get("/usage")).json()
    assert usage["days"] == [] and usage["quota"]["limits"] is None
    assert_problem(await client.get("/usage?days=0"), 422, "validation-error")


async def test_clearing_a_quota_lets_runs_start(client: AppClient) -> None:
    store = quotas(client)
    await store.set(TENANT, runs_per_minute=1)
    await client.post("/conversations", json={"id": "c"})
    await client.post("/conversations/c/runs", json={"prompts": ["one"]})
    assert (await client.post("/conversations/c/runs", json={"prompts": ["x"]})).status_code == 429
    assert await store.clear(TENANT)
    assert (await client.post("/conversations/c/runs", json={"prompts": ["x"]})).status_code == 201


async def test_concurrent_runs_refuse_while_the_tenants_runs_hold_their_places(
    app_factory: Any, make_settings: Any
) -> None:
    import asyncio

    from ..fakes.gated import GatedProvider, gated_pool

    gate = GatedProvider(hold=lambda prompt: prompt.startswith("held"))
    async with app_factory(agents=gated_pool(make_settings(), gate)) as client:
        try:
            await quotas(client).set(TENANT, concurrent_runs=1)
            for conv in ("a", "b"):
                await client.post("/conversations", json={"id": conv})
            running = asyncio.create_task(
                client.post("/conversations/a/runs", json={"prompts": ["held"]})
            )
            await gate.arrival("held")
            refused = await client.post("/conversations/b/runs", json={"prompts": ["x"]})
            problem = assert_problem(refused, 429, "quota-exceeded")
            assert (problem["limit"], problem["used"]) == ("concurrent_runs", 1)
            assert refused.headers["ratelimit"] == '"concurrent-runs";r=0;t=1'
            assert (await client.get("/usage")).json()["quota"]["running"] == 1
            gate.release_all()
            assert (await running).status_code == 201
            ran = await client.post("/conversations/b/runs", json={"prompts": ["x"]})
            assert ran.status_code == 201
        finally:
            gate.open()
