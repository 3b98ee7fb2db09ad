"""The commands of the documentation, run as written: every shell block of README.md and
docs/*.md is either run here or listed with why it cannot run offline (a real provider, a
container, the network, an interactive terminal, an id a previous command printed).

- the README walk-through (and its "more to try") against a real ``carryover serve``, each
  output line the README shows (``# …`` after a command, ``…`` matching anything) checked;
- docs/clients.md's Python generator, as written, in an empty directory;
- docs/migrations.md's ``alembic`` commands on a SQLite file;
- docs/operations.md's ``carryover quotas`` commands on a migrated database.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .live_server import live_server

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```(?:sh|bash|console|shell)\n(.*?)^```", re.M | re.S)
COMMAND_TIMEOUT = 300  # a hang guard only

#: the blocks this module runs, by page and position
RUN = {
    ("README.md", 3): "the walk-through",
    ("README.md", 4): "more to try",
    ("clients.md", 1): "the Python client generator",
    ("migrations.md", 1): "the alembic command",
    ("operations.md", 3): "carryover quotas",
}
#: the blocks that cannot run offline here, and why
NOT_RUN = {
    ("README.md", 1): "installs into .venv and runs the whole suite / a server that stays up",
    ("README.md", 2): "creates a virtual environment and runs the whole suite",
    ("README.md", 5): "an interactive terminal (tests/frame/test_chat.py drives it in a pty)",
    ("README.md", 6): "real providers: keys and a network, or an Ollama server",
    ("chat.md", 1): "an interactive terminal (tests/frame/test_chat.py drives it in a pty)",
    ("clients.md", 2): "npm packages from the network (tests/client runs it when node is there)",
    ("operations.md", 1): "a Jaeger container",
    ("operations.md", 2): "an OpenTelemetry collector",
    ("providers.md", 1): "an OpenAI key and the network",
    ("providers.md", 2): "an OpenAI key and the network (the Responses API)",
    ("providers.md", 3): "an Anthropic key and the network",
    ("providers.md", 4): "an Ollama server",
    ("runs.md", 1): "illustrative: ids of a run another command started (5b0c…)",
    ("runs.md", 2): "a public webhook target (its address is resolved) and ids it printed",
    ("runs.md", 3): "illustrative: the id of the run it started (7f9c…) and jq",
    ("security.md", 1): "the id of a key a previous command printed (key_3f9a…)",
    ("testing.md", 1): "runs the whole suite, or parts of it (the suite itself)",
    ("tools.md", 1): "a transcript with the server's ids in its output (tests/api cover it)",
    ("tools.md", 2): "a transcript with the server's ids in its output (tests/api cover it)",
    ("tools.md", 3): "a transcript with the server's ids in its output (tests/api cover it)",
    ("tools.md", 4): "a transcript with the server's ids in its output (tests/api cover it)",
    ("tools.md", 5): "a transcript with the server's ids in its output (tests/api cover it)",
    ("tools.md", 6): "a transcript with the server's ids in its output (tests/api cover it)",
}


def blocks() -> dict[tuple[str, int], str]:
    found = {}
    for page in PAGES:
        for n, match in enumerate(BLOCK.finditer(page.read_text(encoding="utf-8")), start=1):
            found[(page.name, n)] = match.group(1)
    return found


def test_every_shell_block_is_run_or_says_why_not() -> None:
    found = set(blocks())
    assert not set(RUN) & set(NOT_RUN)
    assert sorted(found - set(RUN) - set(NOT_RUN)) == []  # a new block: run it, or say why not
    assert sorted((set(RUN) | set(NOT_RUN)) - found) == []


def shell_env(tmp_path: Path, **variables: str) -> dict[str, str]:
    """No CARRYOVER_* from outside; ``carryover``, ``alembic`` and ``python`` of this
    environment first on PATH, importing this tree's app."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CARRYOVER_")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["HOME"] = str(tmp_path)
    env.update(variables)
    return env


#: ``carryover`` as a function: the command of this tree, whatever is installed
PRELUDE = 'carryover() { python -m app.cli "$@"; }\n'


