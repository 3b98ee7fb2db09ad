"""Fixtures of the fault-injection suite (docs/faults.md): a private PostgreSQL cluster the
tests stop and restart (tests/pgcluster.py, never the shared server), a fresh migrated
database on it per test, and, as in tests/lifecycle (the fixtures of its harness.py), real
``carryover serve`` processes killed when the test ends, a SQLite file per test and the gated
OpenAI fake that holds runs in flight."""

from __future__ import annotations

import itertools

import pytest

from ..lifecycle.harness import gate as gate
from ..lifecycle.harness import servers as servers
from ..lifecycle.harness import sqlite_url as sqlite_url
from ..pgcluster import PgCluster
from ..pgcluster import pg_cluster as pg_cluster
from ..pgcluster import pg_cluster_module as pg_cluster_module

_names = itertools.count(1)


@pytest.fixture
async def pg_url(pg_cluster: PgCluster) -> str:
    """A fresh database at Alembic head on the private cluster."""
    return await pg_cluster.create_database(f"faults_{next(_names)}", migrated=True)
