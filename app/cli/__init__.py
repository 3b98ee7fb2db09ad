"""The ``carryover`` command: ``serve``, ``migrate``, ``keys`` and ``openapi`` (docs/contract.md
"Running it"), and ``chat`` (app/chat, docs/chat.md).

- ``carryover serve [--host H] [--port P] [--workers N]`` migrates the database to head, then
  serves the app factory ``app.api.app:create_app`` with uvicorn. It refuses a non-loopback
  host when no API keys are configured (none in ``CARRYOVER_API_KEYS``, none active in the
  database), unless ``CARRYOVER_ALLOW_UNAUTHENTICATED_PUBLIC`` is set. Its banner ("… listening
  on URL") is printed once the port accepts connections, as a JSON line with
  ``CARRYOVER_LOG_FORMAT=json`` (``app/cli/serve.py``).
- ``carryover migrate [--downgrade REVISION]`` only migrates (to head, or down to REVISION,
  e.g. ``base``).
- ``carryover keys create --tenant NAME`` creates an API key bound to a tenant and prints it
  (once: only its SHA-256 and a short prefix are stored); ``carryover keys list [--tenant NAME]``
  shows id, tenant, prefix, created and revoked; ``carryover keys revoke ID`` revokes one (a
  running server refuses it within ``CARRYOVER_API_KEY_CACHE_SECONDS``) (``app/cli/keys.py``).
- The operator commands (``keys``, ``webhooks``, ``quotas``) say on stderr which database they
  use and refuse one that does not exist or is not migrated: only ``serve`` and ``migrate``
  create a database (``app/cli/common.py``).
- ``carryover webhooks add|list|remove|deliveries``: webhook endpoints per tenant
  (``app/cli/webhooks.py``).
- ``carryover openapi [--output PATH] [--check]`` writes the app's OpenAPI document (and, beside
  it, ``v1.json``: the document of the ``/v1`` surface) as stable
  JSON (sorted keys, two-space indent, trailing newline), or checks the committed one.
- ``carryover conversations …`` (``app/cli/conversations.py``), ``carryover config`` and
  ``carryover quotas …`` (``app/cli/ops.py``), ``carryover check`` (damaged stored messages,
  ``app/cli/check.py``), ``carryover mcp list`` (what an MCP server offers, ``app/cli/mcp.py``).

What the subcommands share (:class:`CliError`, the settings, the migration) is in
``app/cli/common.py``; this module holds the parser, ``migrate``, ``openapi`` and the dispatch.

Exit status: 0 on success, 1 when an operation failed, 2 for a usage or configuration error.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app import chat
from app.config import Settings, default_settings
from app.observability import banner_line, configure_logging

from . import check, conversations, mcp, ops
from .common import APP_FACTORY, CliError, load_settings, migrate_database, version
from .keys import add_keys_parser, keys_command
from .serve import add_serve_parser, serve_command
from .webhooks import add_webhooks_parser, webhooks_command

if TYPE_CHECKING:
    from fastapi import FastAPI


DEFAULT_OPENAPI_PATH = Path("openapi/openapi.json")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="carryover",
        description="HTTP conversation service for LLM agents.",
        epilog="Configuration comes from CARRYOVER_* environment variables "
        "(and CARRYOVER_CONFIG_FILE for agent profiles).",
    )
    parser.add_argument("--version", action="version", version=f"carryover {version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    add_serve_parser(commands)

    migrate = commands.add_parser("migrate", help="migrate the database and exit")
    migrate.add_argument(
        "--downgrade",
        metavar="REVISION",
        help="downgrade to REVISION instead of upgrading to head ('base' empties the schema)",
    )

    add_keys_parser(commands)
    add_webhooks_parser(commands)

    openapi = commands.add_parser("openapi", help="write the OpenAPI document")
    openapi.add_argument(
        "--output",
        "-o",
        type=Path,
        default=DEFAULT_OPENAPI_PATH,
        help=f"where to write it ('-' for stdout; default: {DEFAULT_OPENAPI_PATH})",
    )
    openapi.add_argument(
        "--check",
        action="store_true",
        help="do not write: exit 1 if the file differs from what the app serves",
    )
    chat.add_parser(commands)
    conversations.add_parser(commands)
    ops.add_parsers(commands)
    check.add_parser(commands)
    mcp.add_parser(commands)
    return parser


def migrate_command(args: argparse.Namespace) -> int:
    settings = load_settings()
    configure_logging(settings.log_level, settings.log_format, settings.secret_values())
    migrate_database(settings, args.downgrade)
    target = f"down to {args.downgrade}" if args.downgrade else "to head"
    print(f"migrated {settings.database_url_display} {target}")
    return 0


# --- openapi ---------------------------------------------------------------------------------


def openapi_json(document: Mapping[str, Any]) -> str:
    """The committed form of an OpenAPI document: sorted keys, 2-space indent, final newline."""
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def load_app() -> FastAPI:
    """The app ``serve`` runs, built by the same factory, for its OpenAPI document.

    It is built from the default settings, not the environment: the document does not depend
    on configuration, so every machine writes the same file, and a variable that does not
    validate (or holds a secret) cannot reach it.
    """
    module_name, _, factory = APP_FACTORY.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        raise CliError(f"the app factory {APP_FACTORY} does not exist yet") from exc
    create_app: Callable[[Settings], FastAPI] = getattr(module, factory)
    return create_app(default_settings())


def mounted_documents(app: FastAPI) -> dict[str, dict[str, Any]]:
    """The documents of the apps mounted in ``app`` (the ``/v1`` surface: ``v1.json``), which
    the app's own document leaves out, by the file name they are committed under."""
    from fastapi import FastAPI
    from starlette.routing import Mount

    return {
        f"{route.path.strip('/')}.json": route.app.openapi()
        for route in app.routes
        if isinstance(route, Mount) and isinstance(route.app, FastAPI)
    }


