"""``carryover keys create|list|revoke`` (docs/contract.md "Running it"), registered by
:mod:`app.cli`: API keys kept in the database, each bound to a tenant. Each action migrates first.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from app.config import Settings
from app.observability import configure_logging

from .common import CliError, load_settings, open_database, tenant, timestamp

if TYPE_CHECKING:
    from app.store.keys import KeyStore

T = TypeVar("T")


def add_keys_parser(commands: Any) -> None:
    """Add ``keys`` and its actions to ``carryover``'s subparsers."""
    keys = commands.add_parser(
        "keys",
        help="create, list and revoke API keys",
        description="API keys kept in the database, each bound to a tenant. They work next to "
        "CARRYOVER_API_KEYS; once any key exists, every request needs one.",
    )
    actions = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="create a key for a tenant and print it once")
    create.add_argument("--tenant", required=True, type=tenant, help="the tenant it acts as")
    listing = actions.add_parser("list", help="list keys (never the keys themselves)")
    listing.add_argument("--tenant", type=tenant, help="only this tenant's keys")
    revoke = actions.add_parser("revoke", help="revoke a key by its id")
    revoke.add_argument("id", help="the key's id, as 'keys list' shows it")


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
    open_database(settings)
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
            (k.id, k.tenant, k.prefix, timestamp(k.created_at), timestamp(k.revoked_at))
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
            f"{timestamp(stored.revoked_at)}"
        )
        return 0
    print(
        f"revoked API key {stored.id} of tenant {stored.tenant!r} at "
        f"{timestamp(stored.revoked_at)}; running servers refuse it within "
        f"{settings.api_key_cache_seconds:g} seconds"
    )
    return 0
