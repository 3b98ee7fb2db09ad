"""The layer contract (docs/architecture.md): every module of ``app`` imports only from its own
layer or the layers below it. Read from the source (an AST walk, no import), so a module that
would import an upper layer lazily, inside a function or under ``TYPE_CHECKING``, counts too.

    base     app.addresses, app.clock, app.errors, app.etag, app.telemetry, app.tls
             (import nothing of app but each other)
    agent    app.agent
    config   app.config, app.observability  (settings and metrics)
    store    app.store
    service  app.service
    api      app.api
    top      app.cli, app.chat

``app.chat`` (the terminal client) is a client of the HTTP API: besides the package (and its own
modules) it imports nothing of ``app`` at all, whatever its rank allows.

Within a layer, the modules import each other without a circle: the graph of which module
imports which has no cycle. Its edges are the imports that run: at module level and inside
functions alike (a lazy import is still a dependency: a subcommand that takes a helper back
from the package that imports it is a circle, whenever it runs), but not those under
``if TYPE_CHECKING:``, which never run (an annotation may name a type of a module that imports
this one). ``from P import name`` is an edge to the module ``P.name`` when there is one, else to
``P``; the implicit import of a module's parent packages is not an edge (a package's
``__init__`` may re-export its own modules).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping
from itertools import pairwise
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
    "app.tls": "base",
    "app.agent": "agent",
    "app.config": "config",
    "app.observability": "config",
    "app.store": "store",
    "app.service": "service",
    "app.api": "api",
    "app.cli": "top",
    "app.chat": "top",
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


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _running_imports(
    nodes: Iterable[ast.AST], *, type_only: bool = False
) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements among ``nodes`` and inside them, but those under
    ``if TYPE_CHECKING:`` (its ``else`` runs) unless ``type_only``."""
    for node in nodes:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and _type_checking(node.test) and not type_only:
            yield from _running_imports(node.orelse)
        else:
            yield from _running_imports(ast.iter_child_nodes(node), type_only=type_only)


def import_graph(root: Path = APP, *, type_only: bool = False) -> dict[str, dict[str, int]]:
    """module → the modules of ``app`` it imports (see the module), each with its first line;
    with ``type_only``, the imports under ``if TYPE_CHECKING:`` count too."""
    paths = {module_name(path, root): path for path in sorted(root.rglob("*.py"))}
    graph: dict[str, dict[str, int]] = {}
    for module, path in paths.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        edges: dict[str, int] = {}
        for node in _running_imports(tree.body, type_only=type_only):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                source = _resolve(node, package)
                targets = [
                    f"{source}.{alias.name}" if f"{source}.{alias.name}" in paths else source
                    for alias in node.names
                ]
            for target in targets:
                if target in paths and target != module:
                    edges.setdefault(target, node.lineno)
        graph[module] = edges
    return graph


def _resolve(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    base = package.split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def cycles(graph: Mapping[str, Mapping[str, int]]) -> list[list[str]]:
    """The cycles of ``graph`` (``[a, b, …, a]``) a depth-first walk meets, each set of modules
    once; ``[]`` when it has none."""
    found: list[list[str]] = []
    state: dict[str, str] = {}  # "open" while on the path, "done" once every edge is seen
    path: list[str] = []
    seen_parts: set[frozenset[str]] = set()

    def visit(module: str) -> None:
        state[module] = "open"
        path.append(module)
        for target in sorted(graph.get(module, {})):
            if state.get(target) == "open":
                cycle = [*path[path.index(target) :], target]
                part = frozenset(cycle)
                if not any(part <= seen for seen in seen_parts):
                    seen_parts.add(part)
                    found.append(cycle)
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module)
    return found


def test_the_import_graph_has_no_cycle() -> None:
    graph = import_graph()
    assert cycles(graph) == [], [
        " → ".join([*(f"{a} (line {graph[a][b]})" for a, b in pairwise(cycle)), cycle[-1]])
        for cycle in cycles(graph)
    ]


def test_not_even_the_type_annotations_import_in_a_circle() -> None:
    """A circle only through ``if TYPE_CHECKING:`` imports never runs, but a reader still has
    to hold both modules in mind at once: there is none (a function takes a ``Protocol`` of
    what it reads instead, as ``app.agent.tokens.RunChanges``)."""
    graph = import_graph(type_only=True)
    assert cycles(graph) == [], [" → ".join(cycle) for cycle in cycles(graph)]


def test_the_cycle_check_sees_a_lazy_circle_but_not_a_type_only_one(tmp_path: Path) -> None:
    package = tmp_path / "app"
    (package / "cli").mkdir(parents=True)
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "cli" / "__init__.py").write_text("from .keys import run\n", encoding="utf-8")
    (package / "cli" / "keys.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from .serve import Server\n"
        "def run() -> None:\n"
        "    from app.cli import CliError\n",
        encoding="utf-8",
    )
    (package / "cli" / "serve.py").write_text("from . import keys\n", encoding="utf-8")
    graph = import_graph(package)
    assert graph["app.cli.keys"] == {"app.cli": 5}
    assert graph["app.cli.serve"] == {"app.cli.keys": 1}
    assert cycles(graph) == [["app.cli", "app.cli.keys", "app.cli"]]
    with_types = import_graph(package, type_only=True)
    assert with_types["app.cli.keys"] == {"app.cli.serve": 3, "app.cli": 5}
    assert ["app.cli.keys", "app.cli.serve", "app.cli.keys"] in cycles(with_types)


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
        ("app.store.stores", "store"),
        ("app.service.runs", "service"),
        ("app.api.routes.runs", "api"),
        ("app.cli", "top"),
        ("app.chat", "top"),
    ],
)
def test_layers_are_assigned_by_longest_prefix(module: str, layer: str) -> None:
    assert layer_of(module) == layer


def test_routes_holds_only_route_modules() -> None:
    """``app/api/routes/`` holds the modules that declare routes (``@router.get(…)`` and the
    like); what they share lives in ``app/api/``."""
    routes = APP / "api" / "routes"
    without = [
        path.name
        for path in sorted(routes.glob("*.py"))
        if path.name != "__init__.py"
        and not any(
            isinstance(decorator, ast.Call)
            and isinstance(decorator.func, ast.Attribute)
            and isinstance(decorator.func.value, ast.Name)
            and decorator.func.value.id == "router"
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            for decorator in node.decorator_list
        )
    ]
    assert without == []
