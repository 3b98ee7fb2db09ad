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
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

if TYPE_CHECKING:
    import httpx
    from prompt_toolkit import PromptSession
    from rich.console import Console

DEFAULT_URL = "http://127.0.0.1:8000"
URL_VARIABLE = "CARRYOVER_URL"
KEY_VARIABLE = "CARRYOVER_API_KEY"
QUIT = "/quit"
#: how much of a tool call's arguments or result one line shows
SHOWN_CHARACTERS = 72
#: how long an ordinary request may take; a streamed run has no read timeout (it may sleep)
REQUEST_TIMEOUT_SECONDS = 30.0


class ChatError(Exception):
    """A failure that ends the chat, reported as one line on stderr."""


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
    chat.add_argument("--url", help=f"the server (default: ${URL_VARIABLE}, else {DEFAULT_URL})")
    chat.add_argument(
        "--api-key",
        help=f"sent as 'Authorization: Bearer KEY' (default: ${KEY_VARIABLE}, else none)",
    )
    chat.add_argument("--agent", default="default", help="the agent profile to run")


def command(args: argparse.Namespace) -> int:
    """``carryover chat``: the exit status."""
    url = (args.url or os.environ.get(URL_VARIABLE) or DEFAULT_URL).rstrip("/")
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


# --- server-sent events ----------------------------------------------------------------------


@dataclass(frozen=True)
class ServerEvent:
    event: str
    data: Any


async def server_events(lines: AsyncIterator[str]) -> AsyncIterator[ServerEvent]:
    """The events of a ``text/event-stream`` body given line by line (WHATWG HTML §9.2.6:
    ``event:`` names it, ``data:`` lines are joined by newlines, a blank line dispatches, a
    line starting with ``:`` is a comment). Each event's data is JSON here."""
    name, data = "", list[str]()
    async for line in lines:
        if not line:
            if data:
                yield ServerEvent(name or "message", json.loads("\n".join(data)))
            name, data = "", []
            continue
        if line.startswith(":"):
            continue
        key, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if key == "event":
            name = value
        elif key == "data":
            data.append(value)
    if data:
        yield ServerEvent(name or "message", json.loads("\n".join(data)))


# --- what is shown ---------------------------------------------------------------------------


def shorten(text: str, limit: int = SHOWN_CHARACTERS) -> str:
    """One line of at most ``limit`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def problem_text(response: httpx.Response) -> str:
    """A refusal as one line: the problem's title and detail, else the status and body."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("title"):
        detail = f": {body['detail']}" if body.get("detail") else ""
        return f"{response.status_code} {body['title']}{detail}"
    return f"{response.status_code} {shorten(response.text) or response.reason_phrase}"


def _text_of(message: dict[str, Any]) -> str:
    return "".join(
        block.get("text", "") for block in message.get("content", []) if block.get("type") == "text"
    )


class Screen:
    """Everything the chat prints, through one rich console: the streamed answer, one line per
    tool call, result and compaction, and the end of a run when it did not complete."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._open: str | None = None  # the kind of delta the current line is part of

    def line(self, text: str, style: str = "") -> None:
        self.end_line()
        self.console.print(text, style=style or None, markup=False, highlight=False)

    def end_line(self) -> None:
        if self._open is not None:
            self.console.print()
            self._open = None

    def delta(self, kind: str, text: str) -> None:
        if self._open != kind:
            self.end_line()
            label, style = (
                ("thinking: ", "dim italic") if kind == "thinking" else ("agent: ", "bold")
            )
            self.console.print(label, style=style, end="", markup=False, highlight=False)
            self._open = kind
        shade = "dim italic" if kind == "thinking" else None
        self.console.print(text, style=shade, end="", markup=False, highlight=False, soft_wrap=True)

    def event(self, event: ServerEvent) -> None:
        data = event.data
        if event.event == "delta":
            if data.get("kind") in ("text", "thinking") and data.get("text"):
                self.delta(data["kind"], data["text"])
        elif event.event == "tool.started":
            self.line(f"  [tool] {data['name']}({shorten(data.get('arguments', ''))})", "cyan")
        elif event.event == "tool.finished":
            verb = "failed" if data.get("is_error") else "returned"
            style = "red" if data.get("is_error") else "cyan"
            self.line(f"  [tool] {data['tool_name']} {verb}: {shorten(_text_of(data))}", style)
        elif event.event == "compaction":
            folded = len(data.get("folded", []))
            self.line(
                f"  [compaction] {data.get('reason', '')}: folded {folded} message"
                f"{'s' if folded != 1 else ''}, {data.get('tokens_before', '?')} -> "
                f"{data.get('tokens_after', '?')} tokens",
                "magenta",
            )

    def finished(self, run: dict[str, Any]) -> None:
        self.end_line()
        status = run.get("status")
        if status == "completed":
            return
        error = run.get("error") or {}
        why = f": {error.get('title', '')} - {error.get('detail', '')}" if error else ""
        style = "yellow" if status in ("cancelled", "requires_action") else "red"
        self.line(f"[run {run.get('run_id', '')} {status}{why}]", style)


# --- input -----------------------------------------------------------------------------------


class Interrupted(Exception):
    """Ctrl-C at the prompt."""


class Keyboard:
    """Lines from the user: prompt_toolkit on a terminal (editing, history), plain lines
    otherwise. ``read`` raises :class:`EOFError` on Ctrl-D and :class:`Interrupted` on
    Ctrl-C."""

    def __init__(self) -> None:
        self._session: PromptSession[str] | None = None
        if sys.stdin.isatty() and sys.stdout.isatty():
            from prompt_toolkit import PromptSession

            self._session = PromptSession()

    async def read(self, prompt: str) -> str:
        if self._session is None:
            print(prompt, end="", flush=True)
            line: str = await asyncio.to_thread(sys.stdin.readline)
            if not line:
                raise EOFError
            return line.rstrip("\n")
        try:
            typed: str = await self._session.prompt_async(prompt)
            return typed
        except KeyboardInterrupt:
            raise Interrupted from None


# --- the chat --------------------------------------------------------------------------------


@dataclass
class Turn:
    """One streamed run: its id once ``run.started`` named it, and Ctrl-C's progress."""

    run_id: str | None = None
    cancel_asked: bool = False
    cancel_sent: bool = False
    abandoned: asyncio.Event = field(default_factory=asyncio.Event)


