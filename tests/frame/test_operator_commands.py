"""What a newcomer meets on the command line, as real ``carryover`` subprocesses:

- the operator commands (``keys``, ``webhooks``, ``quotas``) say which database they use and
  never create one: in a directory without the server's database they fail naming the
  absolute path, and leave no file behind; after ``carryover migrate`` there they work;
- ``approval_required`` naming a tool the profile does not have stops ``serve`` and
  ``carryover config`` with exit 2 naming the variable and the name;
- ``carryover config | head`` ends quietly; ``chat`` and ``conversations`` find the server by
  ``CARRYOVER_PORT``; a cancelled run's line in the chat says "cancelled" once.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ..helpers import HANG_GUARD_SECONDS
from ..lifecycle.harness import free_port

ROOT = Path(__file__).resolve().parents[2]


def clean_env(**variables: str) -> dict[str, str]:
    """The environment without any CARRYOVER_* variable, importing this tree's app."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CARRYOVER_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.update(variables)
    return env


def carryover(cwd: Path, *args: str, **variables: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        cwd=cwd,
        env=clean_env(**variables),
        input="",
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_SECONDS,
    )


@pytest.mark.parametrize(
    "command",
    [
        ("keys", "list"),
        ("webhooks", "list"),
        ("quotas", "show"),
        ("keys", "create", "--tenant", "a"),
    ],
)
def test_an_operator_command_never_creates_a_database(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = carryover(elsewhere, *command)
    assert done.returncode == 1, done.stderr
    path = str((elsewhere / "carryover.db").resolve())
    assert f"database {path}" in done.stderr
    assert "does not exist" in done.stderr and "carryover migrate" in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
    assert list(elsewhere.iterdir()) == []  # nothing created


def test_after_migrate_the_commands_use_that_database_and_say_so(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'server.db'}"
    assert carryover(tmp_path, "migrate", CARRYOVER_DATABASE_URL=url).returncode == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    created = carryover(elsewhere, "keys", "create", "--tenant", "acme", CARRYOVER_DATABASE_URL=url)
    assert created.returncode == 0, created.stderr
    assert f"database {tmp_path / 'server.db'}" in created.stderr
    listed = carryover(elsewhere, "keys", "list", CARRYOVER_DATABASE_URL=url)
    assert listed.returncode == 0 and "acme" in listed.stdout
    assert list(elsewhere.iterdir()) == []


def test_a_database_that_is_not_migrated_is_refused(tmp_path: Path) -> None:
    import sqlite3

    sqlite3.connect(tmp_path / "carryover.db").close()  # an empty file, no schema
    done = carryover(tmp_path, "webhooks", "list")
    assert done.returncode == 1
    assert "not migrated" in done.stderr and "carryover migrate" in done.stderr


def test_config_shows_where_the_default_database_is(tmp_path: Path) -> None:
    done = carryover(tmp_path, "config")
    assert done.returncode == 0, done.stderr
    assert f"sqlite:///./carryover.db (= {tmp_path.resolve() / 'carryover.db'})" in done.stdout


def test_an_unknown_approval_required_tool_stops_config_and_serve(tmp_path: Path) -> None:
    variables = {
        "CARRYOVER_APPROVAL_REQUIRED": "wait,nosuchtool",
        "CARRYOVER_DATABASE_URL": f"sqlite:///{tmp_path / 'c.db'}",
        "CARRYOVER_PORT": str(free_port()),
    }
    config = carryover(tmp_path, "config", **variables)
    assert config.returncode == 2, config.stdout + config.stderr
    assert "CARRYOVER_APPROVAL_REQUIRED='wait,nosuchtool'" in config.stderr
    assert "'nosuchtool' is not a server tool of profile 'default'" in config.stderr
    serve = carryover(tmp_path, "serve", **variables)
    assert serve.returncode == 2, serve.stderr
    assert "'nosuchtool' is not a server tool" in serve.stderr
    assert "listening" not in serve.stderr


def test_an_approval_required_tool_of_a_profile_file_is_named_by_its_key(tmp_path: Path) -> None:
    profiles = tmp_path / "agents.toml"
    profiles.write_text(
        '[agents.gated]\nprovider = "echo"\napproval_required = ["time_nwo"]\n', encoding="utf-8"
    )
    done = carryover(tmp_path, "config", CARRYOVER_CONFIG_FILE=str(profiles))
    assert done.returncode == 2
    assert "agents.gated.approval_required='time_nwo'" in done.stderr
    assert "its tools: fail, time_now, wait" in done.stderr


def test_config_into_a_closed_pipe_ends_without_a_traceback(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line, as `| head` may be
    try:
        done = subprocess.run(
            [sys.executable, "-m", "app.cli", "config"],
            cwd=tmp_path,
            env=clean_env(),
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=HANG_GUARD_SECONDS,
        )
    finally:
        os.close(write_end)
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
    assert done.returncode == 141


@pytest.mark.parametrize("command", [("chat",), ("conversations", "list")])
def test_client_commands_find_the_server_by_carryover_port(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    port = free_port()  # nothing listens there: the message names where it looked
    done = carryover(tmp_path, *command, CARRYOVER_PORT=str(port))
    assert done.returncode == 1
    assert f"http://127.0.0.1:{port}" in done.stderr, done.stderr
    assert ":8000" not in done.stderr


def test_a_cancelled_run_is_said_once() -> None:
    from rich.console import Console

    from app.chat.render import Screen

    out = io.StringIO()
    Screen(Console(file=out, width=200)).finished(
        {
            "run_id": "run_1",
            "status": "cancelled",
            "error": {"title": "The run was cancelled", "detail": "the run was cancelled"},
        }
    )
    assert out.getvalue() == "[run run_1 cancelled: The run was cancelled]\n"


@pytest.mark.parametrize(
    ("flag", "most"),
    [
        ("--runs-per-minute", 2**31 - 1),
        ("--concurrent-runs", 2**31 - 1),
        ("--tokens-per-day", 2**53 - 1),
    ],
)
def test_a_quota_past_what_its_column_holds_is_refused_as_usage(
    tmp_path: Path, flag: str, most: int
) -> None:
    """Before the database is touched: argparse's usage error (2), no traceback; the largest
    value is taken."""
    url = f"sqlite:///{tmp_path / 'server.db'}"
    assert carryover(tmp_path, "migrate", CARRYOVER_DATABASE_URL=url).returncode == 0
    over = carryover(
        tmp_path, "quotas", "set", "--tenant", "a", flag, str(most + 1), CARRYOVER_DATABASE_URL=url
    )
    assert over.returncode == 2 and f"must be from 0 (no limit) to {most}" in over.stderr
    assert "Traceback" not in over.stderr
    done = carryover(
        tmp_path, "quotas", "set", "--tenant", "a", flag, str(most), CARRYOVER_DATABASE_URL=url
    )
    assert done.returncode == 0, done.stderr
    assert f"{flag[2:]} {most}" in done.stdout
