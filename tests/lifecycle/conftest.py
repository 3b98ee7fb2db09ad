"""Fixtures of the lifecycle tests: a fresh PostgreSQL database per test module (migrated with
``app.store.migrate.upgrade``, via the helpers of tests/conftest.py), and from harness.py (shared
with tests/faults) a SQLite file per test, ``servers``, which starts real ``carryover serve``
processes and kills them when the test ends, pass or fail, and ``gate``, an OpenAI-compatible
fake that holds each request until the test releases it (start servers with
``**gate.settings()`` and run with ``agent=PROFILE``)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from app.store.migrate import upgrade

from ..conftest import (
    _create_postgres_database,
    _drop_postgres_database,
    _postgres_url,
    _require_postgres,
    run_blocking,
)
from .harness import gate as gate
from .harness import servers as servers
from .harness import sqlite_url as sqlite_url


@pytest.fixture(scope="module")
def postgres_url(_postgres_dropper: ThreadPoolExecutor) -> Iterator[str]:
    """A PostgreSQL database of this test module's own, migrated to head."""
    _require_postgres()
    name = _create_postgres_database()
    try:
        url = _postgres_url(name)
        run_blocking(lambda: upgrade(url))
        yield url
    finally:
        # Servers are killed after each test; FORCE drops any connection left behind.
        _postgres_dropper.submit(_drop_postgres_database, name)
