"""The documentation leads a newcomer to everything and says what is so: the README's route
table lists every route of the OpenAPI document, it links every page under docs/, its
configuration table names every variable the server reads, every relative link (and anchor)
resolves, no page cites an internal issue number, the error table lists every problem type,
and the statements that once were wrong stay right."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]


def text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def table_rows(markdown: str, header: str) -> list[str]:
    """The first cells of the table whose header row starts with ``header``."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    cells = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells.append(line.split("|")[1])
    return cells


def readme_routes() -> set[tuple[str, str]]:
    found = set()
    for cell in table_rows(text(README), "| route | does |"):
        method = ""
        for item in re.findall(r"`([^`]+)`", cell):
            parts = item.split(" ", 1)
            if len(parts) == 2 and parts[0].isupper():
                method, path = parts
            else:
                path = parts[0]
            path = path.replace("…", "/conversations/{id}")
            found.add((method, path))
    return found


def test_the_readme_route_table_lists_every_route() -> None:
    document = json.loads(text(ROOT / "openapi" / "openapi.json"))
    listed = readme_routes()
    missing = [
        (method.upper(), path)
        for path, operations in document["paths"].items()
        for method in operations
        if (method.upper(), path.replace("{conversation_id}", "{id}")) not in listed
    ]
    assert missing == []


def test_the_readme_links_every_page_of_the_docs() -> None:
    readme = text(README)
    assert [p.name for p in DOCS if f"(docs/{p.name}" not in readme] == []


def test_the_readme_names_every_variable_or_carryover_config() -> None:
    from app.config.check import known_variables

    readme = text(README)
    named = set()
    for cell in table_rows(readme, "| variable | default | meaning |"):
        names = re.findall(r"`([A-Z0-9_]+)`", cell)
        for name in names:
            named.add(name if not name.startswith("_") else "CARRYOVER" + name)
    assert sorted(known_variables() - named) == []
    assert "`carryover config`" in readme


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    value = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return value.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    body = re.sub(r"```.*?```", "", text(path), flags=re.S)
    return {slug(m) for m in re.findall(r"^#+ (.+)$", body, flags=re.M)}


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_relative_link_resolves(page: Path) -> None:
    body = re.sub(r"```.*?```", "", text(page), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", body):
        if re.match(r"[a-z]+:", target):
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (page.parent / file_part).resolve() if file_part else page
        if not resolved.exists():
            broken.append(target)
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(target)
    assert broken == []


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_no_page_cites_an_issue_number(page: Path) -> None:
    assert re.findall(r"(?i)\bissues? \d+|issue-\d+|\(#\d+\)", text(page)) == []


def test_the_error_table_lists_every_problem_type() -> None:
    from app.api.problems import PROBLEM_TYPES

    contract = text(ROOT / "docs" / "contract.md")
    table = contract[contract.index("| status | slugs |") : contract.index("Bad input is always")]
    after = contract[contract.index("Bad input is always") :]
    in_table = set(re.findall(r"`([a-z-]+)`", table))
    missing = [
        s
        for s in PROBLEM_TYPES
        if s not in in_table and not (s.startswith("run-") and f"`{s}`" in after)
    ]
    assert missing == []


def test_performance_reads_as_user_docs() -> None:
    page = text(ROOT / "docs" / "performance.md")
    assert re.findall(r"(?i)\bsession \d|\bround \d|before this work", page) == []
    assert re.findall(r"`[0-9a-f]{7,40}`", page) == []  # no commits: history is git's
    assert "## How to measure" in page and "## What it costs" in page
    referenced = set(re.findall(r"perf/([\w.-]+)", page))
    assert {p.name for p in (ROOT / "docs" / "perf").iterdir()} <= referenced  # none left over


def test_what_was_said_wrong_stays_right() -> None:
    readme, security = text(README), text(ROOT / "docs" / "security.md")
    for page in (readme, security):
        assert "token budget or storage" not in page
        assert "quota-exceeded" in page  # quotas exist, and say how they refuse
    assert "never a 500" not in text(ROOT / "docs" / "faults.md")
    assert "(embedded, one process)" not in readme
    assert "`concurrent-runs` rather" not in text(ROOT / "docs" / "operations.md")
    contract = text(ROOT / "docs" / "contract.md")
    assert "`quota-exceeded`" in contract and "`unsafe-cut`" in contract
