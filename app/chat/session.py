"""The chat itself (docs/chat.md): find or create the conversation, then one streamed run per
line typed, Ctrl-C cancelling the run in progress, pending tool calls answered before the next
line is sent."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from .keyboard import Interrupted, Keyboard
from .render import Screen, problem_text, shorten
from .sse import server_events

if TYPE_CHECKING:
    import httpx
    from rich.console import Console

QUIT = "/quit"
#: how long an ordinary request may take; a streamed run has no read timeout (it may sleep)
REQUEST_TIMEOUT_SECONDS = 30.0


class ChatError(Exception):
    """A failure that ends the chat, reported as one line on stderr."""


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

        from .. import __version__

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
