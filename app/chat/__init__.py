"""``carryover chat [ID] [--url URL] [--api-key KEY] [--agent NAME]``: talk to a running server
from a terminal (docs/chat.md).

A client of the HTTP API and nothing else: it imports no layer of the service (the layer
contract, tests/frame/test_layers.py), so what it does any application can do. Each line typed
is one run (``POST /conversations/{id}/runs`` with ``Accept: text/event-stream`` and
``Prefer: return=minimal``); the answer is printed as its ``delta`` events arrive, tool calls and
compactions as one short line each. Lines starting with ``/`` are sent as they are (the echo
provider's ``/tool``, ``/sleep``, ``/fail``, ``/overflow``), except ``/quit``.

Ctrl-C during a run cancels it (``POST …/runs/{run_id}/cancel``, the id from ``run.started``)
and waits for its end; a second Ctrl-C stops waiting. Ctrl-C at the prompt clears the line, a
second one in a row (or one right after a cancel) leaves, as do Ctrl-D and ``/quit``. A run that
ends ``requires_action`` asks for each pending call: a decision for an approval call, a result
text for a client tool call, and the next run sends them.

Input is read with prompt_toolkit (line editing and history) when stdin is a terminal, plain
lines otherwise; output is written with rich. Exit status: 0 on Ctrl-D or ``/quit``, 1 when the
server cannot be reached or refuses the conversation, 2 for a bad argument.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Mapping
from typing import Any

from .keyboard import Interrupted, Keyboard
from .render import SHOWN_CHARACTERS, Screen, problem_text, shorten
from .session import QUIT, REQUEST_TIMEOUT_SECONDS, Chat, ChatError, Turn
from .sse import ServerEvent, server_events

DEFAULT_URL = "http://127.0.0.1:8000"
URL_VARIABLE = "CARRYOVER_URL"
KEY_VARIABLE = "CARRYOVER_API_KEY"


def default_url(environ: Mapping[str, str] | None = None) -> str:
    """The server a client command talks to without ``--url``: ``$CARRYOVER_URL``, else the
    address ``carryover serve`` listens on by the same variables (``CARRYOVER_HOST``, a
    wildcard read as loopback, and ``CARRYOVER_PORT``), else ``http://127.0.0.1:8000``."""
    environ = os.environ if environ is None else environ
    given = environ.get(URL_VARIABLE, "").strip()
    if given:
        return given
    host = environ.get("CARRYOVER_HOST", "").strip() or "127.0.0.1"
    if host in ("0.0.0.0", "::", "[::]"):
        host = "127.0.0.1"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"
    port = environ.get("CARRYOVER_PORT", "").strip() or "8000"
    return f"http://{host}:{port}"


def add_parser(commands: Any) -> None:
    """Register ``chat`` on the ``carryover`` subcommands (``commands`` is argparse's
    ``_SubParsersAction``)."""
    chat: argparse.ArgumentParser = commands.add_parser(
        "chat",
        help="talk to a running server from the terminal",
        description="An interactive chat against a running Carryover server. Each line is a "
        "run whose answer streams as it arrives; lines starting with '/' are sent as they are "
        f"(e.g. the echo provider's /tool, /sleep, /fail, /overflow), except {QUIT}. Ctrl-C "
        f"cancels the run in progress; Ctrl-D or {QUIT} leaves.",
    )
    chat.add_argument(
        "id",
        nargs="?",
        help="the conversation to continue (created with this id when it does not exist); "
        "without it, a new conversation whose id is printed",
    )
    chat.add_argument(
        "--url",
        help=f"the server (default: ${URL_VARIABLE}, else CARRYOVER_HOST and CARRYOVER_PORT "
        f"as serve reads them, else {DEFAULT_URL})",
    )
    chat.add_argument(
        "--api-key",
        help=f"sent as 'Authorization: Bearer KEY' (default: ${KEY_VARIABLE}, else none)",
    )
    chat.add_argument("--agent", default="default", help="the agent profile to run")


def command(args: argparse.Namespace) -> int:
    """``carryover chat``: the exit status."""
    url = (args.url or default_url()).rstrip("/")
    key = args.api_key or os.environ.get(KEY_VARIABLE) or None
    if not url.startswith(("http://", "https://")):
        print(
            f"carryover chat: --url must be an http:// or https:// URL, got {url!r}",
            file=sys.stderr,
        )
        return 2
    try:
        return asyncio.run(Chat(url, key, args.agent, args.id).main())
    except ChatError as exc:
        print(f"carryover chat: {exc}", file=sys.stderr)
        return 1


__all__ = [
    "DEFAULT_URL",
    "KEY_VARIABLE",
    "QUIT",
    "REQUEST_TIMEOUT_SECONDS",
    "SHOWN_CHARACTERS",
    "URL_VARIABLE",
    "Chat",
    "ChatError",
    "Interrupted",
    "Keyboard",
    "Screen",
    "ServerEvent",
    "Turn",
    "add_parser",
    "command",
    "problem_text",
    "server_events",
    "shorten",
]
