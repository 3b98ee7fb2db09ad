"""Operator subcommands of ``carryover`` (docs/operations.md), registered by :mod:`app.cli`:

- ``carryover config [--json]``: the effective configuration, secrets masked, each value with
  where it came from (``env``, ``toml``, ``default``), then what ``serve`` would say of it —
  its errors (exit status 2, as ``serve``), unready profiles and warnings.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any


def add_parsers(commands: Any) -> None:
    """Add this module's subcommands to ``carryover``'s subparsers."""
    config = commands.add_parser(
        "config",
        help="print the effective configuration (secrets masked) and check it",
        description="Every setting and agent profile field with its value (secrets masked) "
        "and where it came from: env (a variable), toml (CARRYOVER_CONFIG_FILE) or default. "
        "Exit status 2 when 'carryover serve' would refuse to start.",
    )
    config.add_argument("--json", action="store_true", help="one JSON document")


def config_command(args: argparse.Namespace) -> int:
    from .cli import CliError, load_settings
    from .config_check import check, effective

    settings = load_settings()
    rows = effective(settings)
    found = check(settings)
    if args.json:
        document = {
            "settings": [{"name": n, "value": v, "source": s} for n, v, s in rows],
            "errors": found.errors,
            "unready_profiles": found.unready,
            "warnings": found.warnings,
        }
        print(json.dumps(document, indent=2))
    else:
        width = max(len(name) for name, _, _ in rows)
        value_width = min(60, max(len(value) for _, value, _ in rows))
        for name, value, source in rows:
            print(f"{name.ljust(width)}  {value.ljust(value_width)}  {source}".rstrip())
        for name, why in sorted(found.unready.items()):
            print(f"not ready: agent profile {name!r}: {why}")
        for warning in found.warnings:
            print(f"warning: {warning}")
    if found.errors:
        lines = "".join(f"\n  {message}" for message in found.errors)
        raise CliError(f"invalid configuration:{lines}", status=2)
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"config": config_command}
