"""``carryover conversations list|show|export|import|delete|fork``: scripting against a running
server over HTTP (docs/conversations.md, "Command line").

Every command talks to ``--url`` (default ``$CARRYOVER_URL``, else where ``serve`` listens by
``CARRYOVER_HOST`` / ``CARRYOVER_PORT``, else ``http://127.0.0.1:8000``)
with ``--api-key`` (default ``$CARRYOVER_API_KEY``). ``--json`` prints the server's JSON answer
as it is (one document; ``list --all`` prints one page object with every item); without it
the output is short lines for people. ``export`` writes the document as the server streams it
(to ``--output`` or stdout), never holding it whole.

Exit status: 0 on success; 1 when the server refused (its problem's ``detail`` goes to stderr,
the whole problem with ``--json``) or could not be reached; 2 for a usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import httpx

from app.chat import DEFAULT_URL, default_url

MERGE_PATCH = "application/merge-patch+json"


class Refused(Exception):
    """The server answered with a problem (or not at all)."""

    def __init__(self, message: str, problem: Any = None) -> None:
        super().__init__(message)
        self.problem = problem


def _pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def add_parser(commands: Any) -> None:
    """Register ``conversations`` on the top-level subparsers."""
    parser = commands.add_parser(
        "conversations",
        help="list, show, export, import, delete and fork conversations over HTTP",
        description="Script a running Carryover server.",
    )
    parser.add_argument(
        "--url",
        default=default_url(),
        help=f"the server (default: $CARRYOVER_URL, else CARRYOVER_HOST and CARRYOVER_PORT "
        f"as serve reads them, else {DEFAULT_URL})",
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("CARRYOVER_API_KEY"),
        help="an API key (default: $CARRYOVER_API_KEY)",
    )
    parser.add_argument("--json", action="store_true", help="print the server's JSON")
    actions = parser.add_subparsers(dest="conversations_command", required=True, metavar="ACTION")

    listing = actions.add_parser("list", help="list conversations, newest update first")
    listing.add_argument(
        "--metadata",
        "-m",
        action="append",
        type=_pair,
        default=[],
        metavar="KEY=VALUE",
        help="only those whose metadata has KEY=VALUE (repeatable; all must match)",
    )
    listing.add_argument("--updated-after", metavar="TIME", help="RFC 3339 time with offset")
    listing.add_argument("--updated-before", metavar="TIME", help="RFC 3339 time with offset")
    active = listing.add_mutually_exclusive_group()
    active.add_argument("--active", action="store_true", help="only those with a run in flight")
    active.add_argument("--idle", action="store_true", help="only those without one")
    awaiting = listing.add_mutually_exclusive_group()
    awaiting.add_argument(
        "--pending",
        action="store_true",
        help="only those whose context awaits tool results or approvals",
    )
    awaiting.add_argument("--settled", action="store_true", help="only those awaiting nothing")
    listing.add_argument("--order", choices=("desc", "asc"), default="desc")
    listing.add_argument("--limit", type=int, help="page size")
    listing.add_argument("--all", action="store_true", help="follow the cursors to the end")

    show = actions.add_parser("show", help="a conversation's metadata view")
    show.add_argument("id")

    export = actions.add_parser("export", help="write a conversation's export document")
    export.add_argument("id")
    export.add_argument("--output", "-o", type=Path, help="file to write (default: stdout)")

    imported = actions.add_parser("import", help="restore an export document")
    imported.add_argument("file", help="the document ('-' for stdin)")
    imported.add_argument("--id", help="import under this id instead of the document's")

    delete = actions.add_parser("delete", help="delete a conversation and all its records")
    delete.add_argument("id")
    delete.add_argument("--if-match", metavar="ETAG", help="only if its ETag is this")

    fork = actions.add_parser("fork", help="fork a conversation")
    fork.add_argument("id")
    fork.add_argument("--id", dest="new_id", metavar="NEW_ID", help="the fork's id")
    fork.add_argument("--messages", type=int, metavar="N", help="copy only the first N messages")
    fork.add_argument(
        "--metadata",
        "-m",
        action="append",
        type=_pair,
        metavar="KEY=VALUE",
        help="the fork's metadata (repeatable; default: the source's)",
    )
    fork.add_argument("--if-match", metavar="ETAG", help="only if the source's ETag is this")


def _client(args: argparse.Namespace) -> httpx.Client:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    return httpx.Client(base_url=args.url, headers=headers, timeout=60.0)


def _checked(response: httpx.Response) -> httpx.Response:
    if response.is_success:
        return response
    try:
        problem = response.json()
    except ValueError:
        problem = None
    detail = problem.get("detail") if isinstance(problem, dict) else None
    raise Refused(f"{response.status_code}: {detail or response.text[:200]}", problem)


def _line(conv: dict[str, Any]) -> str:
    meta = " ".join(f"{k}={v}" for k, v in conv.get("metadata", {}).items())
    active = f" active={conv['active_run_id']}" if conv.get("active_run_id") else ""
    calls = conv.get("pending_tool_calls") or []
    pending = f" pending={len(calls)}" if calls else ""
    return (
        f"{conv['id']}\t{conv['updated_at']}\tmessages={conv['message_count']} "
        f"runs={conv['run_count']}{active}{pending}" + (f"\t{meta}" if meta else "")
    )


def _print(args: argparse.Namespace, value: Any, human: str, out: IO[str]) -> None:
    print(json.dumps(value, ensure_ascii=False, indent=2) if args.json else human, file=out)


def _list(args: argparse.Namespace, http: httpx.Client, out: IO[str]) -> None:
    params: list[tuple[str, str | int | float | bool | None]] = [
        (f"metadata.{k}", v) for k, v in args.metadata
    ]
    for name in ("updated_after", "updated_before", "order"):
        if getattr(args, name):
            params.append((name, getattr(args, name)))
    if args.active or args.idle:
        params.append(("active", "true" if args.active else "false"))
    if args.pending or args.settled:
        params.append(("has_pending_action", "true" if args.pending else "false"))
    if args.limit:
        params.append(("limit", str(args.limit)))
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = _checked(
            http.get("/conversations", params=params + ([("cursor", cursor)] if cursor else []))
        ).json()
        items += page["items"]
        cursor = page["next_cursor"]
        if not args.all or cursor is None:
            break
    body = {"items": items, "next_cursor": cursor}
    _print(args, body, "\n".join(_line(c) for c in items), out)


def _export(args: argparse.Namespace, http: httpx.Client, out: IO[str]) -> None:
    with http.stream("GET", f"/conversations/{args.id}/export") as response:
        if not response.is_success:
            response.read()
            _checked(response)
        if args.output is None:
            for chunk in response.iter_text():
                out.write(chunk)
            out.write("\n")
            return
        with args.output.open("wb") as file:
            for raw in response.iter_bytes():
                file.write(raw)
    if not args.json:
        print(f"wrote {args.output}", file=sys.stderr)


def _import(args: argparse.Namespace, http: httpx.Client, out: IO[str]) -> None:
    raw = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
    params = {"id": args.id} if args.id else {}
    response = _checked(
        http.post(
            "/conversations/import",
            params=params,
            content=raw,
            headers={"Content-Type": "application/json"},
        )
    )
    body = response.json()
    _print(args, body, f"imported {body['id']} {body['etag']}", out)


def _fork(args: argparse.Namespace, http: httpx.Client, out: IO[str]) -> None:
    payload: dict[str, Any] = {}
    if args.new_id:
        payload["id"] = args.new_id
    if args.messages is not None:
        payload["messages"] = args.messages
    if args.metadata is not None:
        payload["metadata"] = dict(args.metadata)
    headers = {"If-Match": args.if_match} if args.if_match else {}
    body = _checked(
        http.post(f"/conversations/{args.id}/fork", json=payload, headers=headers)
    ).json()
    _print(args, body, f"forked {args.id} -> {body['id']} {body['etag']}", out)


def run(args: argparse.Namespace, out: IO[str] = sys.stdout) -> int:
    """Run one ``conversations`` action; its exit status."""
    try:
        with _client(args) as http:
            action = args.conversations_command
            if action == "list":
                _list(args, http, out)
            elif action == "show":
                body = _checked(http.get(f"/conversations/{args.id}")).json()
                _print(args, body, _line(body), out)
            elif action == "export":
                _export(args, http, out)
            elif action == "import":
                _import(args, http, out)
            elif action == "delete":
                headers = {"If-Match": args.if_match} if args.if_match else {}
                _checked(http.delete(f"/conversations/{args.id}", headers=headers))
                _print(args, {"deleted": args.id}, f"deleted {args.id}", out)
            elif action == "fork":
                _fork(args, http, out)
    except Refused as exc:
        if args.json and exc.problem is not None:
            print(json.dumps(exc.problem, ensure_ascii=False), file=sys.stderr)
        else:
            print(f"carryover: {exc}", file=sys.stderr)
        return 1
    except httpx.HTTPError as exc:
        print(f"carryover: cannot reach {args.url}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"carryover: {exc}", file=sys.stderr)
        return 1
    return 0


def command(args: argparse.Namespace) -> int:
    return run(args)


__all__ = ["add_parser", "command", "run"]


def _main(argv: Sequence[str]) -> int:  # pragma: no cover - for `python -m`
    parser = argparse.ArgumentParser(prog="carryover")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return run(parser.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_main(sys.argv[1:]))
