"""The run metrics through the app (docs/operations.md "Metrics"): runs by status and agent,
run and provider-request durations, tokens by kind; labels stay low-cardinality."""

from __future__ import annotations

from app.observability import REGISTRY, observe_quota_refusal

from .conftest import AppClient


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_a_tool_run_counts_its_run_requests_and_tokens(client: AppClient) -> None:
    runs = ("carryover_runs_total", {"status": "completed", "agent": "default"})
    durations = ("carryover_run_duration_seconds_count", runs[1])
    requests = (
        "carryover_provider_request_duration_seconds_count",
        {"provider": "echo", "outcome": "ok"},
    )
    tokens = {
        kind: ("carryover_tokens_total", {"provider": "echo", "kind": kind})
        for kind in ("input", "output")
    }
    before = {
        key: value(n, **labels)
        for key, (n, labels) in {
            "runs": runs,
            "durations": durations,
            "requests": requests,
            **tokens,
        }.items()
    }
    await client.post("/conversations", json={"id": "c"})
    ran = (
        await client.post("/conversations/c/runs", json={"prompts": ['/tool wait {"seconds": 0}']})
    ).json()
    assert ran["status"] == "completed"
    assert value(runs[0], **runs[1]) == before["runs"] + 1
    assert value(durations[0], **durations[1]) == before["durations"] + 1
    assert value(requests[0], **requests[1]) == before["requests"] + 2  # tool call, answer
    assert value(*tokens["input"][:1], **tokens["input"][1]) == (
        before["input"] + ran["usage"]["input_tokens"]
    )
    assert value(*tokens["output"][:1], **tokens["output"][1]) == (
        before["output"] + ran["usage"]["output_tokens"]
    )
    text = (await client.get("/metrics")).text
    assert ran["run_id"] not in text and 'conversation_id="' not in text


async def test_a_failed_request_is_timed_under_its_error_kind(client: AppClient) -> None:
    labels = {"provider": "echo", "outcome": "fatal"}
    before = value("carryover_provider_request_duration_seconds_count", **labels)
    await client.post("/conversations", json={"id": "c"})
    await client.post("/conversations/c/runs", json={"prompts": ["/fail"]})
    assert value("carryover_provider_request_duration_seconds_count", **labels) == before + 1
    assert value("carryover_runs_total", status="failed", agent="default") >= 1


def test_quota_refusals_fold_unknown_limits() -> None:
    before = value("carryover_quota_refusals_total", limit="runs_per_minute")
    observe_quota_refusal("runs_per_minute")
    observe_quota_refusal("tenant-acme")
    assert value("carryover_quota_refusals_total", limit="runs_per_minute") == before + 1
    assert value("carryover_quota_refusals_total", limit="tenant-acme") == 0
