"""The ``carryover`` command: ``serve``, ``migrate``, ``keys`` and ``openapi`` (docs/contract.md
"Running it"), and ``chat`` (app/chat.py, docs/chat.md).

- ``carryover serve [--host H] [--port P] [--workers N]`` migrates the database to head, then
  serves the app factory ``app.api.app:create_app`` with uvicorn. It refuses a non-loopback
  host when no API keys are configured (none in ``CARRYOVER_API_KEYS``, none active in the
  database), unless ``CARRYOVER_ALLOW_UNAUTHENTICATED_PUBLIC`` is set. Its banner ("… listening
  on URL") is printed once the port accepts connections, as a JSON line with
  ``CARRYOVER_LOG_FORMAT=json`` (``app/cli_serve.py``; :func:`run_server` stays here).
- ``carryover migrate [--downgrade REVISION]`` only migrates (to head, or down to REVISION,
  e.g. ``base``).
- ``carryover keys create --tenant NAME`` creates an API key bound to a tenant and prints it
  (once: only its SHA-256 and a short prefix are stored); ``carryover keys list [--tenant NAME]``
  shows id, tenant, prefix, created and revoked; ``carryover keys revoke ID`` revokes one (a
  running server refuses it within ``CARRYOVER_API_KEY_CACHE_SECONDS``). Each migrates first
  (``app/cli_keys.py``).
- ``carryover webhooks add|list|remove|deliveries``: webhook endpoints per tenant
  (``app/cli_webhooks.py``).
- ``carryover openapi [--output PATH] [--check]`` writes the app's OpenAPI document as stable
  JSON (sorted keys, two-space indent, trailing newline), or checks the committed one.

Exit status: 0 on success, 1 when an operation failed, 2 for a usage or configuration error.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from . import chat, cli_conversations
from .cli_keys import _timestamp as _timestamp  # re-exported: app.cli_webhooks reads it here
from .cli_keys import add_keys_parser, keys_command
from .cli_serve import add_serve_parser, serve
from .cli_serve import banner as banner
from .cli_serve import describe as describe
from .config import (
    TENANT_NAME,
    Settings,
    default_settings,
    get_settings,
)
from .config_check import settings_errors
from .observability import RedactSecrets, banner_line, configure_logging

if TYPE_CHECKING:
    import socket

    import uvicorn
    from fastapi import FastAPI


APP_FACTORY = "app.api.app:create_app"
DEFAULT_OPENAPI_PATH = Path("openapi/openapi.json")


class CliError(Exception):
    """A failure reported as one line on stderr, with an exit status."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def _version() -> str:
    try:
        return metadata.version("carryover")
    except metadata.PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="carryover",
        description="HTTP conversation service for LLM agents.",
        epilog="Configuration comes from CARRYOVER_* environment variables "
        "(and CARRYOVER_CONFIG_FILE for agent profiles).",
    )
    parser.add_argument("--version", action="version", version=f"carryover {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    add_serve_parser(commands)

    migrate = commands.add_parser("migrate", help="migrate the database and exit")
    migrate.add_argument(
        "--downgrade",
        metavar="REVISION",
        help="downgrade to REVISION instead of upgrading to head ('base' empties the schema)",
    )

    add_keys_parser(commands)

    from .cli_webhooks import add_webhooks_parser

    add_webhooks_parser(commands, _tenant)

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
    cli_conversations.add_parser(commands)
    from . import cli_ops

    cli_ops.add_parsers(commands)
    return parser


def _tenant(text: str) -> str:
    if not TENANT_NAME.match(text):
        raise argparse.ArgumentTypeError(
            f"{text!r}: a tenant is 1-64 letters, digits, '.', '_' or '-', starting with a "
            "letter or digit"
        )
    return text


def load_settings(**overrides: Any) -> Settings:
    """Settings from the environment, with command-line values (those not ``None``) on top."""
    given = {name: value for name, value in overrides.items() if value is not None}
    try:
        return Settings(**given) if given else get_settings()
    except ValidationError as exc:
        lines = "".join(f"\n  {message}" for message in settings_errors(exc))
        raise CliError(f"invalid configuration:{lines}", status=2) from None


def check_startup(settings: Settings) -> list[str]:
    """Resolve every tool and key now (app.config_check): a broken one stops ``serve`` with
    status 2, before the port is bound. What can wait is returned, to be logged."""
    from .config_check import check

    found = check(settings)
    if found.errors:
        lines = "".join(f"\n  {message}" for message in found.errors)
        raise CliError(f"invalid configuration:{lines}", status=2)
    return found.warnings + [
        f"agent profile {name!r} cannot run: {why}; /readyz answers 503 until it is set"
        for name, why in sorted(found.unready.items())
    ]


# --- migrations ------------------------------------------------------------------------------
# app.store.migrate (storage) provides ``async def upgrade(url)`` and
# ``async def downgrade(url, revision)``; imported here, lazily, so ``--help`` stays fast.


def _migrate(settings: Settings, downgrade_to: str | None = None) -> None:
    from app.store import migrate

    redact = RedactSecrets(settings.secret_values())
    try:
        if downgrade_to is None:
            asyncio.run(migrate.upgrade(settings.database_url))
        else:
            asyncio.run(migrate.downgrade(settings.database_url, downgrade_to))
    except Exception as exc:
        raise CliError(
            f"migrating {settings.database_url_display} failed: "
            f"{redact.redact(str(exc)) or type(exc).__name__}"
        ) from exc


def migrate_command(args: argparse.Namespace) -> int:
    settings = load_settings()
    configure_logging(settings.log_level, settings.log_format, settings.secret_values())
    _migrate(settings, args.downgrade)
    target = f"down to {args.downgrade}" if args.downgrade else "to head"
    print(f"migrated {settings.database_url_display} {target}")
    return 0


# --- serve (the command itself: app/cli_serve.py) --------------------------------------------
# tests patch ``app.cli.run_server``: app.cli_serve reads it here, when it serves


def run_server(config: uvicorn.Config, on_listening: Callable[[], None]) -> bool:
    """Serve ``config`` as ``uvicorn.run`` does, calling ``on_listening`` once the port accepts
    connections: with one worker when the server has bound it (after the app's startup), with
    several once the shared socket listens (connections wait in its backlog until a worker
    takes them). Whether the server started."""
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    if config.workers > 1:
        sock = config.bind_socket()
        sock.listen(config.backlog)
        on_listening()
        try:
            Multiprocess(config, sockets=[sock]).run()
        except KeyboardInterrupt:
            pass
        return True

    class AnnouncingServer(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started:
                on_listening()

    server = AnnouncingServer(config)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    return server.started


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


def openapi_command(args: argparse.Namespace) -> int:
    text = openapi_json(load_app().openapi())
    output: Path = args.output
    if str(output) == "-":
        sys.stdout.write(text)
        return 0
    if args.check:
        current = output.read_text(encoding="utf-8") if output.exists() else None
        if current != text:
            raise CliError(
                f"{output} is not what the app serves; run 'carryover openapi -o {output}'"
            )
        print(f"{output} is up to date")
        return 0
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text, encoding="utf-8")
    print(f"wrote {output}", file=sys.stderr)  # stdout stays clean for a redirect
    return 0


def webhooks_command(args: argparse.Namespace) -> int:
    from .cli_webhooks import webhooks_command as run

    return run(args)


COMMANDS = {
    "serve": serve,
    "webhooks": webhooks_command,
    "migrate": migrate_command,
    "keys": keys_command,
    "openapi": openapi_command,
    "chat": chat.command,
    "conversations": cli_conversations.command,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from . import cli_ops

    try:
        return {**COMMANDS, **cli_ops.COMMANDS}[args.command](args)
    except CliError as exc:
        # JSON logs stay JSON to the last line (the settings may be what failed: read the
        # variable itself)
        fmt = os.environ.get("CARRYOVER_LOG_FORMAT", "text").strip().lower()
        line = banner_line(f"carryover: {exc}", fmt, logger="carryover", level=logging.ERROR)
        print(line, file=sys.stderr)
        return exc.status
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    # ``python -m app.cli``: run the module as ``app.cli`` (not ``__main__``), so app.cli_ops
    # and this share one CliError
    from app.cli import main as _main

    sys.exit(_main())
