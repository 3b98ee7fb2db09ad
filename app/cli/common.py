"""What the subcommands of ``carryover`` share: :class:`CliError` (a one-line failure with an
exit status), the settings as the command line sees them, the migration every database command
runs first, the argument type of a tenant, and how a timestamp prints."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from datetime import datetime
from importlib import metadata
from typing import Any

from pydantic import ValidationError

from app.config import TENANT_NAME, Settings, get_settings
from app.config.check import settings_errors
from app.observability import RedactSecrets, banner_line

APP_FACTORY = "app.api.app:create_app"


class CliError(Exception):
    """A failure reported as one line on stderr, with an exit status."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def version() -> str:
    try:
        return metadata.version("carryover")
    except metadata.PackageNotFoundError:
        return "unknown"


def tenant(text: str) -> str:
    """The argument type of ``--tenant``."""
    if not TENANT_NAME.match(text):
        raise argparse.ArgumentTypeError(
            f"{text!r}: a tenant is 1-64 letters, digits, '.', '_' or '-', starting with a "
            "letter or digit"
        )
    return text


def timestamp(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%SZ") if value is not None else "-"


def load_settings(**overrides: Any) -> Settings:
    """Settings from the environment, with command-line values (those not ``None``) on top."""
    given = {name: value for name, value in overrides.items() if value is not None}
    try:
        return Settings(**given) if given else get_settings()
    except ValidationError as exc:
        lines = "".join(f"\n  {message}" for message in settings_errors(exc))
        raise CliError(f"invalid configuration:{lines}", status=2) from None


# app.store.migrate (storage) provides ``async def upgrade(url)`` and
# ``async def downgrade(url, revision)``; imported here, lazily, so ``--help`` stays fast.


def migrate_database(settings: Settings, downgrade_to: str | None = None) -> None:
    """Migrate the database to head (or down to ``downgrade_to``); a failure is a
    :class:`CliError` naming the database (its password masked)."""
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


def database_shown(settings: Settings) -> str:
    """The database as a command names it: a SQLite file's absolute path, else the URL with
    its password masked."""
    from app.store.migrate import sqlite_path

    path = sqlite_path(settings.database_url)
    return str(path) if path is not None else settings.database_url_display


def open_database(settings: Settings) -> None:
    """What an operator command (``keys``, ``webhooks``, ``quotas``) does before it touches
    the database: say on stderr which database it uses, and refuse (exit 1) one that does not
    exist or is not migrated — it never creates one, so a command run in another directory
    than the server cannot silently work on a new, empty database."""
    from app.store import migrate

    shown = database_shown(settings)
    fmt = os.environ.get("CARRYOVER_LOG_FORMAT", "text").strip().lower()
    print(banner_line(f"carryover: database {shown}", fmt), file=sys.stderr)
    redact = RedactSecrets(settings.secret_values())
    problem = asyncio.run(migrate.existing_database_problem(settings.database_url))
    if problem is not None:
        raise CliError(f"database {shown}: {redact.redact(problem)}")
