"""Metrics in their own registry with bounded labels; logs with secrets redacted, and with
``CARRYOVER_LOG_FORMAT=json`` nothing but JSON lines from a real server."""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path
from typing import Any

import httpx
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

from .live_server import live_server


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
    assert (
        global_registry.get_sample_value(
            "carryover_runs_total", {"status": "completed", "agent": "default"}
        )
        is None
    )


def test_each_observation_counts_under_its_labels() -> None:
    attempts = "carryover_provider_attempts_total"
    before = {
        "run": sample("carryover_runs_total", status="failed", agent="default"),
        "attempt": sample(attempts, provider="openai", outcome="overflow"),
        "tool": sample("carryover_tool_calls_total", tool="time_now", outcome="ok"),
        "compaction": sample("carryover_compactions_total", reason="overflow"),
    }
    observe_run("failed", 2.0)
    observe_provider_attempt("openai", "overflow")
    observe_tool_call("time_now", "ok")
    observe_compaction("overflow")
    assert sample("carryover_runs_total", status="failed", agent="default") == before["run"] + 1
    assert sample(attempts, provider="openai", outcome="overflow") == before["attempt"] + 1
    assert sample("carryover_tool_calls_total", tool="time_now", outcome="ok") == before["tool"] + 1
    assert sample("carryover_compactions_total", reason="overflow") == before["compaction"] + 1


def test_unexpected_label_values_fold_into_other() -> None:
    before = sample("carryover_runs_total", status="other", agent="default")
    observe_run("conversation-c-123", 1.0)
    observe_provider_attempt("sk-secret-provider", "weird")
    observe_compaction("because")
    observe_http("BREW", "/x", 200, 0.1)
    assert sample("carryover_runs_total", status="other", agent="default") == before + 1
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


def test_json_logs_carry_no_colour_codes_and_give_access_lines_their_fields(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging("INFO", "json", [SECRET])
    logging.getLogger("uvicorn.error").info(
        "Started server process [%d]", 42, extra={"color_message": "Started [\x1b[36m%d\x1b[0m]"}
    )
    logging.getLogger("uvicorn.access").info(
        '%s - "%s %s HTTP/%s" %d', "127.0.0.1:5000", "GET", f"/x?key={SECRET}", "1.1", 404
    )
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\\u001b" not in err
    started, access = (json.loads(line) for line in err.splitlines())
    assert started["message"] == "Started server process [42]"
    assert "color_message" not in started
    assert access["message"] == '127.0.0.1:5000 - "GET /x?key=[REDACTED] HTTP/1.1" 404'
    assert {name: access[name] for name in observability.ACCESS_FIELDS} == {
        "client": "127.0.0.1:5000",
        "method": "GET",
        "path": "/x?key=[REDACTED]",
        "http_version": "1.1",
        "status": 404,
    }


def test_banner_line_is_the_text_or_one_json_record() -> None:
    assert observability.banner_line("hello\n  world") == "hello\n  world"
    line = observability.banner_line("hello", "json", logger="carryover.serve", url="http://x")
    assert "\n" not in line
    entry = json.loads(line)
    assert (entry["message"], entry["logger"], entry["level"]) == (
        "hello",
        "carryover.serve",
        "INFO",
    )
    assert entry["url"] == "http://x"


def _json_lines(text: str) -> list[dict[str, Any]]:
    entries = []
    for line in text.splitlines():
        entry = json.loads(line)  # every line, not only most
        assert isinstance(entry, dict) and {"time", "level", "logger", "message"} <= set(entry)
        entries.append(entry)
    return entries


@pytest.mark.timeout(120)
def test_serve_with_json_logs_prints_only_json_lines(tmp_path: Path) -> None:
    with live_server(tmp_path, CARRYOVER_LOG_FORMAT="json") as server:
        banner = json.loads(server.read_until(lambda line: "listening on" in line))
        with httpx.Client(base_url=server.url, timeout=30) as client:
            assert client.get("/healthz").status_code == 200
            assert client.get("/no/such/route").status_code == 404
            created = client.post("/conversations", json={"id": "json-logs"})
            assert created.status_code == 201
            bad = client.post(
                "/conversations/json-logs/runs",
                content=b"{not json",
                headers={"Content-Type": "application/json"},
            )
            assert 400 <= bad.status_code < 500
            run = client.post("/conversations/json-logs/runs", json={"prompts": ["/fail"]})
            assert run.json()["status"] == "failed"
        out, err = server.stop()
    assert "\x1b" not in out + err and "\\u001b" not in out + err
    stdout, stderr = _json_lines(out), _json_lines(err)
    assert stdout[0] == banner
    assert banner["url"] == server.url and banner["database"].startswith("sqlite:///")
    assert banner["message"].startswith("Carryover ")
    messages = [entry["message"] for entry in stderr]
    assert any(m.startswith("Uvicorn running on") for m in messages)
    assert "Application startup complete." in messages
    assert any(m.startswith("Finished server process") for m in messages)
    access = [e for e in stderr if e["logger"] == "uvicorn.access"]
    assert [(e["method"], e["path"], e["status"]) for e in access] == [
        ("GET", "/healthz", 200),
        ("GET", "/no/such/route", 404),
        ("POST", "/conversations", 201),
        ("POST", "/conversations/json-logs/runs", bad.status_code),
        ("POST", "/conversations/json-logs/runs", 201),
    ]


@pytest.mark.timeout(120)
def test_serve_with_json_logs_reports_a_failed_start_in_json(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with live_server(tmp_path, port=port, CARRYOVER_LOG_FORMAT="json") as server:
            out, err = server.wait()
    assert server.process.returncode not in (0, None)
    entries = _json_lines(out) + _json_lines(err)
    errors = [e["message"] for e in entries if e["level"] == "ERROR"]
    assert any("address already in use" in m.lower() for m in errors), entries
