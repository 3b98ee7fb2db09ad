"""TypeScript types generated from the committed document type-check a strict client flow.

openapi-typescript generates ``paths`` from ``openapi/openapi.json``; ``tsc --noEmit`` checks,
under ``strict``, the nvim/vim flow of tests/client/ts/src/flow.ts written with openapi-fetch
(``createClient<paths, "application/json">``), which reads ``context.messages.length`` without
a non-null assertion; then node runs the flow against ``carryover serve``. ``npm ci`` installs
the pinned packages (package-lock.json) into tests/client/ts/node_modules once (again when the
pins change). The official ``openai`` package for Node drives ``/v1`` the same way
(tests/client/ts/src/openai_flow.ts, typed by the package's own types).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .test_generated_client import API_KEY, server  # noqa: F401  (the live server fixture)

TS = Path(__file__).resolve().parent / "ts"
COMMITTED = TS.parents[2] / "openapi" / "openapi.json"


def run(*command: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        command, cwd=TS, capture_output=True, text=True, timeout=600, check=False, env=env
    )
    assert done.returncode == 0, f"{' '.join(command)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def typed_project() -> Path:
    if shutil.which("node") is None or shutil.which("npm") is None:
        if os.environ.get("CI"):
            pytest.fail("node and npm are needed for the TypeScript client test in CI")
        pytest.skip("node and npm are not installed")
    installed = TS / "node_modules" / ".package-lock.json"
    if (
        not installed.exists()
        or installed.stat().st_mtime < (TS / "package-lock.json").stat().st_mtime
    ):
        run("npm", "ci", "--no-audit", "--no-fund")  # first, or after the pins changed
    run(
        "npx",
        "openapi-typescript",
        str(COMMITTED),
        "--default-non-nullable",
        "false",
        "-o",
        "src/schema.d.ts",
    )
    return TS


def test_the_generated_types_check_a_strict_flow(typed_project: Path) -> None:
    schema = (typed_project / "src" / "schema.d.ts").read_text(encoding="utf-8")
    assert '"Context-Output"' in schema
    source = (typed_project / "src" / "flow.ts").read_text(encoding="utf-8")
    assert "!." not in source and "!;" not in source  # no non-null assertion
    run("npx", "tsc", "--noEmit", "-p", "tsconfig.json")


def test_the_typed_flow_runs_against_a_live_server(
    typed_project: Path,
    server: str,  # noqa: F811
) -> None:
    run("npx", "tsc", "--outDir", "build", "--noEmit", "false", "-p", "tsconfig.json")
    env = dict(os.environ, CARRYOVER_URL=server, CARRYOVER_API_KEY=API_KEY)
    lengths = json.loads(run("node", "build/flow.js", env=env).strip().splitlines()[-1])
    assert lengths == [2, 4, 4]


def test_the_openai_node_package_drives_v1(
    typed_project: Path,
    server: str,  # noqa: F811
) -> None:
    run("npx", "tsc", "--outDir", "build", "--noEmit", "false", "-p", "tsconfig.json")
    env = dict(os.environ, CARRYOVER_URL=server, CARRYOVER_API_KEY=API_KEY)
    found = json.loads(run("node", "build/openai_flow.js", env=env).strip().splitlines()[-1])
    assert found == {
        "texts": [
            'Echo: I saw 1 message. You said: "What is nvim?"',
            'Echo: I saw 3 messages. You said: "And vim?"',
            'Echo: I saw 5 messages. You said: "stream me"',
            'Tool get_weather returned: "warm"',
        ],
        "roles": ["user", "assistant", "user", "assistant"],
        "first": "response.created",
        "last": "response.completed",
        "arguments": '{"city": "Lima"}',
        "refused": "400 model_not_found",
        "missing": 404,
    }
