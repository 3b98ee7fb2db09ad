"""The ``alembic`` command at the repository root, on both engines (alembic.ini, alembic/).

Each test runs ``python -m alembic`` as a developer would: cwd the repository root, the
database in ``CARRYOVER_DATABASE_URL``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from sqlalchemy import inspect, text

from app.store.db import make_engine
from app.store.migrate import current_revision, head_revision

from .test_migrations import TABLES

ROOT = Path(__file__).resolve().parents[2]


def alembic(
    url: str, *args: str, config: Path | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CARRYOVER_DATABASE_URL": url}
    command = [sys.executable, "-m", "alembic"]
    if config is not None:
        command += ["-c", str(config)]
    done = subprocess.run(
        [*command, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    if check:
        assert done.returncode == 0, f"alembic {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done


async def _table_names(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            return set(await conn.run_sync(lambda c: inspect(c).get_table_names()))
    finally:
        await engine.dispose()


async def test_upgrade_check_current_history_downgrade_from_the_root(
    empty_database_url: str,
) -> None:
    url = empty_database_url
    head = head_revision()
    alembic(url, "upgrade", "head")
    assert TABLES <= await _table_names(url)
    assert alembic(url, "current").stdout.split() == [head, "(head)"]
    assert f"-> {head} (head)" in alembic(url, "history").stdout
    assert "No new upgrade operations detected" in alembic(url, "check").stdout

    alembic(url, "downgrade", "base")
    assert not (await _table_names(url)) & TABLES
    assert alembic(url, "current").stdout.strip() == ""


async def test_check_fails_when_the_database_and_the_tables_disagree(database_url: str) -> None:
    engine = make_engine(database_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(text("DROP INDEX ix_runs_run_id"))
    finally:
        await engine.dispose()

    done = alembic(database_url, "check", check=False)
    assert done.returncode != 0
    assert "New upgrade operations detected" in done.stdout + done.stderr
    assert "ix_runs_run_id" in done.stdout + done.stderr


def test_alembic_at_the_root_does_not_shadow_the_library() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import alembic, alembic.command; print(alembic.__file__)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert not Path(done.stdout.strip()).is_relative_to(ROOT / "alembic")


async def test_autogenerate_from_nothing_writes_a_revision_check_accepts(
    empty_database_url: str, tmp_path: Path
) -> None:
    """``revision --autogenerate`` with this env.py and template, from an empty history, writes
    a revision that imports nothing of the app and that builds the tables exactly."""
    scripts = tmp_path / "alembic"
    shutil.copytree(ROOT / "alembic", scripts, ignore=shutil.ignore_patterns("__pycache__"))
    for revision in (scripts / "versions").glob("*.py"):
        revision.unlink()
    ini = (ROOT / "alembic.ini").read_text(encoding="utf-8")
    ini = ini.replace("script_location = %(here)s/alembic", f"script_location = {scripts}")
    ini = ini.replace("prepend_sys_path = %(here)s", f"prepend_sys_path = {ROOT}")
    config = tmp_path / "alembic.ini"
    config.write_text(ini, encoding="utf-8")

    url = empty_database_url
    alembic(url, "revision", "--autogenerate", "--rev-id", "0001", "-m", "all", config=config)
    (written,) = (scripts / "versions").glob("*.py")
    assert written.name == "0001_all.py"
    source = written.read_text(encoding="utf-8")
    assert "app." not in source and "sqlmodel" not in source
    assert "op.create_table('runs'" in source

    alembic(url, "upgrade", "head", config=config)
    assert TABLES <= await _table_names(url)
    assert "No new upgrade operations detected" in alembic(url, "check", config=config).stdout


async def test_the_command_accepts_a_url_naming_the_async_driver(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'x.db'}"
    alembic(url, "upgrade", "head")
    assert await current_revision(url) == head_revision()
