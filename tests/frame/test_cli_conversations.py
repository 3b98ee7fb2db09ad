"""``carryover conversations …`` as a script uses it: subprocesses against a live server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .live_server import LiveServer, free_port, live_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("cli-conversations")
    with live_server(tmp, CARRYOVER_API_KEYS="ops:secret-key-01234567") as running:
        running.read_until(lambda text: "listening on" in text)
        yield running
        running.stop()


def cli(
    server: LiveServer,
    *args: str,
    key: str | None = "secret-key-01234567",
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CARRYOVER_")}
    command = [sys.executable, "-m", "app.cli", "conversations", "--url", server.url]
    if key is not None:
        command += ["--api-key", key]
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, env=env, input=stdin, timeout=120
    )


def as_json(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def http(server: LiveServer) -> httpx.Client:
    return httpx.Client(
        base_url=server.url, headers={"Authorization": "Bearer secret-key-01234567"}, timeout=30
    )


def test_list_show_fork_delete(server: LiveServer) -> None:
    with http(server) as client:
        for conv_id, user in (("cli-a", "u1"), ("cli-b", "u2")):
            created = client.post("/conversations", json={"id": conv_id, "metadata": {"u": user}})
            assert created.status_code == 201
        assert client.post("/conversations/cli-a/runs", json={"prompts": ["hi"]}).is_success

    listed = as_json(cli(server, "--json", "list", "--metadata", "u=u1"))
    assert [c["id"] for c in listed["items"]] == ["cli-a"]
    human = cli(server, "list", "-m", "u=u2")
    assert human.returncode == 0 and human.stdout.startswith("cli-b\t") and "u=u2" in human.stdout

    # --pending / --settled: what the stored context awaits (a PUT ending in a call)
    awaiting = {
        "system_prompt": "",
        "summary": "",
        "messages": [
            {"type": "user", "content": [{"type": "text", "text": "look"}]},
            {
                "type": "assistant",
                "content": [{"type": "tool_call", "id": "c1", "name": "lookup", "arguments": "{}"}],
                "stop_reason": "tool_use",
            },
        ],
    }
    with http(server) as client:
        put = client.put(
            "/conversations/cli-p/context", json=awaiting, headers={"If-None-Match": "*"}
        )
        assert put.status_code == 201, put.text
    pending = cli(server, "list", "--pending")
    assert pending.returncode == 0, pending.stderr
    assert pending.stdout.startswith("cli-p\t") and "pending=1" in pending.stdout
    settled = as_json(cli(server, "--json", "list", "--settled"))
    assert {c["id"] for c in settled["items"]} == {"cli-a", "cli-b"}
    assert cli(server, "delete", "cli-p").returncode == 0

    shown = as_json(cli(server, "--json", "show", "cli-a"))
    assert shown["id"] == "cli-a" and shown["run_count"] == 1

    forked = as_json(
        cli(server, "--json", "fork", "cli-a", "--id", "cli-f", "--messages", "0", "-m", "x=y")
    )
    assert (forked["id"], forked["message_count"], forked["metadata"]) == ("cli-f", 0, {"x": "y"})

    assert cli(server, "delete", "cli-f").returncode == 0
    missing = cli(server, "show", "cli-f")
    assert missing.returncode == 1 and "404" in missing.stderr and "not found" in missing.stderr


def test_export_then_import_round_trips(server: LiveServer, tmp_path: Path) -> None:
    with http(server) as client:
        created = client.post("/conversations", json={"id": "cli-x", "metadata": {"k": "v"}})
        assert created.status_code == 201
        assert client.post("/conversations/cli-x/runs", json={"prompts": ["one"]}).is_success
    to_stdout = cli(server, "export", "cli-x")
    assert to_stdout.returncode == 0, to_stdout.stderr
    document = json.loads(to_stdout.stdout)
    path = tmp_path / "cli-x.json"
    assert cli(server, "export", "cli-x", "-o", str(path)).returncode == 0
    assert json.loads(path.read_text()) == document

    imported = as_json(cli(server, "--json", "import", str(path), "--id", "cli-y"))
    assert imported["id"] == "cli-y" and imported["metadata"] == {"k": "v"}
    again = json.loads(cli(server, "export", "cli-y").stdout)
    differs = ("id", "etag", "updated_at")

    def strip(d: dict[str, Any]) -> dict[str, Any]:
        conv = {k: v for k, v in d["conversation"].items() if k not in differs}
        return {**d, "conversation": conv}

    assert strip(again) == strip(document)

    taken = cli(server, "--json", "import", "-", stdin=path.read_text())
    assert taken.returncode == 1
    assert json.loads(taken.stderr)["type"].endswith("/conversation-exists")


def test_refusals_exit_1(server: LiveServer) -> None:
    unauthorized = cli(server, "list", key=None)
    assert unauthorized.returncode == 1 and "401" in unauthorized.stderr
    nowhere = f"http://127.0.0.1:{free_port()}"
    unreachable = subprocess.run(
        [sys.executable, "-m", "app.cli", "conversations", "--url", nowhere, "list"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert unreachable.returncode == 1 and "cannot reach" in unreachable.stderr
    usage = cli(server, "list", "--metadata", "no-equals-sign")
    assert usage.returncode == 2
