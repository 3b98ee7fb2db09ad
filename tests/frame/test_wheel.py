"""The wheel, installed non-editable in a fresh virtual environment, migrates and serves from an
empty directory: the migration scripts ship inside it (issue 9).

Slow (marked ``slow``: ``-m "not slow"`` leaves it out): it builds the wheel and installs it,
about 10-20 s. No network: the wheel is built without build isolation when this environment has
the build backend pyproject.toml asks for (the test extra installs it), and installed with
``--no-deps``; the new environment finds its dependencies (not ``app``) in this environment's
site-packages through a ``.pth`` file.
"""

from __future__ import annotations

import os
import queue
import shutil
import sqlite3
import subprocess
import sys
import sysconfig
import threading
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import httpx
import pytest
from sqlalchemy import inspect

from app.store.db import make_engine
from app.store.migrate import head_revision

from ..helpers import free_port
from ..store.test_migrations import TABLES

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
#: what the Dockerfile copies into its build stage
BUILD_INPUTS = ("pyproject.toml", "setup.py", "README.md", "app", "alembic")


@dataclass(frozen=True)
class Installed:
    venv: Path

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    def run(self, *args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            args, cwd=cwd, env=clean_env(**env), capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, f"{' '.join(args)}:\n{done.stdout}\n{done.stderr}"
        return done


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without this checkout's traces (no CARRYOVER_*, no virtualenv)."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("CARRYOVER_", "PYTHON")) and name != "VIRTUAL_ENV"
    }
    return {**env, **extra}


def _setuptools_ok() -> bool:
    try:
        return int(version("setuptools").split(".")[0]) >= 77
    except Exception:
        return False


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    source.mkdir()
    for name in BUILD_INPUTS:
        path = ROOT / name
        if path.is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.db*")
            shutil.copytree(path, source / name, ignore=ignore)
        else:
            shutil.copy2(path, source / name)

    build = [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "-w", str(work)]
    if _setuptools_ok():
        build.append("--no-build-isolation")
    done = subprocess.run(build, capture_output=True, text=True, timeout=300, cwd=work)
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = work.glob("carryover-*.whl")

    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # the dependencies (and pip) from this environment; app comes from the wheel only
    ours = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    (Path(purelib) / "carryover-test-deps.pth").write_text("\n".join(ours) + "\n")
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=work,
        env=clean_env(),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return Installed(venv)


def test_the_installed_copy_is_the_one_imported_and_carries_the_scripts(
    installed: Installed, tmp_path: Path
) -> None:
    probe = (
        "import app, alembic.command\n"
        "from app.store.migrate import MIGRATIONS_DIR\n"
        "print(app.__file__); print(MIGRATIONS_DIR)\n"
    )
    done = installed.run(str(installed.bin / "python"), "-c", probe, cwd=tmp_path)
    package, scripts = (Path(line) for line in done.stdout.split())
    assert package.is_relative_to(installed.venv)
    assert scripts.is_relative_to(installed.venv)
    for name in ("env.py", "script.py.mako", "versions/0001_initial.py"):
        assert (scripts / name).is_file(), name


def test_carryover_migrate_in_an_empty_directory(installed: Installed, tmp_path: Path) -> None:
    """With no configuration at all: the default database, ./carryover.db, gets every table."""
    done = installed.run(str(installed.bin / "carryover"), "migrate", cwd=tmp_path)
    assert "to head" in done.stdout
    with sqlite3.connect(tmp_path / "carryover.db") as db:
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master")}
        (revision,) = db.execute("SELECT version_num FROM alembic_version").fetchone()
    assert tables >= TABLES
    assert revision == head_revision()


async def test_carryover_migrate_on_each_engine(
    installed: Installed, empty_database_url: str, tmp_path: Path
) -> None:
    url = empty_database_url
    installed.run(
        str(installed.bin / "carryover"), "migrate", cwd=tmp_path, CARRYOVER_DATABASE_URL=url
    )
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            tables = set(await conn.run_sync(lambda c: inspect(c).get_table_names()))
    finally:
        await engine.dispose()
    assert tables >= TABLES


def test_carryover_serve_in_an_empty_directory_migrates_and_serves(
    installed: Installed, tmp_path: Path
) -> None:
    port = free_port()
    server = subprocess.Popen(
        [str(installed.bin / "carryover"), "serve", "--port", str(port)],
        cwd=tmp_path,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert server.stdout is not None
        for line in server.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    seen: list[str] = []
    try:
        # uvicorn says so once the socket is bound
        while not any("Uvicorn running on" in line for line in seen):
            line = lines.get(timeout=60)
            assert line is not None, "serve exited:\n" + "".join(seen)
            seen.append(line)
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=10)
        assert ready.status_code == 200, ready.text
        # the console's page and files ship in the wheel (package data), and the viewers' files
        # come from their package
        for path in (
            "/console",
            "/console/static/console.css",
            "/console/static/js/main.js",
            "/console/static/js/virtual.js",
            "/docs",
            "/docs/assets/swagger-ui-bundle.js",
        ):
            page = httpx.get(f"http://127.0.0.1:{port}{path}", timeout=10)
            assert page.status_code == 200, (path, page.text)
    finally:
        server.terminate()
        server.wait(timeout=30)
    with sqlite3.connect(tmp_path / "carryover.db") as db:
        (revision,) = db.execute("SELECT version_num FROM alembic_version").fetchone()
    assert revision == head_revision()
