"""A live ``carryover serve`` (echo provider, a fresh SQLite file, two tenants) for the module,
and the official ``openai`` client on its ``/v1``, unmodified."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest

from ..helpers import served

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
    keys = ",".join(f"{t}:{k}" for t, k in KEYS.items())
    with served(tmp_path_factory.mktemp("v1"), CARRYOVER_API_KEYS=keys) as url:
        yield Server(url)
