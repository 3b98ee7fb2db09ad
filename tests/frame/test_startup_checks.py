"""Configuration that fails at start (docs/operations.md "Checking the configuration"): real
``carryover serve`` subprocesses. A broken tool path, profile or key stops the server with exit
status 2 and a message naming the variable (or TOML key) and the value, before the port is
bound; a profile whose key variable is unset starts, and ``/readyz`` reports it unready; an
unknown ``CARRYOVER_*`` variable is warned about with the closest known name."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from ..helpers import until
from ..lifecycle.harness import Server, free_port, server_env

#: a hang guard only: a refused start exits long before
EXIT_GUARD_SECONDS = 60


def refused_start(tmp_path: Path, **settings: object) -> tuple[int, str, bool]:
    """Run ``carryover serve`` and return its exit status, its stderr, and whether the port was
    bound meanwhile (it is held by a probe socket if free)."""
    port = free_port()
    env = server_env(f"sqlite:///{tmp_path / 'carryover.db'}", port, log_level="INFO")
    for name, value in settings.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = str(value)
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=EXIT_GUARD_SECONDS,
    )
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        bound_after = probe.connect_ex(("127.0.0.1", port)) == 0
    return done.returncode, done.stderr, bound_after


def profiles_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agents.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_tool_path_that_does_not_import_stops_serve(tmp_path: Path) -> None:
    status, err, bound = refused_start(tmp_path, CARRYOVER_TOOLS="myproject.tools:search")
    assert status == 2, err
    assert "CARRYOVER_TOOLS='myproject.tools:search'" in err
    assert "No module named 'myproject'" in err
    assert "listening" not in err and not bound
    assert not (tmp_path / "carryover.db").exists()  # stopped before migrating


def test_a_tool_that_is_not_an_async_function_stops_serve(tmp_path: Path) -> None:
    status, err, _ = refused_start(tmp_path, CARRYOVER_TOOLS="os.path:join")
    assert status == 2, err
    assert "CARRYOVER_TOOLS='os.path:join'" in err and "must be an async function" in err


def test_a_profile_of_the_toml_file_with_a_missing_tool_stops_serve(tmp_path: Path) -> None:
    path = profiles_file(
        tmp_path,
        '[agents.local]\nprovider = "openai"\nmodel = "m"\nbase_url = "http://127.0.0.1:9/v1"\n'
        'tools = ["app.agent.builtin_tools:no_such_tool"]\n',
    )
    status, err, _ = refused_start(tmp_path, CARRYOVER_CONFIG_FILE=path)
    assert status == 2, err
    assert f"config file {str(path)!r}: agents.local.tools=" in err
    assert "'app.agent.builtin_tools:no_such_tool'" in err


def test_an_unknown_provider_in_the_toml_file_names_the_key(tmp_path: Path) -> None:
    path = profiles_file(tmp_path, '[agents.x]\nprovider = "gemini"\nmodel = "m"\n')
    status, err, _ = refused_start(tmp_path, CARRYOVER_CONFIG_FILE=path)
    assert status == 2, err
    assert "agents.x.provider: unknown provider 'gemini'" in err


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("CARRYOVER_PORT", "eighty", "CARRYOVER_PORT='eighty': Input should be a valid integer"),
        ("CARRYOVER_PROVIDER", "nope", "CARRYOVER_PROVIDER='nope': unknown provider 'nope'"),
        (
            "CARRYOVER_COMPACT_AT",
            "1.5",
            "CARRYOVER_COMPACT_AT='1.5': CARRYOVER_COMPACT_AT is a share",
        ),
        ("CARRYOVER_LOG_FORMAT", "xml", "CARRYOVER_LOG_FORMAT='xml': Input should be 'text'"),
    ],
)
def test_an_invalid_value_names_the_variable_and_the_value(
    tmp_path: Path, variable: str, value: str, says: str
) -> None:
    status, err, _ = refused_start(tmp_path, **{variable: value})
    assert status == 2, err
    assert says in err


def test_an_unknown_trace_exporter_stops_serve(tmp_path: Path) -> None:
    status, err, _ = refused_start(tmp_path, OTEL_TRACES_EXPORTER="jaeger")
    assert status == 2, err
    assert "OTEL_TRACES_EXPORTER='jaeger'" in err


def test_a_rule_across_settings_names_the_variables(tmp_path: Path) -> None:
    status, err, _ = refused_start(
        tmp_path, CARRYOVER_DEFAULT_PAGE_SIZE="300", CARRYOVER_MAX_PAGE_SIZE="100"
    )
    assert status == 2, err
    assert "CARRYOVER_DEFAULT_PAGE_SIZE (300) must not exceed CARRYOVER_MAX_PAGE_SIZE" in err


def test_a_broken_key_stops_serve_without_showing_it(tmp_path: Path) -> None:
    status, err, _ = refused_start(
        tmp_path,
        CARRYOVER_PROVIDER="openai",
        CARRYOVER_MODEL="m",
        CARRYOVER_API_KEY_ENV="MY_KEY",
        MY_KEY="sk-abc def-secret",
    )
    assert status == 2, err
    assert "MY_KEY=" in err and "'default'" in err and "whitespace" in err
    assert "sk-abc" not in err and "def-secret" not in err


def test_a_secret_that_does_not_validate_is_not_shown(tmp_path: Path) -> None:
    status, err, _ = refused_start(tmp_path, CARRYOVER_API_KEYS="acme:k1,no-colon-hunter22")
    assert status == 2, err
    assert "CARRYOVER_API_KEYS='**********'" in err
    assert "hunter22" not in err and "k1" not in err


async def test_an_unset_key_variable_is_reported_by_readyz_for_its_profile_only(
    tmp_path: Path,
) -> None:
    path = profiles_file(
        tmp_path,
        '[agents.claude]\nprovider = "anthropic"\nmodel = "claude-x"\n'
        'api_key_env = "CLAUDE_KEY_NOT_SET"\n',
    )
    port = free_port()
    env = server_env(
        f"sqlite:///{tmp_path / 'carryover.db'}",
        port,
        config_file=path,
        log_level="INFO",
        log_format="json",
    )
    env["CARRYOVER_PROVIDR"] = "openai"  # misspelt: warned about, ignored
    env.pop("CLAUDE_KEY_NOT_SET", None)
    server = Server("unready", port, env, tmp_path / "server.log")
    server.spawn()
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=2.0) as http:

            async def alive() -> httpx.Response | None:
                assert server.proc is not None and server.proc.poll() is None, server.log()
                try:
                    got = await http.get("/healthz")
                except httpx.TransportError:
                    return None
                return got if got.status_code == 200 else None

            await until(alive, what="the server answers", within=60)
            got = await http.get("/readyz")
        # the default profile runs: the server stays ready, the profile says why it cannot
        assert got.status_code == 200
        body = got.json()
        assert body["status"] == "ready" and body["database"] is True
        why = "its anthropic key variable CLAUDE_KEY_NOT_SET is not set"
        assert body["profiles"] == {
            "claude": {"ready": False, "reason": why},
            "default": {"ready": True, "reason": None},
        }
        assert body["unready_profiles"] == {"claude": why}
        log = server.log_path.read_text(errors="replace")  # whole: migrations log lines too
        lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
        messages = [line["message"] for line in lines if line["level"] == "WARNING"]
        assert (
            "unknown variable CARRYOVER_PROVIDR is ignored; did you mean CARRYOVER_PROVIDER?"
            in messages
        )
        assert any("'claude' cannot run" in m and "CLAUDE_KEY_NOT_SET" in m for m in messages)
    finally:
        server.stop()


def test_config_prints_values_masked_with_their_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.cli import main
    from app.config import get_settings

    path = profiles_file(
        tmp_path,
        '[agents.local]\nprovider = "openai"\nmodel = "llama"\n'
        'base_url = "http://127.0.0.1:9/v1"\napi_key_env = "LOCAL_KEY"\n',
    )
    for name in [n for n in os.environ if n.startswith("CARRYOVER_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("CARRYOVER_CONFIG_FILE", str(path))
    monkeypatch.setenv("CARRYOVER_DATABASE_URL", "postgresql://u:hunter22@127.0.0.1/x")
    monkeypatch.setenv("CARRYOVER_API_KEYS", "acme:sekrit-key-1-0123456789")
    monkeypatch.setenv("LOCAL_KEY", "sk-local-secret")
    monkeypatch.setenv("CARRYOVER_LEASE_SECOND", "3")
    get_settings.cache_clear()
    try:
        assert main(["config", "--json"]) == 0
    finally:
        get_settings.cache_clear()
    out = capsys.readouterr().out
    assert "hunter22" not in out and "sekrit" not in out and "sk-local" not in out
    document = json.loads(out)
    rows = {row["name"]: (row["value"], row["source"]) for row in document["settings"]}
    assert rows["CARRYOVER_DATABASE_URL"] == ("postgresql://u:***@127.0.0.1/x", "env")
    assert rows["CARRYOVER_API_KEYS"][1] == "env" and "acme" in rows["CARRYOVER_API_KEYS"][0]
    assert rows["CARRYOVER_LEASE_SECONDS"] == ("5.0", "default")
    assert rows["agents.local.model"] == ("llama", "toml")
    assert rows["agents.local.max_turns"] == ("32", "default")
    assert rows["agents.local.api_key"] == ("********** (from LOCAL_KEY)", "env")
    assert document["warnings"] == [
        "unknown variable CARRYOVER_LEASE_SECOND is ignored; did you mean CARRYOVER_LEASE_SECONDS?"
    ]
    assert document["errors"] == [] and document["unready_profiles"] == {}


def test_config_exits_2_on_what_serve_would_refuse(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.cli import main
    from app.config import get_settings

    monkeypatch.setenv("CARRYOVER_TOOLS", "myproject.tools:search")
    get_settings.cache_clear()
    try:
        assert main(["config"]) == 2
    finally:
        get_settings.cache_clear()
    captured = capsys.readouterr()
    assert "agents.default.tools" in captured.out and "myproject.tools:search" in captured.out
    assert "CARRYOVER_TOOLS='myproject.tools:search'" in captured.err
