"""Liveness, readiness and metrics through HTTP (contract §4): ``/healthz`` says the process is up,
``/readyz`` whether the database answers with its schema at head, ``/metrics`` is Prometheus
text that counts what the service did."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from app.config import Settings
from app.store.migrate import head_revision

from .conftest import AppClient, start_client


def sample(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` with these labels in a Prometheus exposition, whatever
    their other labels (0 when absent): another test of this process may have added a series
    with the same status and another agent."""
    return sum(
        float(found.value)
        for family in text_string_to_metric_families(text)
        for found in family.samples
        if found.name == name and all(found.labels.get(k) == v for k, v in labels.items())
    )


async def test_healthz(client: AppClient) -> None:
    got = await client.get("/healthz")
    assert got.status_code == 200
    assert got.json() == {"status": "ok"}


async def test_readyz_when_the_database_is_at_head(client: AppClient) -> None:
    got = await client.get("/readyz")
    assert got.status_code == 200
    assert got.json() == {
        "status": "ready",
        "database": True,
        "schema_revision": head_revision(),
        "expected_revision": head_revision(),
        "profiles": {"default": {"ready": True, "reason": None}},
        "unready_profiles": {},
    }


async def test_readyz_is_503_on_a_database_without_the_schema(empty_database_url: str) -> None:
    app, client = await start_client(Settings(database_url=empty_database_url))
    async with app.router.lifespan_context(app), client:
        assert (await client.get("/healthz")).status_code == 200  # alive, but not ready
        got = await client.get("/readyz")
        assert got.status_code == 503
        assert got.json() == {
            "status": "not_ready",
            "database": True,
            "schema_revision": None,
            "expected_revision": head_revision(),
            "profiles": {"default": {"ready": True, "reason": None}},
            "unready_profiles": {},
        }


async def test_readyz_is_503_when_the_database_is_unreachable(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-directory" / "carryover.db"
    app, client = await start_client(Settings(database_url=f"sqlite:///{missing}"))
    async with app.router.lifespan_context(app), client:
        assert (await client.get("/healthz")).status_code == 200
        got = await client.get("/readyz")
        assert got.status_code == 503
        assert got.json()["status"] == "not_ready"
        assert got.json()["database"] is False and got.json()["schema_revision"] is None


async def test_metrics_count_requests_and_runs(client: AppClient) -> None:
    before = (await client.get("/metrics")).text
    await client.post("/conversations", json={"id": "m"})
    await client.post("/conversations/m/runs", json={"prompts": ["hi"]})
    await client.post("/conversations/m/runs", json={"prompts": ["/fail"]})
    await client.get("/conversations/unknown-id-xyz")

    got = await client.get("/metrics")
    assert got.status_code == 200
    assert got.headers["content-type"].startswith("text/plain")
    after = got.text

    def grew(name: str, **labels: str) -> float:
        return sample(after, name, **labels) - sample(before, name, **labels)

    runs_route = "/conversations/{conversation_id}/runs"
    assert grew("carryover_http_requests_total", method="POST", route=runs_route, status="201") == 2
    assert (
        grew(
            "carryover_http_requests_total",
            method="GET",
            route="/conversations/{conversation_id}",
            status="404",
        )
        == 1
    )
    assert grew("carryover_runs_total", status="completed") >= 1
    assert grew("carryover_runs_total", status="failed") >= 1
    assert grew("carryover_provider_attempts_total", provider="echo", outcome="fatal") >= 1
    # labels are route templates, never ids
    assert "unknown-id-xyz" not in after and '"m"' not in after
