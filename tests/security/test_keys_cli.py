"""``carryover keys create|list|revoke`` on a real database, and ``carryover serve``'s loopback
guard: without keys (none in ``CARRYOVER_API_KEYS``, none active in the database) it refuses a
non-loopback address unless told explicitly, and it says which access rule applies."""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.api.app import create_app
from app.cli import main
from app.config import Settings, get_settings
from tests.conftest import run_blocking

from .conftest import snapshot

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in list(os.environ):
        if name.upper().startswith("CARRYOVER_") or name.upper() in (
            "OPENAI_API_KEY",
            "ANTHROPIC_API_KEY",
            "PROMETHEUS_MULTIPROC_DIR",
        ):
            monkeypatch.delenv(name)
    get_settings.cache_clear()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    get_settings.cache_clear()
    for handler in root.handlers[:]:
        if handler not in handlers:
            root.removeHandler(handler)
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)


@pytest.fixture
def database(database_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("CARRYOVER_DATABASE_URL", database_url)
    return database_url


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The server ``carryover serve`` would start, recorded instead of started."""
    calls: list[dict[str, Any]] = []

    def run_server(config: Any, on_listening: Any) -> bool:
        calls.append({"host": config.host, "port": config.port})
        on_listening()
        return True

    monkeypatch.setattr("app.cli.serve.run_server", run_server)
    return calls


def keys(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(["keys", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def list_rows(capsys: pytest.CaptureFixture[str]) -> list[list[str]]:
    status, out, _ = keys("list", capsys=capsys)
    assert status == 0
    header, *rows = [line.split() for line in out.splitlines()]
    assert header == ["ID", "TENANT", "PREFIX", "CREATED", "REVOKED"]
    return rows


def status_with(database_url: str, key: str | None, **settings: Any) -> int:
    """The status of GET /conversations with this key, on an app over the database."""

    async def go() -> int:
        app = create_app(Settings(database_url=database_url, **settings))
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://t", headers=headers
            ) as client,
        ):
            return (await client.get("/conversations")).status_code

    return run_blocking(go)


# --- keys ----------------------------------------------------------------------------------


def test_create_prints_the_key_once_and_stores_only_its_hash(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = keys("create", "--tenant", "acme", capsys=capsys)
    assert status == 0
    key = out.strip()
    assert out == key + "\n" and key.startswith("co_") and len(key) == 46
    assert "only time it is shown" in err and "for tenant 'acme'" in err
    assert key not in err
    rows = run_blocking(lambda: snapshot(database))["api_keys"]
    [(key_id, tenant, key_hash, prefix, _created, revoked)] = rows
    assert (tenant, prefix, revoked) == ("acme", key[:11], None)
    assert key_hash == hashlib.sha256(key.encode()).hexdigest()
    assert key_id in err and prefix in err
    # list shows id, tenant, prefix, created, revoked — never the key
    [[listed_id, listed_tenant, listed_prefix, created, listed_revoked]] = list_rows(capsys)
    assert (listed_id, listed_tenant, listed_prefix, listed_revoked) == (
        key_id,
        "acme",
        key[:11],
        "-",
    )
    assert created.endswith("Z")
    assert status_with(database, key) == 200
    assert status_with(database, None) == 401


def test_revoke_takes_a_key_out_and_says_when(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    first = keys("create", "--tenant", "acme", capsys=capsys)[1].strip()
    second = keys("create", "--tenant", "globex", capsys=capsys)[1].strip()
    rows = list_rows(capsys)
    assert [row[1] for row in rows] == ["acme", "globex"]
    acme_id = rows[0][0]
    status, out, _ = keys("revoke", acme_id, capsys=capsys)
    assert status == 0 and f"revoked API key {acme_id} of tenant 'acme'" in out
    assert "within 2 seconds" in out
    status, out, _ = keys("revoke", acme_id, capsys=capsys)
    assert status == 0 and "already revoked" in out
    rows = list_rows(capsys)
    assert rows[0][4].endswith("Z") and rows[1][4] == "-"
    status, out, _ = keys("list", "--tenant", "globex", capsys=capsys)
    assert "acme" not in out and "globex" in out
    assert status_with(database, first) == 401
    assert status_with(database, second) == 200


def test_keys_usage_errors(database: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = keys("revoke", "key_nope", capsys=capsys)
    assert status == 1 and "no API key with id 'key_nope'" in err
    for argv in (
        ["create"],
        ["create", "--tenant", "two words"],
        ["create", "--tenant", ""],
        ["create", "--tenant", "x" * 65],
        [],
    ):
        with pytest.raises(SystemExit) as info:
            main(["keys", *argv])
        assert info.value.code == 2
    assert list_rows(capsys) == []


# --- the loopback guard --------------------------------------------------------------------


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.10"])
def test_serve_refuses_a_public_host_without_any_key(
    database: str, served: list[dict[str, Any]], capsys: pytest.CaptureFixture[str], host: str
) -> None:
    assert main(["serve", "--host", host]) == 2
    err = capsys.readouterr().err
    assert f"refusing to listen on '{host}' without authentication" in err
    assert "carryover keys create" in err and "CARRYOVER_ALLOW_UNAUTHENTICATED_PUBLIC" in err
    assert served == []


def test_serve_on_a_public_host_with_a_database_key(
    database: str, served: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    key = keys("create", "--tenant", "acme", capsys=capsys)[1].strip()
    assert main(["serve", "--host", "0.0.0.0"]) == 0
    out = capsys.readouterr().out
    assert served[0]["host"] == "0.0.0.0"
    assert "access: API keys required (1 key(s) in the database)" in out
    assert key not in out


def test_serve_refuses_again_once_every_database_key_is_revoked(
    database: str, served: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    keys("create", "--tenant", "acme", capsys=capsys)
    keys("revoke", list_rows(capsys)[0][0], capsys=capsys)
    assert main(["serve", "--host", "0.0.0.0"]) == 2
    assert "refusing to listen on '0.0.0.0'" in capsys.readouterr().err
    assert served == []


def test_serve_refuses_when_the_database_cannot_say(
    monkeypatch: pytest.MonkeyPatch,
    served: list[dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("CARRYOVER_DATABASE_URL", "postgresql://u:hunter22@127.0.0.1:1/x")
    assert main(["serve", "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert "could not be counted" in err and "hunter22" not in err
    assert served == []


def test_serve_says_which_access_rule_applies_on_loopback(
    database: str,
    served: list[dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert main(["serve"]) == 0
    assert "access: no API keys configured: no authentication, loopback only" in (
        capsys.readouterr().out
    )
    keys("create", "--tenant", "acme", capsys=capsys)
    monkeypatch.setenv("CARRYOVER_API_KEYS", "globex:globex-key-1234-5678")
    get_settings.cache_clear()
    assert main(["serve"]) == 0
    assert "access: API keys for 1 tenant(s), 1 key(s) in the database" in (capsys.readouterr().out)


def test_the_real_command_refuses_a_public_host(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("CARRYOVER_")}
    env["CARRYOVER_DATABASE_URL"] = f"sqlite:///{tmp_path / 'c.db'}"
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve", "--host", "0.0.0.0", "--port", "1"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "refusing to listen on '0.0.0.0' without authentication" in done.stderr
    assert not (tmp_path / "c.db").exists()  # refused before touching the database