def openapi_command(args: argparse.Namespace) -> int:
    app = load_app()
    output: Path = args.output
    if str(output) == "-":
        sys.stdout.write(openapi_json(app.openapi()))
        return 0
    # the app's document at OUTPUT, each mounted app's beside it (openapi/v1.json)
    files = {output: openapi_json(app.openapi())}
    for name, document in mounted_documents(app).items():
        files[output.parent / name] = openapi_json(document)
    if args.check:
        for path, text in files.items():
            current = path.read_text(encoding="utf-8") if path.exists() else None
            if current != text:
                raise CliError(
                    f"{path} is not what the app serves; run 'carryover openapi -o {output}'"
                )
            print(f"{path} is up to date")
        return 0
    output.parent.mkdir(parents=True, exist_ok=True)
    for path, text in files.items():
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}", file=sys.stderr)  # stdout stays clean for a redirect
    return 0


COMMANDS = {
    "serve": serve_command,
    "webhooks": webhooks_command,
    "migrate": migrate_command,
    "keys": keys_command,
    "openapi": openapi_command,
    "chat": chat.command,
    "conversations": conversations.command,
    **ops.COMMANDS,
    **check.COMMANDS,
    **mcp.COMMANDS,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except CliError as exc:
        # JSON logs stay JSON to the last line (the settings may be what failed: read the
        # variable itself)
        fmt = os.environ.get("CARRYOVER_LOG_FORMAT", "text").strip().lower()
        line = banner_line(f"carryover: {exc}", fmt, logger="carryover", level=logging.ERROR)
        print(line, file=sys.stderr)
        return exc.status
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader left (``carryover config | head``): no traceback, and none at exit when
        # Python flushes stdout again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # as a shell reports a command ended by SIGPIPE


__all__ = [
    "APP_FACTORY",
    "CliError",
    "build_parser",
    "default_settings",
    "load_app",
    "main",
    "openapi_json",
]