def bash(
    script: str, cwd: Path, env: dict[str, str], check: bool = True
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", PRELUDE + script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
    )
    if check:
        assert done.returncode == 0, (
            f"{script}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
        )
    return done


def shown_outputs(block: str) -> list[str]:
    """The output lines a block shows: the ``# `` lines right after a command line."""
    shown, after_command = [], False
    for line in block.splitlines():
        if line.startswith("# ") and after_command:
            shown.append(line[2:])
        else:
            after_command = bool(line.strip()) and not line.startswith("#")
    return shown


def as_pattern(line: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(piece) for piece in line.split("…")))


def assert_shown(block: str, stdout: str) -> None:
    """Every output line the block shows is printed, in order."""
    printed = stdout.splitlines()
    at = 0
    for expected in shown_outputs(block):
        pattern = as_pattern(expected)
        while at < len(printed) and not pattern.fullmatch(printed[at].rstrip()):
            at += 1
        assert at < len(printed), f"not printed: {expected!r}\n--- stdout\n{stdout}"
        at += 1


def test_the_readme_walk_through_runs_as_written(tmp_path: Path) -> None:
    found = blocks()
    with live_server(tmp_path) as server:
        server.read_until(lambda line: "listening" in line)
        env = shell_env(tmp_path)
        for key in (("README.md", 3), ("README.md", 4)):
            script = found[key].replace("http://127.0.0.1:8000", server.url)
            done = bash(script, tmp_path, env)
            assert_shown(found[key], done.stdout)
    assert shown_outputs(found[("README.md", 3)])  # the check had something to check


def test_the_python_client_generator_runs_as_written(tmp_path: Path) -> None:
    script = blocks()[("clients.md", 1)]
    installed = {
        re.split(r"[=<>\[]", word)[0]
        for line in script.splitlines()
        if line.startswith("pip install ")
        for word in line.split("#")[0].split()[2:]
    }
    # the generator formats with ruff (--fail-on-warning fails without it on PATH)
    assert {"openapi-python-client", "ruff"} <= installed, installed
    # the packages it installs are this environment's: run the rest as written
    runnable = "\n".join(line for line in script.splitlines() if not line.startswith("pip "))
    (tmp_path / "openapi").symlink_to(ROOT / "openapi")
    bash(runnable, tmp_path, shell_env(tmp_path))
    package = tmp_path / "carryover_client"
    imported = set()
    for source in package.rglob("*.py"):
        for match in re.finditer(r"^\s*(?:from|import) ([A-Za-z_]\w*)", source.read_text(), re.M):
            imported.add(match.group(1))
    outside = {name for name in imported if name not in sys.stdlib_module_names}
    assert outside - {"carryover_client"} <= installed, outside  # the page installs them all


def test_the_alembic_commands_run_on_sqlite(tmp_path: Path) -> None:
    script = blocks()[("migrations.md", 1)]
    lines = [line for line in script.splitlines() if not line.startswith("export ")]
    env = shell_env(tmp_path, CARRYOVER_DATABASE_URL=f"sqlite:///{tmp_path / 'carryover.db'}")
    done = bash("\n".join(lines), ROOT, env)
    assert "(head)" in done.stdout and "CREATE TABLE" in done.stdout
    assert (tmp_path / "carryover.db").exists()  # the URL given, not the checkout's


def test_the_quotas_commands_run_on_a_migrated_database(tmp_path: Path) -> None:
    env = shell_env(tmp_path, CARRYOVER_DATABASE_URL=f"sqlite:///{tmp_path / 'carryover.db'}")
    bash("carryover migrate", tmp_path, env)
    done = bash(blocks()[("operations.md", 3)], tmp_path, env)
    assert "tenant 'acme': tokens-per-day 2000000, runs-per-minute 60" in done.stdout
    assert "quotas cleared" in done.stdout


@pytest.mark.parametrize("line", ['# completed "…-2" Echo: I saw 1 message.', "# 202"])
def test_shown_outputs_are_read_from_the_comment_after_a_command(line: str) -> None:
    block = f"# what this does\ncurl -s http://x\n{line}\n"
    assert shown_outputs(block) == [line[2:]]
    assert shown_outputs("# a comment before a command\ncurl -s http://x\n") == []
