"""``carryover check [--json] [--batch N]``: find damaged stored messages (docs/operations.md,
"Damaged stored rows").

Scans every stored message of the database in batches (:func:`app.store.integrity.scan`: each
one checked as a read checks it, against the checksum written with it) and lists the damaged
ones by tenant, conversation and message index, with how to repair each conversation; then
every message text the run records, transcripts and events reference
(:func:`app.store.texts.scan_texts`: each hashed against its key), with the conversations that
reference a damaged one. Exit
status 0 when nothing is damaged, 1 when something is (a cron job or a probe can alert on it).
Read only: it never changes the database, and never migrates it (an unmigrated database is
refused, as by every operator command).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Callable
from typing import Any

from app.observability import configure_logging

from .common import load_settings, open_database


def add_parser(commands: Any) -> None:
    """Add ``carryover check`` to ``carryover``'s subparsers."""
    check = commands.add_parser(
        "check",
        help="scan the stored conversations for damaged messages",
        description="Check every stored message against the checksum written with it (a "
        "message stored before checksums: that it decodes), in batches, and list the damaged "
        "ones with how to repair their conversations. Exit status 1 when any is damaged.",
    )
    check.add_argument("--json", action="store_true", help="one JSON document")
    check.add_argument(
        "--batch", type=_positive, default=1000, metavar="N", help="rows read per batch"
    )


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def repair_hint(conversation_id: str, etag: str) -> str:
    """How a damaged conversation is repaired, as the problem of its reads says it."""
    return (
        f"PUT /conversations/{conversation_id}/context with If-Match: {etag} and the context "
        f"to keep, or DELETE /conversations/{conversation_id}"
    )


def check_command(args: argparse.Namespace) -> int:
    settings = load_settings()
    level = "DEBUG" if settings.log_level == "DEBUG" else "WARNING"
    configure_logging(level, settings.log_format, settings.secret_values())
    open_database(settings)

    async def scan() -> tuple[list[Any], list[Any]]:
        from app.store.db import make_engine
        from app.store.integrity import scan
        from app.store.texts import scan_texts

        engine = make_engine(settings.database_url)
        try:
            messages = [found async for found in scan(engine, batch=args.batch)]
            texts = [found async for found in scan_texts(engine, batch=args.batch)]
            return messages, texts
        finally:
            await engine.dispose()

    damaged, damaged_texts = asyncio.run(scan())
    conversations: dict[tuple[str, str], str] = {}
    for found in damaged:
        conversations.setdefault((found.tenant, found.conversation_id), found.etag)
    if args.json:
        document = {
            "damaged_messages": [
                {
                    "tenant": d.tenant,
                    "conversation_id": d.conversation_id,
                    "message_index": d.message_index,
                    "etag": d.etag,
                    "reason": d.reason,
                }
                for d in damaged
            ],
            "damaged_conversations": [
                {
                    "tenant": t,
                    "conversation_id": c,
                    "etag": etag,
                    "repair": repair_hint(c, etag),
                }
                for (t, c), etag in conversations.items()
            ],
            "damaged_texts": [
                {
                    "tenant": d.tenant,
                    "sha256": d.sha256,
                    "reason": d.reason,
                    "conversations": list(d.conversations),
                    "repair": [records_hint(c) for c in d.conversations],
                }
                for d in damaged_texts
            ],
        }
        print(json.dumps(document, indent=2, ensure_ascii=False))
        return 1 if damaged or damaged_texts else 0
    _print_texts(damaged_texts)
    if not damaged:
        if not damaged_texts:
            print("no damaged messages")
    else:
        for d in damaged:
            print(
                f"damaged: tenant {d.tenant!r} conversation {d.conversation_id!r} "
                f"message {d.message_index}: {d.reason}"
            )
        print(
            f"{len(damaged)} damaged message(s) in {len(conversations)} conversation(s). "
            "Every read and run of such a conversation answers 409 stored-data-damaged "
            "until it is repaired, with the tenant's key:"
        )
        for (t, c), etag in conversations.items():
            print(f"  tenant {t!r}: {repair_hint(c, etag)}")
    return 1 if damaged or damaged_texts else 0


def records_hint(conversation_id: str) -> str:
    """What a conversation whose records reference a damaged text can do: its context (a copy
    of its own) is sound and runs go on; its transcript, run records and events answer 409."""
    return (
        f"GET /conversations/{conversation_id}/context still serves its context (runs go on); "
        f"its transcript, run records and events answer 409 until DELETE "
        f"/conversations/{conversation_id}"
    )


def _print_texts(damaged_texts: list[Any]) -> None:
    for d in damaged_texts:
        print(
            f"damaged: tenant {d.tenant!r} message text {d.sha256[:16]}…: {d.reason}; "
            f"referenced by conversation(s) {', '.join(map(repr, d.conversations)) or 'none'}"
        )
        for c in d.conversations:
            print(f"  tenant {d.tenant!r}: {records_hint(c)}")


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"check": check_command}
