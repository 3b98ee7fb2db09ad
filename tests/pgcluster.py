"""A private PostgreSQL cluster for tests that stop, restart or break the database.

``initdb`` into a temp dir as the ``postgres`` user, on its own port (picked free) and its own
unix socket directory, with ``fsync`` off; started and stopped with ``pg_ctl`` (``-l LOG``, so
the server's log is in the cluster dir). It never touches the shared server on 5432, so
restarting it disturbs no other test or helper.

Usage (the ``pg_cluster`` fixture gives a started cluster, shared by a module)::

    cluster.url                # postgresql://postgres@127.0.0.1:<port>/postgres
    cluster.stop()             # pg_ctl stop -m fast (waits)
    cluster.stop(mode="smart", wait=False)   # refuses new connections, keeps sessions
    cluster.start(); cluster.restart()
    cluster.running            # pg_ctl status
    await cluster.execute("…") # one statement as the superuser
    await cluster.create_database("app", migrated=True)   # -> its URL, at Alembic head

Tests that need it are skipped when there are no PostgreSQL binaries, or when the ``postgres``
user cannot be switched to (not root); ``CARRYOVER_REQUIRE_POSTGRES=1`` turns the skip into a
failure, as for the shared server.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from .helpers import free_port

__all__ = ["PgCluster", "find_bindir", "pg_cluster"]


def find_bindir() -> Path | None:
    """The newest ``/usr/lib/postgresql/<version>/bin`` holding ``initdb`` and ``pg_ctl``."""
    found = []
    for path in glob.glob("/usr/lib/postgresql/*/bin"):
        bindir = Path(path)
        if (bindir / "initdb").exists() and (bindir / "pg_ctl").exists():
            try:
                found.append((int(bindir.parent.name), bindir))
            except ValueError:
                continue
    return max(found)[1] if found else None


class PgCluster:
    """One private cluster: ``init()`` once, then ``start`` / ``stop`` / ``restart`` at will."""

    def __init__(self, bindir: Path, root: Path, *, port: int | None = None) -> None:
        self.bindir = bindir
        self.root = root
        self.data = root / "data"
        self.sockets = root / "sockets"
        self.log = root / "LOG"
        self.port = port or free_port()
        if self.port == 5432:
            raise ValueError("the private cluster never uses 5432")

    # --- as postgres ------------------------------------------------------------------------

    def _as_postgres(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [str(a) for a in args]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        return subprocess.run(command, check=check, capture_output=True, text=True, timeout=120)

    def _pg_ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self._as_postgres(
            str(self.bindir / "pg_ctl"), "-D", str(self.data), *args, check=check
        )

    # --- lifecycle ----------------------------------------------------------------------------

    def init(self) -> PgCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        self.sockets.mkdir(exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
            shutil.chown(self.sockets, "postgres", "postgres")
        self._as_postgres(
            str(self.bindir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
        )
        settings = {
            "port": str(self.port),
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self.sockets}'",
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "max_connections": "30",
            "shared_buffers": "16MB",
            "log_min_messages": "warning",
        }
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write("\n# tests/pgcluster.py\n")
            for name, value in settings.items():
                conf.write(f"{name} = {value}\n")
        return self

    def start(self) -> None:
        self._pg_ctl("-w", "-t", "60", "-l", str(self.log), "start")

    def stop(self, mode: str = "fast", *, wait: bool = True) -> None:
        self._pg_ctl("-m", mode, *(["-w", "-t", "60"] if wait else ["-W"]), "stop")

    def restart(self, mode: str = "fast") -> None:
        self._pg_ctl("-m", mode, "-w", "-t", "60", "-l", str(self.log), "restart")

    def wait_stopped(self) -> None:
        """Wait for a stop started with ``wait=False`` to finish (``pg_ctl stop`` again)."""
        if self.running:
            self._pg_ctl("-m", "fast", "-w", "-t", "60", "stop", check=False)

    @property
    def running(self) -> bool:
        return self._pg_ctl("status", check=False).returncode == 0

    def ensure_running(self) -> None:
        if not self.running:
            self.start()

    def destroy(self) -> None:
        if self.data.exists() and self.running:
            self._pg_ctl("-m", "immediate", "-w", "stop", check=False)
        shutil.rmtree(self.root, ignore_errors=True)

    # --- addresses ----------------------------------------------------------------------------

    def url_for(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    @property
    def url(self) -> str:
        return self.url_for()

    @property
    def socket_url(self) -> str:
        """The same server over its unix socket (asyncpg ``host=`` a directory)."""
        return f"postgresql://postgres@/postgres?host={self.sockets}&port={self.port}"

    async def execute(self, sql: str, *args: object) -> list[Any]:
        """Run one statement as the superuser on ``postgres``; its rows."""
        conn = await asyncpg.connect(self.url)
        try:
            rows: list[Any] = await conn.fetch(sql, *args)
            return rows
        finally:
            await conn.close()

    async def create_database(self, name: str, *, migrated: bool = False) -> str:
        """A fresh database ``name`` (dropped first if it exists); its URL. ``migrated``
        upgrades it to the head revision with the project's migrations."""
        if not name.replace("_", "").isalnum():
            raise ValueError(f"not a plain database name: {name!r}")
        await self.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await self.execute(f'CREATE DATABASE "{name}"')
        url = self.url_for(name)
        if migrated:
            from app.store.migrate import upgrade

            await upgrade(url)
        return url

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""


def _unavailable(reason: str) -> None:
    if os.environ.get("CARRYOVER_REQUIRE_POSTGRES") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def pg_cluster_module() -> Iterator[PgCluster]:
    bindir = find_bindir()
    if bindir is None:
        _unavailable("no PostgreSQL binaries under /usr/lib/postgresql/*/bin")
        raise AssertionError("unreachable")
    if os.geteuid() != 0 and os.environ.get("USER") != "postgres":
        _unavailable("a private cluster needs root (runuser -u postgres) or the postgres user")
    root = Path(tempfile.mkdtemp(prefix="carryover-pg-"))
    cluster = PgCluster(bindir, root)
    try:
        cluster.init()
        cluster.start()
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        log = cluster.log_text()
        cluster.destroy()
        stderr = getattr(exc, "stderr", "") or ""
        pytest.fail(f"the private PostgreSQL cluster did not start: {exc}\n{stderr}\n{log}")
    try:
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def pg_cluster(pg_cluster_module: PgCluster) -> Iterator[PgCluster]:
    """A running private cluster (started again if an earlier test left it stopped)."""
    pg_cluster_module.ensure_running()
    yield pg_cluster_module
