"""A live ``carryover serve`` (echo provider, a fresh SQLite file, two tenants) for the module,
and the official ``openai`` client on its ``/v1``, unmodified."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from ..helpers import HANG_GUARD_SECONDS, free_port

ROOT = Path(__file__).resolve().parents[2]
KEYS = {"alpha": "v1-test-key-alpha", "beta": "v1-test-key-beta"}


@dataclass(frozen=True)
class Server:
    url: str

    def client(self, tenant: str = "alpha") -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=KEYS[tenant], max_retries=0)

    def native(self, tenant: str = "alpha") -> httpx.Client:
        """An HTTP client on the native API, as the same tenant."""
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {KEYS[tenant]}"}, timeout=30
        )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("v1")
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("CARRYOVER_") and k not in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")
    }
    env.update(
        {
            "CARRYOVER_DATABASE_URL": f"sqlite:///{tmp / 'db.sqlite'}",
            "CARRYOVER_API_KEYS": ",".join(f"{t}:{k}" for t, k in KEYS.items()),
        }
    )
    log = (tmp / "server.log").open("w+", encoding="utf-8")
    process = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_ready(process, url, log)
        yield Server(url)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _wait_until_ready(process: subprocess.Popen[bytes], url: str, log: object) -> None:
    deadline = time.monotonic() + HANG_GUARD_SECONDS * 2  # a hang guard, nothing asserted
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"carryover serve exited with {process.returncode}")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    pytest.fail("carryover serve never became ready")
