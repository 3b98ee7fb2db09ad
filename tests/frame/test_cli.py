"""The ``carryover`` command: arguments, the loopback guard, serve, migrate and openapi."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from app import cli
from app.api.handlers import install_problem_handlers
from app.api.problems import problem_responses
from app.cli import APP_FACTORY, build_parser, main, openapi_json

from .live_server import live_server


class Calls:
    def __init__(self) -> None:
        self.upgrades: list[str] = []
        self.downgrades: list[tuple[str, str]] = []
        self.served: list[dict[str, Any]] = []
        self.db_keys = 0  # active API keys the (unmigrated, fake) database holds


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    """Record migrations and the server's configuration instead of migrating and serving (the
    server "listens" at once); the database holds ``calls.db_keys`` API keys."""
    recorded = Calls()

    async def upgrade(url: str) -> None:
        recorded.upgrades.append(url)

    async def downgrade(url: str, revision: str) -> None:
        recorded.downgrades.append((url, revision))

    def run_server(config: uvicorn.Config, on_listening: Callable[[], None]) -> bool:
        recorded.served.append(
            {
                "app": config.app,
                "factory": config.factory,
                "host": config.host,
                "port": config.port,
                "workers": config.workers,
                "log_config": config.log_config,
                "metrics_dir": os.environ.get("PROMETHEUS_MULTIPROC_DIR"),
            }
        )
        on_listening()
        return True

    async def active_key_count(url: str) -> int:
        return recorded.db_keys

    monkeypatch.setattr("app.store.migrate.upgrade", upgrade)
    monkeypatch.setattr("app.store.migrate.downgrade", downgrade)
    monkeypatch.setattr("app.store.keys.active_key_count", active_key_count)
    monkeypatch.setattr(cli.serve, "run_server", run_server)
    return recorded


# --- arguments -------------------------------------------------------------------------------


def test_serve_arguments() -> None:
    argv = ["serve", "--host", "0.0.0.0", "--port", "9000", "--workers", "3"]
    args = build_parser().parse_args(argv)
    assert (args.command, args.host, args.port, args.workers) == ("serve", "0.0.0.0", 9000, 3)
    args = build_parser().parse_args(["serve"])
    assert (args.host, args.port, args.workers) == (None, None, None)


def test_migrate_and_openapi_arguments() -> None:
    assert build_parser().parse_args(["migrate"]).downgrade is None
    assert build_parser().parse_args(["migrate", "--downgrade", "base"]).downgrade == "base"
    args = build_parser().parse_args(["openapi"])
    assert (args.output, args.check) == (Path("openapi/openapi.json"), False)
    assert build_parser().parse_args(["openapi", "-o", "-", "--check"]).check is True


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["bogus"],
        ["serve", "--port", "0"],
        ["serve", "--port", "x"],
        ["serve", "--workers", "0"],
        ["serve", "--reload"],
    ],
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "usage: carryover" in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("carryover ")


# --- serve -----------------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3"])
def test_serve_refuses_a_public_host_without_api_keys(
    host: str, calls: Calls, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--host", host]) == 2
    err = capsys.readouterr().err
    assert f"refusing to listen on '{host}' without authentication" in err
    assert "CARRYOVER_API_KEYS" in err and "CARRYOVER_ALLOW_UNAUTHENTICATED_PUBLIC" in err
    assert calls.upgrades == [] and calls.served == []


def test_serve_refuses_a_public_host_from_the_environment_too(
    monkeypatch: pytest.MonkeyPatch, calls: Calls
) -> None:
    monkeypatch.setenv("CARRYOVER_HOST", "0.0.0.0")
    assert main(["serve"]) == 2
    assert calls.served == []


def test_serve_migrates_then_runs_the_app_factory(
    monkeypatch: pytest.MonkeyPatch, calls: Calls, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CARRYOVER_DATABASE_URL", "postgresql://carryover:hunter22@db/carryover")
    assert main(["serve", "--port", "8123"]) == 0
    assert calls.upgrades == ["postgresql://carryover:hunter22@db/carryover"]
    [served] = calls.served
    assert served["app"] == APP_FACTORY == "app.api.app:create_app"
    assert served["factory"] is True
    assert (served["host"], served["port"], served["workers"]) == ("127.0.0.1", 8123, 1)
    assert served["log_config"]["filters"]["redact"]["secrets"] == ["hunter22"]
    out = capsys.readouterr().out
    assert "listening on http://127.0.0.1:8123 (1 worker)" in out
    assert "agent profile 'default': provider echo, model echo" in out
    assert "database: postgresql://carryover:***@db/carryover" in out
    assert "no API keys configured: no authentication, loopback only" in out
    assert "hunter22" not in out


def test_serve_on_a_public_host_with_api_keys(
    monkeypatch: pytest.MonkeyPatch, calls: Calls, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CARRYOVER_API_KEYS", "acme:key-acme-1-0123456,globex:key-globex-1-01234")
    monkeypatch.setenv("CARRYOVER_PROVIDER", "anthropic")
    monkeypatch.setenv("CARRYOVER_MODEL", "claude-x")
    assert main(["serve", "--host", "0.0.0.0"]) == 0
    assert calls.served[0]["host"] == "0.0.0.0"
    out = capsys.readouterr().out
    assert "listening on http://0.0.0.0:8000" in out
    assert "provider anthropic, model claude-x" in out
    assert "API keys for 2 tenant(s)" in out
    assert "key-acme-1" not in out


def test_serve_on_a_public_host_with_the_explicit_flag(
    monkeypatch: pytest.MonkeyPatch, calls: Calls, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CARRYOVER_ALLOW_UNAUTHENTICATED_PUBLIC", "true")
    assert main(["serve", "--host", "::"]) == 0
    out = capsys.readouterr().out
    assert "listening on http://[::]:8000" in out
    assert "NO authentication" in out


def test_serve_with_workers_aggregates_metrics_across_processes(calls: Calls) -> None:
    assert main(["serve", "--workers", "2"]) == 0
    metrics_dir = calls.served[0]["metrics_dir"]
    assert calls.served[0]["workers"] == 2
    assert metrics_dir and not Path(metrics_dir).exists()  # removed after the server stops
    assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ


def test_serve_reports_invalid_configuration(
    monkeypatch: pytest.MonkeyPatch, calls: Calls, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CARRYOVER_COMPACT_AT", "1.5")
    monkeypatch.setenv("CARRYOVER_PROVIDER", "nope")
    assert main(["serve"]) == 2
    err = capsys.readouterr().err
    assert "invalid configuration" in err
    assert "CARRYOVER_COMPACT_AT='1.5': CARRYOVER_COMPACT_AT is a share of the context" in err
    assert "CARRYOVER_PROVIDER='nope': unknown provider 'nope'" in err
    assert calls.served == []


def test_serve_stops_when_migration_fails(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async def upgrade(url: str) -> None:
        raise OSError("connection refused for password hunter22")

    served: list[object] = []
    monkeypatch.setattr("app.store.migrate.upgrade", upgrade)
    monkeypatch.setattr(cli.serve, "run_server", lambda config, on_listening: served.append(config))
    monkeypatch.setenv("CARRYOVER_DATABASE_URL", "postgresql://u:hunter22@127.0.0.1:1/x")
    assert main(["serve"]) == 1
    err = capsys.readouterr().err
    assert "migrating postgresql://u:***@127.0.0.1:1/x failed: connection refused" in err
    assert "hunter22" not in err
    assert served == []


# --- migrate ---------------------------------------------------------------------------------


def test_migrate_upgrades_and_downgrades_a_real_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "carryover.db"
    monkeypatch.setenv("CARRYOVER_DATABASE_URL", f"sqlite:///{path}")

    def tables() -> set[str]:
        with sqlite3.connect(path) as conn:
            rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            return {name for (name,) in rows} - {"alembic_version"}

    assert main(["migrate"]) == 0
    assert "conversations" in tables()
    assert main(["migrate"]) == 0  # already at head: nothing to do
    assert main(["migrate", "--downgrade", "base"]) == 0
    assert tables() == set()
    out = capsys.readouterr().out
    assert f"migrated sqlite:///{path} to head" in out
    assert f"migrated sqlite:///{path} down to base" in out


def test_migrate_downgrade_passes_the_revision(calls: Calls) -> None:
    assert main(["migrate", "--downgrade", "0001"]) == 0
    assert calls.downgrades == [("sqlite:///./carryover.db", "0001")]
    assert calls.upgrades == []


# --- openapi ---------------------------------------------------------------------------------


def tiny_app() -> FastAPI:
    app = FastAPI(title="Carryover")
    install_problem_handlers(app)

    @app.get("/conversations/{conversation_id}", responses=problem_responses(404))
    async def get(conversation_id: str) -> dict[str, str]:
        return {"id": conversation_id}

    return app


@pytest.fixture
def app_factory(monkeypatch: pytest.MonkeyPatch) -> FastAPI:
    app = tiny_app()
    monkeypatch.setattr(cli, "load_app", lambda: app)
    return app


def test_openapi_writes_stable_sorted_json(
    tmp_path: Path, app_factory: FastAPI, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "openapi" / "openapi.json"
    assert main(["openapi", "--output", str(output)]) == 0
    text = output.read_text(encoding="utf-8")
    assert text == openapi_json(app_factory.openapi())
    assert text.endswith("}\n") and not text.endswith("\n\n")
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    assert json.loads(text)["paths"]["/conversations/{conversation_id}"]
    assert main(["openapi", "--output", str(output), "--check"]) == 0
    assert "is up to date" in capsys.readouterr().out


def test_openapi_check_fails_when_the_file_is_stale(
    tmp_path: Path, app_factory: FastAPI, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "openapi.json"
    assert main(["openapi", "--output", str(output), "--check"]) == 1
    output.write_text("{}\n", encoding="utf-8")
    assert main(["openapi", "--output", str(output), "--check"]) == 1
    assert output.read_text(encoding="utf-8") == "{}\n"  # --check never writes
    assert "is not what the app serves" in capsys.readouterr().err


def test_openapi_to_stdout(app_factory: FastAPI, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["openapi", "-o", "-"]) == 0
    assert capsys.readouterr().out == openapi_json(app_factory.openapi())


def test_openapi_without_the_app_factory(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "APP_FACTORY", "app.no_such_module:create_app")
    assert main(["openapi", "-o", "-"]) == 1
    assert "app.no_such_module:create_app does not exist" in capsys.readouterr().err


# --- a real server ---------------------------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [1, 2])
def test_serve_says_listening_only_once_the_port_accepts_connections(
    tmp_path: Path, workers: int
) -> None:
    with live_server(tmp_path, "--workers", str(workers)) as server:
        line = server.read_until(lambda text: "listening on" in text)
        # at the moment the line is out, the port takes a connection (no retry, no wait)
        socket.create_connection(("127.0.0.1", server.port), timeout=30).close()
        assert f"listening on {server.url} ({workers} worker" in line
        with httpx.Client(base_url=server.url, timeout=30) as client:
            assert client.get("/healthz").status_code == 200
        out, err = server.stop()
    assert out.startswith("Carryover ")
    assert "database: sqlite:///" in out
    assert server.process.returncode == 0, err


@pytest.mark.timeout(120)
def test_serve_says_nothing_of_listening_when_the_port_is_taken(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with live_server(tmp_path, port=port) as server:
            out, err = server.wait()
    assert "listening" not in out
    assert "address already in use" in err.lower()
    assert server.process.returncode not in (0, None)
