"""Metrics in their own registry with bounded labels; logs with secrets redacted."""

from __future__ import annotations

import json
import logging

import prometheus_client
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app import observability
from app.observability import (
    REGISTRY,
    MetricsMiddleware,
    RedactSecrets,
    configure_logging,
    observe_compaction,
    observe_http,
    observe_provider_attempt,
    observe_run,
    observe_tool_call,
    render_metrics,
)


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_render_metrics_is_prometheus_text() -> None:
    observe_run("completed", 0.3)
    body, content_type = render_metrics()
    assert content_type.startswith("text/plain")
    text = body.decode()
    for name in (
        "carryover_runs_total",
        "carryover_run_duration_seconds_bucket",
        "carryover_runs_in_progress",
        "# TYPE carryover_provider_attempts_total counter",
        "# TYPE carryover_tool_calls_total counter",
        "# TYPE carryover_compactions_total counter",
        "# TYPE carryover_http_requests_total counter",
        "# TYPE carryover_http_request_duration_seconds histogram",
    ):
        assert name in text


def test_metrics_do_not_use_the_global_registry() -> None:
    observe_run("completed", 0.1)
    global_registry = prometheus_client.REGISTRY
    assert global_registry.get_sample_value("carryover_runs_total", {"status": "completed"}) is None


def test_each_observation_counts_under_its_labels() -> None:
    attempts = "carryover_provider_attempts_total"
    before = {
        "run": sample("carryover_runs_total", status="failed"),
        "attempt": sample(attempts, provider="openai", outcome="overflow"),
        "tool": sample("carryover_tool_calls_total", tool="time_now", outcome="ok"),
        "compaction": sample("carryover_compactions_total", reason="overflow"),
    }
    observe_run("failed", 2.0)
    observe_provider_attempt("openai", "overflow")
    observe_tool_call("time_now", "ok")
    observe_compaction("overflow")
    assert sample("carryover_runs_total", status="failed") == before["run"] + 1
    assert sample(attempts, provider="openai", outcome="overflow") == before["attempt"] + 1
    assert sample("carryover_tool_calls_total", tool="time_now", outcome="ok") == before["tool"] + 1
    assert sample("carryover_compactions_total", reason="overflow") == before["compaction"] + 1


def test_unexpected_label_values_fold_into_other() -> None:
    before = sample("carryover_runs_total", status="other")
    observe_run("conversation-c-123", 1.0)
    observe_provider_attempt("sk-secret-provider", "weird")
    observe_compaction("because")
    observe_http("BREW", "/x", 200, 0.1)
    assert sample("carryover_runs_total", status="other") == before + 1
    text = render_metrics()[0].decode()
    for value in ("conversation-c-123", "sk-secret-provider", "weird", "because", "BREW"):
        assert value not in text


def test_tool_labels_are_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(observability, "_tool_labels", set())
    monkeypatch.setattr(observability, "MAX_TOOL_LABELS", 2)
    for name in ("a_tool", "b_tool", "c_tool", "with spaces"):
        observe_tool_call(name, "ok")
    text = render_metrics()[0].decode()
    assert 'tool="a_tool"' in text and 'tool="b_tool"' in text
    assert 'tool="c_tool"' not in text and "with spaces" not in text


def test_http_requests_are_counted_by_route_template() -> None:
    app = FastAPI()
    app.add_middleware(MetricsMiddleware)

    @app.get("/conversations/{conversation_id}")
    async def get(conversation_id: str) -> dict[str, str]:
        return {"id": conversation_id}

    @app.get("/crash")
    async def crash() -> None:
        raise RuntimeError("boom")

    def count(route: str, status: str) -> float:
        return sample("carryover_http_requests_total", method="GET", route=route, status=status)

    template = "/conversations/{conversation_id}"
    before = (count(template, "200"), count("<unmatched>", "404"), count("/crash", "500"))
    client = TestClient(app, raise_server_exceptions=False)
    assert client.get("/conversations/private-conversation-77").status_code == 200
    assert client.get("/random/probe/path").status_code == 404
    assert client.get("/crash").status_code == 500
    after = (count(template, "200"), count("<unmatched>", "404"), count("/crash", "500"))
    assert after == tuple(n + 1 for n in before)
    text = render_metrics()[0].decode()
    assert "private-conversation-77" not in text and "/random/probe" not in text


# --- logging ---------------------------------------------------------------------------------

SECRET = "sk-live-0123456789"


def test_json_logs_redact_secrets_everywhere(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("INFO", "json", [SECRET, "tenant-key-42"])
    log = logging.getLogger("carryover.test")
    log.info("calling with %s", SECRET, extra={"header": f"Bearer {SECRET}", "count": 3})
    try:
        raise ValueError(f"refused key {SECRET}")
    except ValueError:
        log.exception("provider said no")
    log.debug("not shown at INFO")
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [entry["message"] for entry in lines] == ["calling with [REDACTED]", "provider said no"]
    assert lines[0]["header"] == "Bearer [REDACTED]"
    assert lines[0]["count"] == 3
    assert (lines[0]["level"], lines[0]["logger"]) == ("INFO", "carryover.test")
    assert "refused key [REDACTED]" in lines[1]["exception"]
    assert SECRET not in json.dumps(lines)


def test_text_logs_redact_secrets(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("WARNING", "text", [SECRET])
    logging.getLogger("uvicorn.error").warning("key %s leaked", SECRET)
    err = capsys.readouterr().err
    assert "uvicorn.error: key [REDACTED] leaked" in err
    assert SECRET not in err


def test_short_values_are_not_treated_as_secrets() -> None:
    redact = RedactSecrets(["abc", SECRET])
    assert redact.redact(f"abc {SECRET}") == "abc [REDACTED]"
    assert RedactSecrets().redact(SECRET) == SECRET
