"""``carryover webhooks``: the endpoints an operator registers per tenant, and their deliveries
(docs/runs.md, "Webhooks"). API callers cannot register endpoints: only whoever runs this
command against the database can point the server at a URL.

- ``carryover webhooks add --tenant T URL [--events run.completed,run.failed,…]
  [--allow-private]`` registers an endpoint and prints its id and its signing secret
  (``whsec_…``; shown here and by nothing else). A URL whose host is (or resolves to) a
  private, loopback or link-local address is refused (status 2) without ``--allow-private``
  (app/addresses.py);
- ``carryover webhooks list [--tenant T]``, ``carryover webhooks remove ID``;
- ``carryover webhooks deliveries [--tenant T] [--webhook ID] [--limit N]``: the newest first,
  with status (pending, delivered, failed), attempts and the last error.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from app.observability import configure_logging

from .common import CliError, load_settings, open_database, tenant, timestamp

if TYPE_CHECKING:
    from app.store.webhooks import WebhookStore

T = TypeVar("T")


def add_webhooks_parser(commands: Any) -> None:
    webhooks = commands.add_parser(
        "webhooks",
        help="register, list and remove webhook endpoints; show deliveries",
        description="Webhook endpoints per tenant: each gets a signed POST (Standard Webhooks) "
        "when one of the tenant's runs ends.",
    )
    actions = webhooks.add_subparsers(dest="webhooks_command", required=True, metavar="ACTION")
    add = actions.add_parser("add", help="register an endpoint and print its signing secret")
    add.add_argument("--tenant", required=True, type=tenant, help="whose runs it hears of")
    add.add_argument("url", help="an http(s) URL")
    add.add_argument(
        "--allow-private",
        action="store_true",
        help="allow a private, loopback or link-local address (refused otherwise)",
    )
    add.add_argument(
        "--events",
        help="comma-separated: run.completed, run.failed, run.cancelled, run.conflicted, "
        "run.requires_action, run.interrupted (default: all)",
    )
    listing = actions.add_parser("list", help="list endpoints (never their secrets)")
    listing.add_argument("--tenant", type=tenant, help="only this tenant's endpoints")
    remove = actions.add_parser("remove", help="remove an endpoint (and its deliveries)")
    remove.add_argument("id", help="the endpoint's id, as 'webhooks list' shows it")
    deliveries = actions.add_parser("deliveries", help="the newest deliveries first")
    deliveries.add_argument("--tenant", type=tenant, help="only this tenant's")
    deliveries.add_argument("--webhook", help="only this endpoint's")
    deliveries.add_argument("--limit", type=int, default=50, help="how many (default 50)")


def _events(text: str | None) -> list[str]:
    from app.store.webhooks import WEBHOOK_EVENTS

    if text is None:
        return list(WEBHOOK_EVENTS)
    events = list(dict.fromkeys(e.strip() for e in text.split(",") if e.strip()))
    unknown = [e for e in events if e not in WEBHOOK_EVENTS]
    if not events or unknown:
        raise CliError(
            f"unknown event(s) {', '.join(unknown) or '(none given)'}; "
            f"known: {', '.join(WEBHOOK_EVENTS)}",
            status=2,
        )
    return events


def _url(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CliError(f"{text!r} is not an http(s) URL", status=2)
    return text


def _check_target(url: str, allow_private: bool) -> None:
    """Refuse (status 2) an endpoint on a private, loopback or link-local address, or one
    whose name does not resolve, unless the operator said ``--allow-private``."""
    from app.addresses import PrivateTarget, check_url

    try:
        asyncio.run(check_url(url, allow_private=allow_private))
    except PrivateTarget as exc:
        raise CliError(
            f"refusing webhook {url!r}: {exc}. Webhooks are sent from the server's network; "
            "pass --allow-private if this endpoint is meant to be reached there",
            status=2,
        ) from None


def _table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def webhooks_command(args: argparse.Namespace) -> int:
    settings = load_settings()
    level = "DEBUG" if settings.log_level == "DEBUG" else "WARNING"
    configure_logging(level, settings.log_format, settings.secret_values())

    async def using(action: Callable[[WebhookStore], Awaitable[T]]) -> T:
        from app.store.db import make_engine
        from app.store.webhooks import WebhookStore

        engine = make_engine(settings.database_url)
        try:
            return await action(WebhookStore(engine))
        finally:
            await engine.dispose()

    command = args.webhooks_command
    if command == "add":
        url, events = _url(args.url), _events(args.events)
        _check_target(url, args.allow_private)
        open_database(settings)
        hook = asyncio.run(
            using(
                lambda repo: repo.add_webhook(
                    args.tenant, url, events, allow_private=args.allow_private
                )
            )
        )
        print(
            f"registered webhook {hook.id} for tenant {hook.tenant!r}: {hook.url} "
            f"({', '.join(hook.events)}). Its signing secret follows; it is shown only now.",
            file=sys.stderr,
        )
        print(f"id: {hook.id}")
        print(f"secret: {hook.secret}", flush=True)
        return 0
    open_database(settings)
    if command == "list":
        hooks = asyncio.run(using(lambda repo: repo.list_webhooks(args.tenant)))
        _table(
            [("ID", "TENANT", "URL", "EVENTS", "CREATED")]
            + [(h.id, h.tenant, h.url, ",".join(h.events), timestamp(h.created_at)) for h in hooks]
        )
        return 0
    if command == "remove":
        if not asyncio.run(using(lambda repo: repo.remove_webhook(args.id))):
            raise CliError(f"no webhook with id {args.id!r} (see 'carryover webhooks list')")
        print(f"removed webhook {args.id}")
        return 0
    found = asyncio.run(
        using(
            lambda repo: repo.list_deliveries(
                webhook_id=args.webhook, tenant=args.tenant, limit=max(1, args.limit)
            )
        )
    )
    _table(
        [("ID", "WEBHOOK", "EVENT", "RUN", "STATUS", "ATTEMPTS", "LAST ERROR", "CREATED")]
        + [
            (
                d.id,
                d.webhook_id,
                d.event,
                d.run_id,
                d.status,
                str(d.attempts),
                d.last_error or "-",
                timestamp(d.created_at),
            )
            for d in found
        ]
    )
    return 0


__all__ = ["add_webhooks_parser", "webhooks_command"]
