"""The layer contract (docs/architecture.md): every module of ``app`` imports only from its own
layer or the layers below it. Read from the source (an AST walk, no import), so a module that
would import an upper layer lazily, inside a function or under ``TYPE_CHECKING``, counts too.

    base     app.clock, app.errors, app.etag, app.telemetry  (import nothing of app but each other)
    agent    app.agent
    config   app.config, app.config_check, app.config_keys, app.config_profiles,
             app.observability  (settings and metrics)
    store    app.store
    service  app.service
    api      app.api
    top      app.cli, app.cli_ops, app.cli_keys, app.cli_serve, app.chat, app.__main__,
             app (package)

``app.chat`` (the terminal client) is a client of the HTTP API: besides the package (and its own
modules) it imports nothing of ``app`` at all, whatever its rank allows.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parents[2] / "app"

#: layer → rank; a module may import a module of equal or lower rank
RANKS = {"base": 0, "agent": 1, "config": 2, "store": 3, "service": 4, "api": 5, "top": 6}

#: where each part of ``app`` sits (the longest matching prefix wins)
LAYERS = {
    "app.addresses": "base",
    "app.clock": "base",
    "app.errors": "base",
    "app.etag": "base",
    "app.telemetry": "base",
    "app.agent": "agent",
    "app.config": "config",
    "app.config_check": "config",
    "app.config_keys": "config",
    "app.config_profiles": "config",
    "app.observability": "config",
    "app.store": "store",
    "app.service": "service",
    "app.api": "api",
    "app.cli": "top",
    "app.chat": "top",
    "app.cli_webhooks": "top",
    "app.cli_conversations": "top",
    "app.cli_ops": "top",
    "app.cli_keys": "top",
    "app.cli_serve": "top",
    "app.__main__": "top",
}
#: the package itself (``__version__``) is below everything
PACKAGE = ("app", "app.__version__")

#: what may not be imported even by a lower rank's rules (the agent is a plain library)
AGENT_MAY_NOT_IMPORT = ("app.config", "app.observability")

#: modules that talk to the service over HTTP only: they import nothing of app but the package
#: (and their own modules)
CLIENTS = ("app.chat",)


def layer_of(module: str) -> str:
    if module in PACKAGE:
        return "base"
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        found = LAYERS.get(".".join(parts[:n]))
        if found is not None:
            return found
    raise AssertionError(f"{module} is in no layer: add it to LAYERS and docs/architecture.md")


def module_name(path: Path, root: Path) -> str:
    relative = path.relative_to(root.parent).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(path: Path, module: str) -> list[tuple[int, str]]:
    """Every ``app…`` module this file imports, with its line (relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            # ``from app import cli`` / ``from . import routes``: the names may be modules
            found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names]
    return [(line, name) for line, name in found if name == "app" or name.startswith("app.")]


def violations(root: Path = APP) -> list[str]:
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        module = module_name(path, root)
        layer = layer_of(module)
        lines: set[int] = set()
        for line, target in imported(path, module):
            if line in lines:
                continue  # one finding per import statement
            target_layer = layer_of(target)
            where = f"{path.relative_to(root.parent)}:{line}"
            if RANKS[target_layer] > RANKS[layer]:
                found.append(f"{where}: {module} ({layer}) imports {target} ({target_layer})")
                lines.add(line)
            elif layer == "agent" and target.startswith(AGENT_MAY_NOT_IMPORT):
                found.append(f"{where}: {module} (agent) imports {target}")
                lines.add(line)
            elif _is_client(module) and target not in PACKAGE and not _is_client(target):
                found.append(f"{where}: {module} (an HTTP client) imports {target}")
                lines.add(line)
    return found


def _is_client(module: str) -> bool:
    return any(module == c or module.startswith(c + ".") for c in CLIENTS)


def test_every_module_imports_only_its_layer_and_below() -> None:
    assert violations() == []


def test_the_contract_catches_an_upward_import(tmp_path: Path) -> None:
    """The walk sees an upward import, lazy ones included (a copy of app with one added)."""
    copy = tmp_path / "app"
    for path in APP.rglob("*.py"):
        target = copy / path.relative_to(APP)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    runs = copy / "service" / "runs.py"
    runs.write_text(
        runs.read_text(encoding="utf-8")
        + "\n\ndef _late() -> None:\n    from app.api import views\n",
        encoding="utf-8",
    )
    store = copy / "store" / "db.py"
    store.write_text(
        store.read_text(encoding="utf-8") + "\nfrom ..service import runs\n", encoding="utf-8"
    )
    chat = copy / "chat" / "__init__.py"
    chat.write_text(
        chat.read_text(encoding="utf-8")
        + "\n\ndef _late() -> None:\n    from app.store import runs\n",
        encoding="utf-8",
    )
    found = violations(copy)
    assert any("app.chat (an HTTP client) imports app.store" in v for v in found), found
    assert any("app.service.runs (service) imports app.api" in v for v in found), found
    assert any("app.store.db (store) imports app.service" in v for v in found), found


@pytest.mark.parametrize(
    ("module", "layer"),
    [
        ("app.etag", "base"),
        ("app.store.repository", "store"),
        ("app.service.runs", "service"),
        ("app.api.routes.runs", "api"),
        ("app.cli", "top"),
        ("app.chat", "top"),
    ],
)
def test_layers_are_assigned_by_longest_prefix(module: str, layer: str) -> None:
    assert layer_of(module) == layer