class Chat:
    def __init__(
        self,
        url: str,
        api_key: str | None,
        agent: str,
        conversation_id: str | None,
        *,
        console: Console | None = None,
        keyboard: Keyboard | None = None,
    ) -> None:
        from rich.console import Console

        self.url = url
        self.api_key = api_key
        self.agent = agent
        self.conversation_id = conversation_id
        self.screen = Screen(console or Console(highlight=False))
        self.keyboard = keyboard
        #: the calls the stored context waits on (``requires_action``), answered before the
        #: next user line is sent
        self.pending: list[dict[str, Any]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    # -- HTTP --

    def _client(self) -> httpx.AsyncClient:
        import httpx

        from . import __version__

        headers = {"User-Agent": f"carryover-chat/{__version__}"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return httpx.AsyncClient(
            base_url=self.url, headers=headers, timeout=REQUEST_TIMEOUT_SECONDS
        )

    def _path(self, *parts: str) -> str:
        assert self.conversation_id is not None
        return "/conversations/" + "/".join(
            quote(p, safe="") for p in (self.conversation_id, *parts)
        )

    async def _open(self, client: httpx.AsyncClient) -> None:
        """Find or create the conversation; say which it is."""
        import httpx

        try:
            if self.conversation_id is not None:
                found = await client.get(self._path())
                if found.status_code == 200:
                    body = found.json()
                    count = body.get("message_count", 0)
                    self.pending = list(body.get("pending_tool_calls") or [])
                    self.screen.line(
                        f"conversation {self.conversation_id} ({count} message"
                        f"{'s' if count != 1 else ''})",
                        "green",
                    )
                    return
                if found.status_code != 404:
                    raise ChatError(f"{self.url}: {problem_text(found)}")
            request = {} if self.conversation_id is None else {"id": self.conversation_id}
            created = await client.post("/conversations", json=request)
        except httpx.TransportError as exc:
            raise ChatError(f"cannot reach {self.url}: {exc or type(exc).__name__}") from exc
        if created.status_code != 201:
            raise ChatError(f"{self.url}: {problem_text(created)}")
        self.conversation_id = created.json()["id"]
        self.screen.line(f"conversation {self.conversation_id} (new)", "green")

    # -- the loop --

    async def main(self) -> int:
        keyboard = self.keyboard or Keyboard()
        async with self._client() as client:
            await self._open(client)
            self.screen.line(
                f"Ctrl-C cancels a run; Ctrl-D or {QUIT} leaves. Lines starting with '/' go "
                "to the agent as they are.",
                "dim",
            )
            armed = False  # the last thing was a Ctrl-C: another one at the prompt leaves
            if self.pending:
                self._show_pending()
            while True:
                try:
                    if self.pending:
                        results, approvals = await self._answer_pending(keyboard)
                        if not await self._turn(client, results, approvals):
                            armed = True
                        continue
                    text = await keyboard.read("you> ")
                except EOFError:
                    break
                except Interrupted:
                    if armed:
                        break
                    armed = True
                    self.screen.line(f"(Ctrl-C again, Ctrl-D or {QUIT} to leave)", "dim")
                    continue
                armed = False
                if text.strip() == QUIT:
                    break
                if not text.strip():
                    continue
                if not await self._turn(client, [text], []):
                    armed = True
        self.screen.end_line()
        return 0

    async def _answer_pending(
        self, keyboard: Keyboard
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Ask for each pending call: a decision for an approval call, a result text for a
        client call (Ctrl-C gives up: the calls stay pending). The ``tool_result`` messages
        (they go first in ``prompts``) and the ``approvals``."""
        results: list[dict[str, Any]] = []
        approvals: list[dict[str, Any]] = []
        for call in self.pending:
            shown = f"{call['name']}({shorten(call.get('arguments', ''))})"
            if call.get("kind") == "approval":
                reply = await keyboard.read(f"approve {shown}? [y/N] ")
                approve = reply.strip().lower() in ("y", "yes")
                decision: dict[str, Any] = {"tool_call_id": call["id"], "approve": approve}
                if not approve:
                    decision["reason"] = "denied in carryover chat"
                approvals.append(decision)
            else:
                reply = await keyboard.read(f"result of {shown}> ")
                results.append(
                    {
                        "type": "tool_result",
                        "tool_call_id": call["id"],
                        "tool_name": call["name"],
                        "content": [{"type": "text", "text": reply}],
                        "is_error": False,
                    }
                )
        return results, approvals

    def _show_pending(self) -> None:
        for call in self.pending:
            what = "waits for approval" if call.get("kind") == "approval" else "waits for a result"
            self.screen.line(
                f"  [pending] {call['name']}({shorten(call.get('arguments', ''))}) {what}",
                "yellow",
            )

    async def _turn(
        self, client: httpx.AsyncClient, prompts: list[Any], approvals: list[dict[str, Any]]
    ) -> bool:
        """One run of ``prompts`` (texts, or the tool results answering pending calls) and
        ``approvals``, streamed; whether it ended without a Ctrl-C."""
        body: dict[str, Any] = {"prompts": prompts, "agent": self.agent, "on_disconnect": "cancel"}
        if approvals:
            body["approvals"] = approvals
        turn = Turn()
        stream = asyncio.create_task(self._stream(client, body, turn))
        restore = self._on_interrupt(lambda: self._interrupt(client, turn, stream))
        try:
            await stream
        except asyncio.CancelledError:
            if not turn.abandoned.is_set():
                raise
            self.screen.line(
                "[stopped waiting; the run may still be ending on the server]", "yellow"
            )
        finally:
            restore()
        return not turn.cancel_asked

    async def _stream(self, client: httpx.AsyncClient, body: dict[str, Any], turn: Turn) -> None:
        import httpx

        headers = {"Accept": "text/event-stream", "Prefer": "return=minimal"}
        timeout = httpx.Timeout(REQUEST_TIMEOUT_SECONDS, read=None)
        try:
            async with client.stream(
                "POST", self._path("runs"), json=body, headers=headers, timeout=timeout
            ) as response:
                if response.status_code != 201:
                    await response.aread()
                    self.screen.line(f"[refused: {problem_text(response)}]", "red")
                    return
                async for event in server_events(response.aiter_lines()):
                    if event.event == "run.started":
                        turn.run_id = event.data["run_id"]
                        if turn.cancel_asked:
                            self._send_cancel(client, turn)
                    elif event.event == "error":  # the run's outcome could not be stored
                        title, detail = event.data.get("title", ""), event.data.get("detail", "")
                        self.screen.line(
                            f"[run {turn.run_id} not stored: {title} - {detail}]", "red"
                        )
                        return
                    elif event.event == "run.finished":
                        self.screen.finished(event.data)
                        action = event.data.get("required_action") or {}
                        self.pending = list(action.get("tool_calls") or [])
                        if self.pending:
                            self._show_pending()
                        return
                    else:
                        self.screen.event(event)
        except httpx.TransportError as exc:
            self.screen.line(f"[connection lost: {exc or type(exc).__name__}]", "red")
            return
        self.screen.line("[the stream ended before the run did]", "red")

    # -- Ctrl-C during a run --

    def _on_interrupt(self, handler: Callable[[], None]) -> Callable[[], None]:
        """Route SIGINT to ``handler`` until the returned function is called (where the loop
        cannot, e.g. on Windows, Ctrl-C stays a KeyboardInterrupt that ends the chat)."""
        loop = asyncio.get_running_loop()
        previous = signal.getsignal(signal.SIGINT)
        try:
            loop.add_signal_handler(signal.SIGINT, handler)
        except (NotImplementedError, RuntimeError, ValueError):
            return lambda: None

        def restore() -> None:
            loop.remove_signal_handler(signal.SIGINT)
            signal.signal(signal.SIGINT, previous)  # asyncio.run's own, which it expects back

        return restore

    def _interrupt(self, client: httpx.AsyncClient, turn: Turn, stream: asyncio.Task[None]) -> None:
        if turn.cancel_asked:
            turn.abandoned.set()
            stream.cancel()
            return
        turn.cancel_asked = True
        self.screen.line("[cancelling...]", "yellow")
        if turn.run_id is not None:
            self._send_cancel(client, turn)

    def _send_cancel(self, client: httpx.AsyncClient, turn: Turn) -> None:
        if turn.cancel_sent or turn.run_id is None:
            return
        turn.cancel_sent = True
        task = asyncio.create_task(self._cancel(client, turn.run_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _cancel(self, client: httpx.AsyncClient, run_id: str) -> None:
        import httpx

        try:
            response = await client.post(self._path("runs", run_id, "cancel"))
        except httpx.TransportError as exc:
            self.screen.line(f"[could not cancel: {exc or type(exc).__name__}]", "red")
            return
        # 409 run-not-active: it ended meanwhile, and run.finished says how
        if response.status_code not in (202, 409):
            self.screen.line(f"[could not cancel: {problem_text(response)}]", "red")
