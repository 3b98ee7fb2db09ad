"""Fixtures of the fault-injection suite (docs/faults.md): a private PostgreSQL cluster the
tests stop and restart (tests/pgcluster.py, never the shared server), a fresh migrated
database on it per test, real ``carryover serve`` processes (tests/lifecycle/harness.py) killed
when the test ends, and the gated OpenAI fake that holds runs in flight."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from ..fakes.gated_http import GatedOpenAI
from ..lifecycle.harness import Servers
from ..pgcluster import PgCluster
from ..pgcluster import pg_cluster as pg_cluster
from ..pgcluster import pg_cluster_module as pg_cluster_module

_names = itertools.count(1)


@pytest.fixture
async def pg_url(pg_cluster: PgCluster) -> str:
    """A fresh database at Alembic head on the private cluster."""
    return await pg_cluster.create_database(f"faults_{next(_names)}", migrated=True)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'carryover.db'}"


@pytest.fixture
async def servers(tmp_path: Path) -> AsyncIterator[Servers]:
    started = Servers(tmp_path)
    try:
        yield started
    finally:
        started.close()


@pytest.fixture
def gate() -> Iterator[GatedOpenAI]:
    with GatedOpenAI() as fake:
        yield fake
