"""The files that run Carryover elsewhere: CI scripts parse, the image and compose say what
the README promises. (No Docker engine here: these read the files.)"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("script", [".ci/run", "scripts/test"])
def test_scripts_are_valid_bash_and_executable(script: str) -> None:
    path = ROOT / script
    subprocess.run(["bash", "-n", str(path)], check=True)
    assert os.access(path, os.X_OK)
    assert "set -euo pipefail" in path.read_text(encoding="utf-8")


def test_dockerfile_runs_serve_as_a_non_root_user_with_a_healthcheck() -> None:
    lines = [
        line.strip()
        for line in (ROOT / "Dockerfile").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    final_stage = lines[max(i for i, line in enumerate(lines) if line.startswith("FROM")) :]
    assert final_stage[0] == "FROM python:3.11-slim"
    user = next(line for line in final_stage if line.startswith("USER "))
    assert user != "USER root"
    assert any(line.startswith("HEALTHCHECK") for line in final_stage)
    assert any("/healthz" in line for line in final_stage)
    assert final_stage[-1] == 'CMD ["carryover", "serve", "--host", "0.0.0.0"]'
    assert final_stage.index(user) < final_stage.index(final_stage[-1])


def test_compose_waits_for_a_healthy_postgres() -> None:
    yaml = pytest.importorskip("yaml")
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    db, service = compose["services"]["db"], compose["services"]["carryover"]
    assert db["image"] == "postgres:16"
    assert "pg_isready" in " ".join(db["healthcheck"]["test"])
    assert service["depends_on"] == {"db": {"condition": "service_healthy"}}
    environment = service["environment"]
    assert environment["CARRYOVER_DATABASE_URL"] == (
        "postgresql://carryover:carryover@db:5432/carryover"
    )
    assert environment["CARRYOVER_API_KEYS"]  # 0.0.0.0 in the container needs keys


def test_dockerignore_keeps_what_the_build_needs() -> None:
    ignored = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert not ignored & {"app", "alembic", "pyproject.toml", "setup.py", "README.md"}
    assert {".git", ".venv", "tests"} <= ignored


def test_the_image_build_copies_what_the_wheel_is_built_from() -> None:
    """The wheel carries the migration scripts from alembic/ (setup.py maps them in)."""
    from .test_wheel import BUILD_INPUTS

    copied = set()
    for line in (ROOT / "Dockerfile").read_text(encoding="utf-8").splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            copied.update(line.split()[1:-1])
    assert copied == set(BUILD_INPUTS)
