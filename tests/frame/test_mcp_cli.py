"""Operators and MCP servers: ``carryover mcp list`` (a URL, or a profile's servers as its runs
see them), ``carryover config`` reporting each profile's servers, and ``carryover serve``
refusing what can be checked offline (exit 2, naming the variable) — a server URL that is not
one, a label taken twice or reserved, a header variable that is not set."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..fakes.mcp_server import FakeMcp
from ..helpers import free_port
from .test_startup_checks import profiles_file, refused_start


@pytest.fixture
def fake() -> Iterator[FakeMcp]:
    with FakeMcp("cli") as server:
        yield server


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    from app.config import get_settings

    for name in [n for n in os.environ if n.startswith("CARRYOVER_")]:
        monkeypatch.delenv(name)
    get_settings.cache_clear()
    yield monkeypatch
    get_settings.cache_clear()


def test_mcp_list_shows_what_a_url_offers(
    fake: FakeMcp, clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.cli import main

    clean_env.setenv("CLI_MCP_TOKEN", "token-for-the-cli")
    assert main(["mcp", "list", fake.url, "--header-env", "Authorization=CLI_MCP_TOKEN"]) == 0
    out = capsys.readouterr().out
    assert f"cli ({fake.url}): 4 tool(s)" in out
    assert "  lookup - Look a word up." in out
    assert "token-for-the-cli" in [h.get("authorization") for h in fake.headers]


def test_mcp_list_of_a_profile_applies_its_filters(
    fake: FakeMcp, clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.cli import main

    servers = [
        {
            "label": "dict",
            "url": fake.url,
            "allowed_tools": ["lookup", "add"],
            "require_approval": {"never": {"tool_names": ["lookup"]}},
        }
    ]
    clean_env.setenv("CARRYOVER_MCP_SERVERS", json.dumps(servers))
    assert main(["mcp", "list", "default", "--json"]) == 0
    [server] = json.loads(capsys.readouterr().out)["servers"]
    tools = {t["name"]: (t["offered"], t["requires_approval"]) for t in server["tools"]}
    assert tools["lookup"] == (True, False)
    assert tools["add"] == (True, True)
    assert tools["explode"][0] is False


def test_mcp_list_of_a_server_that_is_down_exits_1(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.cli import main

    clean_env.setenv("CARRYOVER_MCP_CONNECT_TIMEOUT", "2")
    down = f"http://127.0.0.1:{free_port()}/mcp"
    assert main(["mcp", "list", down]) == 1
    assert "could not connect" in capsys.readouterr().out


def test_config_reports_each_profiles_servers(
    fake: FakeMcp, clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.cli import main

    down = f"http://127.0.0.1:{free_port()}/mcp"
    servers = [
        {"label": "dict", "url": fake.url, "headers": {"Authorization": "Bearer hidden-value"}},
        {"label": "gone", "url": down, "connect_timeout": 2},
    ]
    clean_env.setenv("CARRYOVER_MCP_SERVERS", json.dumps(servers))
    assert main(["config", "--json"]) == 0
    out = capsys.readouterr().out
    assert "hidden-value" not in out
    document = json.loads(out)
    states = document["mcp_servers"]["default"]
    assert states["dict"] == "reachable, 4 tool(s) offered"
    assert states["gone"].startswith("unreachable: tools/list could not connect")
    rows = {row["name"]: row["value"] for row in document["settings"]}
    assert "headers: Authorization" in rows["agents.default.mcp_servers"]


@pytest.mark.parametrize(
    ("servers", "said"),
    [
        ([{"label": "x", "url": "ftp://files.example"}], "is not an http:// or https:// URL"),
        ([{"label": "carryover", "url": "https://a.example/mcp"}], "agent's own tools"),
        (
            [{"label": "x", "url": "https://a.example/"}, {"label": "x", "url": "https://b.test/"}],
            "two servers are labelled 'x'",
        ),
    ],
)
def test_serve_refuses_a_server_it_can_tell_is_wrong(
    tmp_path: Path, servers: list[dict[str, str]], said: str
) -> None:
    status, err, bound = refused_start(tmp_path, CARRYOVER_MCP_SERVERS=json.dumps(servers))
    assert status == 2, err
    assert "CARRYOVER_MCP_SERVERS" in err and said in err
    assert not bound


def test_serve_refuses_a_header_variable_that_is_not_set(tmp_path: Path) -> None:
    path = profiles_file(
        tmp_path,
        '[agents.docs]\n[[agents.docs.mcp_servers]]\nlabel = "docs"\n'
        'url = "https://mcp.example.com/mcp"\n'
        'header_env = { Authorization = "DOCS_MCP_TOKEN_NOT_SET" }\n',
    )
    status, err, bound = refused_start(
        tmp_path, CARRYOVER_CONFIG_FILE=path, DOCS_MCP_TOKEN_NOT_SET=None
    )
    assert status == 2, err
    assert "agents.docs.mcp_servers[0]" in err and "DOCS_MCP_TOKEN_NOT_SET" in err
    assert not bound


def test_serve_refuses_an_allowed_url_that_is_not_one(tmp_path: Path) -> None:
    status, err, _ = refused_start(tmp_path, CARRYOVER_MCP_ALLOWED_URLS="mcp.example.com")
    assert status == 2, err
    assert "CARRYOVER_MCP_ALLOWED_URLS" in err
