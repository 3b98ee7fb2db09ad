"""The ``carryover`` command: ``serve``, ``migrate``, ``keys`` and ``openapi`` (docs/contract.md
"Running it"), and ``chat`` (app/chat.py, docs/chat.md).

- ``carryover serve [--host H] [--port P] [--workers N]`` migrates the database to head, then
  serves the app factory ``app.api.app:create_app`` with uvicorn. It refuses a non-loopback
  host when no API keys are configured (none in ``CARRYOVER_API_KEYS``, none active in the
  database), unless ``CARRYOVER_ALLOW_UNAUTHENTICATED_PUBLIC`` is set. Its banner ("… listening
  on URL") is printed once the port accepts connections, as a JSON line with
  ``CARRYOVER_LOG_FORMAT=json``.
- ``carryover migrate [--downgrade REVISION]`` only migrates (to head, or down to REVISION,
  e.g. ``base``).
- ``carryover keys create --tenant NAME`` creates an API key bound to a tenant and prints it
  (once: only its SHA-256 and a short prefix are stored); ``carryover keys list [--tenant NAME]``
  shows id, tenant, prefix, created and revoked; ``carryover keys revoke ID`` revokes one (a
  running server refuses it within ``CARRYOVER_API_KEY_CACHE_SECONDS``). Each migrates first.
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
import shutil
import sys
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import ValidationError

from . import chat, cli_conversations
from .config import (
    TENANT_NAME,
    Settings,
    default_settings,
    get_settings,
    is_loopback,
)
from .config_check import settings_errors
from .observability import RedactSecrets, banner_line, configure_logging, logging_config

if TYPE_CHECKING:
    import socket

    import uvicorn
    from fastapi import FastAPI

    from app.store.keys import KeyStore

T = TypeVar("T")

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

    serve = commands.add_parser("serve", help="apply migrations, then serve HTTP")
    serve.add_argument("--host", help="interface to listen on (default: CARRYOVER_HOST, 127.0.0.1)")
    serve.add_argument("--port", type=_port, help="TCP port (default: CARRYOVER_PORT, 8000)")
    serve.add_argument(
        "--workers", type=_positive, help="worker processes (default: CARRYOVER_WORKERS, 1)"
    )

    migrate = commands.add_parser("migrate", help="migrate the database and exit")
    migrate.add_argument(
        "--downgrade",
        metavar="REVISION",
        help="downgrade to REVISION instead of upgrading to head ('base' empties the schema)",
    )

    keys = commands.add_parser(
        "keys",
        help="create, list and revoke API keys",
        description="API keys kept in the database, each bound to a tenant. They work next to "
        "CARRYOVER_API_KEYS; once any key exists, every request needs one.",
    )
    actions = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="create a key for a tenant and print it once")
    create.add_argument("--tenant", required=True, type=_tenant, help="the tenant it acts as")
    listing = actions.add_parser("list", help="list keys (never the keys themselves)")
    listing.add_argument("--tenant", type=_tenant, help="only this tenant's keys")
    revoke = actions.add_parser("revoke", help="revoke a key by its id")
    revoke.add_argument("id", help="the key's id, as 'keys list' shows it")

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


def _port(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be between 1 and 65535, got {value}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


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


# --- serve -----------------------------------------------------------------------------------


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _access(settings: Settings, db_keys: int | None) -> str:
    stored = f", {db_keys} key(s) in the database" if db_keys else ""
    if settings.api_keys:
        return f"API keys for {len(settings.api_keys.tenants)} tenant(s){stored}"
    if db_keys:
        return f"API keys required ({db_keys} key(s) in the database)"
    if db_keys is None:
        return "the database's API keys could not be counted; requests need a key if it holds any"
    if settings.allow_unauthenticated_public and not is_loopback(settings.host):
        return "NO authentication (CARRYOVER_ALLOW_UNAUTHENTICATED_PUBLIC is set)"
    return "no API keys configured: no authentication, loopback only"


def describe(settings: Settings, db_keys: int | None = 0) -> str:
    """What ``serve`` says once it listens: where, which agent, which database, which access
    rule.

    ``db_keys``: active keys in the database, ``None`` when they could not be counted.
    """
    profile = settings.profile()
    names = ", ".join(sorted(settings.profiles()))
    workers = f"{settings.workers} worker" + ("s" if settings.workers != 1 else "")
    model = f", model {profile.model}" if profile.model else ""
    base = f", base URL {profile.base_url}" if profile.base_url else ""
    return "\n".join(
        [
            f"Carryover {_version()} listening on {_url(settings.host, settings.port)} ({workers})",
            f"  agent profile 'default': provider {profile.provider}{model}{base}",
            f"  agent profiles: {names}",
            f"  database: {settings.database_url_display}",
            f"  access: {_access(settings, db_keys)}",
        ]
    )


def banner(settings: Settings, db_keys: int | None = 0) -> str:
    """:func:`describe` in the configured log format: as is, or one JSON line whose
    ``message`` is its first line and whose fields carry the rest."""
    if settings.log_format != "json":
        return describe(settings, db_keys)
    profile = settings.profile()
    return banner_line(
        describe(settings, db_keys).splitlines()[0],
        "json",
        logger="carryover.serve",
        url=_url(settings.host, settings.port),
        workers=settings.workers,
        provider=profile.provider,
        model=profile.model,
        base_url=profile.base_url,
        profiles=sorted(settings.profiles()),
        database=settings.database_url_display,
        access=_access(settings, db_keys),
    )


def serve(args: argparse.Namespace) -> int:
    settings = load_settings(host=args.host, port=args.port, workers=args.workers)
    warnings = check_startup(settings)
    db_keys: int | None = None
    if settings.exposure_problem():
        # Not safe on this host unless the database holds keys: ask it before migrating.
        db_keys = _count_keys(settings, missing_ok=False)
        refusal = settings.exposure_problem(db_keys=db_keys or 0)
        if refusal:
            raise CliError(refusal, status=2)
    secrets = settings.secret_values()
    configure_logging(settings.log_level, settings.log_format, secrets)
    logging.captureWarnings(True)  # a library's warning is a log line, in the log's format
    for warning in warnings:
        logging.getLogger("carryover.config").warning("%s", warning)
    _migrate(settings)
    if db_keys is None:
        db_keys = _count_keys(settings, missing_ok=True)
    metrics_dir: str | None = None
    if settings.workers > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        # Each worker keeps its own counters; prometheus-client aggregates them from files.
        metrics_dir = tempfile.mkdtemp(prefix="carryover-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    text = banner(settings, db_keys)

    import uvicorn

    config = uvicorn.Config(
        APP_FACTORY,
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        log_config=logging_config(settings.log_level, settings.log_format, secrets),
        server_header=False,
    )
    try:
        started = run_server(config, on_listening=lambda: print(text, flush=True))
    finally:
        if metrics_dir is not None:
            os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
            shutil.rmtree(metrics_dir, ignore_errors=True)
    if not started:
        raise CliError("the server did not start (see the log above)", status=3)
    return 0


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


def _count_keys(settings: Settings, *, missing_ok: bool) -> int | None:
    """Active API keys in the database. When it cannot be asked: ``None`` with ``missing_ok``,
    else a refusal (a server that cannot tell whether it is protected does not go public)."""
    from app.store.keys import active_key_count

    try:
        return asyncio.run(asyncio.wait_for(active_key_count(settings.database_url), 15))
    except Exception as exc:
        if missing_ok:
            return None
        redact = RedactSecrets(settings.secret_values())
        raise CliError(
            f"refusing to listen on {settings.host!r}: CARRYOVER_API_KEYS is empty and the API "
            f"keys in {settings.database_url_display} could not be counted: "
            f"{redact.redact(str(exc)) or type(exc).__name__}",
            status=2,
        ) from exc


def migrate_command(args: argparse.Namespace) -> int:
    settings = load_settings()
    configure_logging(settings.log_level, settings.log_format, settings.secret_values())
    _migrate(settings, args.downgrade)
    target = f"down to {args.downgrade}" if args.downgrade else "to head"
    print(f"migrated {settings.database_url_display} {target}")
    return 0


# --- keys ------------------------------------------------------------------------------------


def _timestamp(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%SZ") if value is not None else "-"


async def _with_keys(settings: Settings, action: Callable[[KeyStore], Awaitable[T]]) -> T:
    from app.store.db import make_engine
    from app.store.keys import KeyStore

    engine = make_engine(settings.database_url)
    try:
        return await action(KeyStore(engine))
    finally:
        await engine.dispose()


def keys_command(args: argparse.Namespace) -> int:
    settings = load_settings()
    # the migration's INFO lines would bury the key and the table
    level = "DEBUG" if settings.log_level == "DEBUG" else "WARNING"
    configure_logging(level, settings.log_format, settings.secret_values())
    _migrate(settings)
    if args.keys_command == "create":
        created = asyncio.run(_with_keys(settings, lambda store: store.create(args.tenant)))
        print(
            f"created API key {created.stored.id} for tenant {created.stored.tenant!r} "
            f"(prefix {created.stored.prefix}). This is the only time it is shown: store it "
            "now. Send it as 'Authorization: Bearer <key>'.",
            file=sys.stderr,
        )
        print(created.key, flush=True)
        return 0
    if args.keys_command == "list":
        keys = asyncio.run(_with_keys(settings, lambda store: store.list_keys(args.tenant)))
        rows = [("ID", "TENANT", "PREFIX", "CREATED", "REVOKED")] + [
            (k.id, k.tenant, k.prefix, _timestamp(k.created_at), _timestamp(k.revoked_at))
            for k in keys
        ]
        widths = [max(len(row[i]) for row in rows) for i in range(5)]
        for row in rows:
            print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        return 0
    revoked = asyncio.run(_with_keys(settings, lambda store: store.revoke(args.id)))
    if revoked is None:
        raise CliError(f"no API key with id {args.id!r} (see 'carryover keys list')")
    stored, now = revoked
    if not now:
        print(
            f"API key {stored.id} of tenant {stored.tenant!r} was already revoked at "
            f"{_timestamp(stored.revoked_at)}"
        )
        return 0
    print(
        f"revoked API key {stored.id} of tenant {stored.tenant!r} at "
        f"{_timestamp(stored.revoked_at)}; running servers refuse it within "
        f"{settings.api_key_cache_seconds:g} seconds"
    )
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
