"""``carryover serve [--host H] [--port P] [--workers N]`` (docs/contract.md "Running it"),
registered by :mod:`app.cli`: check the configuration, migrate the database to head, then serve
the app factory (``app.cli.common.APP_FACTORY``) with uvicorn through :func:`run_server`; refuse
a non-loopback host when no API keys are configured; print the banner once the port accepts
connections.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from app.config import Settings, is_loopback
from app.config.check import check
from app.observability import RedactSecrets, banner_line, configure_logging, logging_config

from .common import APP_FACTORY, CliError, load_settings, migrate_database, version

if TYPE_CHECKING:
    import socket

    import uvicorn


def add_serve_parser(commands: Any) -> None:
    """Add ``serve`` to ``carryover``'s subparsers."""
    serve = commands.add_parser("serve", help="apply migrations, then serve HTTP")
    serve.add_argument("--host", help="interface to listen on (default: CARRYOVER_HOST, 127.0.0.1)")
    serve.add_argument("--port", type=_port, help="TCP port (default: CARRYOVER_PORT, 8000)")
    serve.add_argument(
        "--workers", type=_positive, help="worker processes (default: CARRYOVER_WORKERS, 1)"
    )


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
            f"Carryover {version()} listening on {_url(settings.host, settings.port)} ({workers})",
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


def check_startup(settings: Settings) -> list[str]:
    """Resolve every tool and key now (app.config.check): a broken one stops ``serve`` with
    status 2, before the port is bound. What can wait is returned, to be logged."""
    found = check(settings)
    if found.errors:
        lines = "".join(f"\n  {message}" for message in found.errors)
        raise CliError(f"invalid configuration:{lines}", status=2)
    return found.warnings + [
        f"agent profile {name!r} cannot run: {why}; its runs answer 503 until it is set "
        "(/readyz reports it)"
        for name, why in sorted(found.unready.items())
    ]


def serve_command(args: argparse.Namespace) -> int:
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
    migrate_database(settings)
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
