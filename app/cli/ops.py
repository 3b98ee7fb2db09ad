"""Operator subcommands of ``carryover`` (docs/operations.md), registered by :mod:`app.cli`:

- ``carryover config [--json]``: the effective configuration, secrets masked, each value with
  where it came from (``env``, ``toml``, ``default``), then what ``serve`` would say of it —
  its errors (exit status 2, as ``serve``), unready profiles and warnings — and whether each
  profile's MCP servers answer (listed now, a few seconds each at most).
- ``carryover quotas set --tenant T [--tokens-per-day N] [--runs-per-minute M]
  [--concurrent-runs K]`` sets a tenant's quotas (the limits not given are kept; 0 removes
  one); ``quotas show [--tenant T]`` lists them; ``quotas clear --tenant T`` removes them.
  Each migrates first.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
from collections.abc import Callable
from typing import Any

from app.agent.messages import MAX_SAFE_INTEGER
from app.config.check import check, effective
from app.observability import configure_logging

from .common import CliError, load_settings, open_database, tenant
from .mcp import reachability


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

    quotas = commands.add_parser(
        "quotas",
        help="set, show and clear per-tenant quotas",
        description="Per-tenant quotas, enforced when a run starts (429 quota-exceeded).",
    )
    actions = quotas.add_subparsers(dest="quotas_command", required=True, metavar="ACTION")
    put = actions.add_parser("set", help="set a tenant's limits (others are kept; 0 removes)")
    put.add_argument("--tenant", required=True, type=tenant)
    for flag, what, most in (
        ("--tokens-per-day", "input + output tokens of runs ended this UTC day", MAX_SAFE_INTEGER),
        ("--runs-per-minute", "runs started in any 60 seconds", _INTEGER),
        ("--concurrent-runs", "runs running at once", _INTEGER),
    ):
        put.add_argument(flag, type=functools.partial(_count, most=most), metavar="N", help=what)
    show = actions.add_parser("show", help="list quotas")
    show.add_argument("--tenant", type=tenant, help="only this tenant's")
    clear = actions.add_parser("clear", help="remove a tenant's quotas")
    clear.add_argument("--tenant", required=True, type=tenant)


#: what a limit stored as INTEGER holds (PostgreSQL's is 32-bit)
_INTEGER = 2**31 - 1


def _count(text: str, most: int) -> int:
    """A limit: a whole number from 0 (no limit) to ``most`` (what its column holds)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if not 0 <= value <= most:
        raise argparse.ArgumentTypeError(f"must be from 0 (no limit) to {most}, got {value}")
    return value


def config_command(args: argparse.Namespace) -> int:
    settings = load_settings()
    rows = effective(settings)
    found = check(settings)
    servers = reachability(settings) if not found.errors else {}
    if args.json:
        document = {
            "settings": [{"name": n, "value": v, "source": s} for n, v, s in rows],
            "errors": found.errors,
            "unready_profiles": found.unready,
            "warnings": found.warnings,
            "mcp_servers": servers,
        }
        print(json.dumps(document, indent=2))
    else:
        width = max(len(name) for name, _, _ in rows)
        value_width = min(60, max(len(value) for _, value, _ in rows))
        for name, value, source in rows:
            print(f"{name.ljust(width)}  {value.ljust(value_width)}  {source}".rstrip())
        for name, why in sorted(found.unready.items()):
            print(f"not ready: agent profile {name!r}: {why}")
        for name, states in servers.items():
            for label, state in states.items():
                print(f"mcp: agent profile {name!r}, server {label!r}: {state}")
        for warning in found.warnings:
            print(f"warning: {warning}")
    if found.errors:
        lines = "".join(f"\n  {message}" for message in found.errors)
        raise CliError(f"invalid configuration:{lines}", status=2)
    return 0


def _limits_text(quota: Any) -> str:
    limits = quota.limits()
    return ", ".join(f"{k.replace('_', '-')} {v}" for k, v in limits.items()) or "no limits"


def quotas_command(args: argparse.Namespace) -> int:
    settings = load_settings()
    level = "DEBUG" if settings.log_level == "DEBUG" else "WARNING"
    configure_logging(level, settings.log_format, settings.secret_values())
    open_database(settings)

    async def act() -> int:
        from app.store.db import make_engine
        from app.store.quotas import QuotaStore

        engine = make_engine(settings.database_url)
        try:
            store = QuotaStore(engine)
            if args.quotas_command == "set":
                limits = {
                    "tokens_per_day": args.tokens_per_day,
                    "runs_per_minute": args.runs_per_minute,
                    "concurrent_runs": args.concurrent_runs,
                }
                if all(v is None for v in limits.values()):
                    raise CliError(
                        "give at least one of --tokens-per-day, --runs-per-minute, "
                        "--concurrent-runs",
                        status=2,
                    )
                quota = await store.set(args.tenant, **limits)
                print(f"tenant {args.tenant!r}: {_limits_text(quota)}")
            elif args.quotas_command == "show":
                found = await store.all()
                rows = [q for q in found if args.tenant in (None, q.tenant)]
                for quota in rows:
                    print(f"{quota.tenant}: {_limits_text(quota)}")
                if not rows:
                    print("no quotas")
            else:
                if not await store.clear(args.tenant):
                    raise CliError(f"tenant {args.tenant!r} has no quotas")
                print(f"tenant {args.tenant!r}: quotas cleared")
            return 0
        finally:
            await engine.dispose()

    return asyncio.run(act())


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "config": config_command,
    "quotas": quotas_command,
}
