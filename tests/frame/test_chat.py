"""``carryover chat`` driven in a pseudo-terminal (pexpect) against a real ``carryover serve``.

What the terminal shows is read through :class:`Terminal`, which strips the escape sequences
prompt_toolkit and rich write (colours, cursor moves) and matches on the text a user sees. Every
wait is bounded by a hang guard only; nothing is timed.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.gated_http import GatedOpenAI, StallAfter
from tests.helpers import HANG_GUARD_SECONDS, until

from .live_server import LiveServer, live_server

pexpect = pytest.importorskip("pexpect")

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminals are POSIX")

ROOT = Path(__file__).resolve().parents[2]

#: CSI sequences (colours, cursor moves, modes), OSC strings, and two-character escapes
ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_=>]")


def visible(raw: str) -> str:
    return ESCAPES.sub("", raw).replace("\r", "")


class Terminal:
    """A ``carryover chat`` in a pseudo-terminal: what it printed so far, as text."""

    def __init__(self, child: Any) -> None:
        self.child = child
        self.raw = ""
        self.mark = 0  # where the next expect starts looking

    @property
    def text(self) -> str:
        return visible(self.raw)

    def expect(self, pattern: str) -> re.Match[str]:
        """Read until ``pattern`` (a regex) appears after the previous match; the match. Fails
        when the chat ends or prints nothing for the hang guard."""
        regex = re.compile(pattern)
        while True:
            found = regex.search(self.text[self.mark :])
            if found:
                self.mark += found.end()
                return found
            try:
                self.raw += self.child.read_nonblocking(65536, timeout=HANG_GUARD_SECONDS)
            except (pexpect.EOF, pexpect.TIMEOUT) as exc:
                raise AssertionError(
                    f"{pattern!r} never appeared ({type(exc).__name__}); the terminal shows:\n"
                    f"{self.text[self.mark :]}"
                ) from None

    def type(self, line: str) -> None:
        """Type ``line`` at the prompt and press Enter."""
        self.expect(r"you>")
        self.child.send(line + "\r")

    def exit_status(self) -> int:
        try:
            while True:
                self.raw += self.child.read_nonblocking(65536, timeout=HANG_GUARD_SECONDS)
        except pexpect.EOF:
            pass
        self.child.close()
        status: int = self.child.exitstatus
        return status


@contextmanager
def chat(*args: str, **env: str) -> Iterator[Terminal]:
    environment = {
        k: v for k, v in os.environ.items() if not k.upper().startswith(("CARRYOVER_", "NO_COLOR"))
    }
    # no cursor-position request to answer; a wide screen, so no line wraps in the middle
    environment.update({"TERM": "xterm-256color", "PROMPT_TOOLKIT_NO_CPR": "1", **env})
    child = pexpect.spawn(
        sys.executable,
        ["-m", "app.cli", "chat", *args],
        cwd=str(ROOT),
        env=environment,
        encoding="utf-8",
        dimensions=(50, 220),
    )
    try:
        yield Terminal(child)
    finally:
        if child.isalive():
            child.terminate(force=True)


@contextmanager
def server(tmp_path: Path, **env: str) -> Iterator[LiveServer]:
    with live_server(tmp_path, **env) as live:
        live.read_until(lambda line: "listening on" in line)
        yield live


def active_run(url: str, conversation: str, headers: dict[str, str] | None = None) -> str:
    """The id of the conversation's run in progress, once there is one."""

    async def probe() -> str | None:
        async with httpx.AsyncClient(base_url=url, headers=headers) as client:
            found = await client.get(f"/conversations/{conversation}")
            active: str | None = found.json()["active_run_id"]
            return active

    return asyncio.run(until(probe, what="a run in progress"))


def test_a_two_turn_chat_with_tools_compaction_and_a_cancelled_run(tmp_path: Path) -> None:
    with server(tmp_path) as live, chat("--url", live.url) as term:
        conversation = term.expect(r"conversation (\S+) \(new\)").group(1)

        term.type("hello there")
        term.expect(r'agent: Echo: I saw 1 message\. You said: "hello there"')
        term.type("and again")
        term.expect(r'agent: Echo: I saw 3 messages\. You said: "and again"')

        term.type("/tool time_now {}")
        term.expect(r"\[tool\] time_now\(\{\}\)")
        stamp = term.expect(r"\[tool\] time_now returned: (\S+)").group(1)
        term.expect(rf'agent: Tool time_now returned: "{re.escape(stamp)}"')

        term.type("/overflow")
        term.expect(r"\[compaction\] overflow: folded \d+ messages")
        term.expect(r'agent: Echo: I saw 1 message and a summary\. You said: "/overflow"')

        term.type("/sleep 30")
        run_id = active_run(live.url, conversation)
        term.child.sendintr()
        term.expect(r"\[cancelling\.\.\.\]")
        term.expect(rf"\[run {run_id} cancelled")
        record = httpx.get(f"{live.url}/conversations/{conversation}/runs/{run_id}").json()
        assert record["status"] == "cancelled"
        assert [p["content"][0]["text"] for p in record["prompts"]] == ["/sleep 30"]

        # right after a cancel, Ctrl-C at the prompt leaves
        term.expect(r"you>")
        term.child.sendintr()
        assert term.exit_status() == 0

        runs = httpx.get(f"{live.url}/conversations/{conversation}/runs").json()["items"]
        assert [r["status"] for r in runs] == ["completed"] * 4 + ["cancelled"]


class StalledGate(StallAfter, GatedOpenAI):
    """An OpenAI-compatible model that sends the start of its answer, then waits for the test
    (``stall.go``) before the rest."""

    stall_after = 3  # the role chunk and the first two pieces: 'Gated: Y', 'ou said:'


def test_the_answer_shows_while_it_streams(tmp_path: Path) -> None:
    with StalledGate(hold=lambda prompt: False) as gate:
        env = {f"CARRYOVER_{k.upper()}": v for k, v in gate.settings().items()}
        with server(tmp_path, **env) as live, chat("--url", live.url, "--agent", "gated") as term:
            conversation = term.expect(r"conversation (\S+) \(new\)").group(1)
            term.type("stream it")
            assert gate.stall.stalled.wait(HANG_GUARD_SECONDS)
            # the first pieces are on the screen while the model still holds the rest
            term.expect(r"agent: Gated: You said:")
            assert active_run(live.url, conversation) is not None
            assert not gate.stall.ended.is_set()
            gate.stall.go.set()
            term.expect(r'\A "stream it"\n')  # the rest of the same line
            term.type("/quit")
            assert term.exit_status() == 0
            records = httpx.get(f"{live.url}/conversations/{conversation}/runs").json()["items"]
            assert [(r["agent"], r["status"]) for r in records] == [("gated", "completed")]


def test_api_key_from_the_flag_or_the_environment(tmp_path: Path) -> None:
    key = "chat-test-key-0001"
    with server(tmp_path, CARRYOVER_API_KEYS=f"acme:{key}") as live:
        with chat("--url", live.url) as term:
            term.expect(r"carryover chat: .*401")
            assert term.exit_status() == 1

        with chat("talk-1", "--url", live.url, "--api-key", key) as term:
            term.expect(r"conversation talk-1 \(new\)")
            term.type("first")
            term.expect(r'You said: "first"')
            term.type("/quit")
            assert term.exit_status() == 0

        # CARRYOVER_URL and CARRYOVER_API_KEY stand in for the flags; the id continues it
        with chat("talk-1", CARRYOVER_URL=live.url, CARRYOVER_API_KEY=key) as term:
            term.expect(r"conversation talk-1 \(2 messages\)")
            term.type("second")
            term.expect(r'agent: Echo: I saw 3 messages\. You said: "second"')
            term.expect(r"you>")  # the prompt reads keys now: Ctrl-D is a key, not a tty EOF
            term.child.sendeof()
            assert term.exit_status() == 0

        listed = httpx.get(
            f"{live.url}/conversations/talk-1", headers={"Authorization": f"Bearer {key}"}
        ).json()
        assert listed["message_count"] == 4


def test_lines_from_a_pipe_are_runs_too(tmp_path: Path) -> None:
    """Without a terminal the chat reads plain lines (no prompt_toolkit) and ends at EOF."""
    import subprocess

    with server(tmp_path) as live:
        done = subprocess.run(
            [sys.executable, "-m", "app.cli", "chat", "piped", "--url", live.url],
            input="one\ntwo\n",
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=HANG_GUARD_SECONDS,
        )
    assert done.returncode == 0, done.stderr
    assert "conversation piped (new)" in done.stdout
    assert 'agent: Echo: I saw 1 message. You said: "one"' in done.stdout
    assert 'agent: Echo: I saw 3 messages. You said: "two"' in done.stdout


def test_server_events_follow_the_event_stream_format() -> None:
    from app.chat import ServerEvent, server_events

    async def lines() -> Any:
        for line in [": a comment", "event: delta", 'data: {"a":', "data: 1}", "", "", "data: 2"]:
            yield line

    async def collect() -> list[ServerEvent]:
        return [event async for event in server_events(lines())]

    assert asyncio.run(collect()) == [ServerEvent("delta", {"a": 1}), ServerEvent("message", 2)]


def test_an_unreachable_server_is_one_line_and_status_1(tmp_path: Path) -> None:
    import subprocess

    from .live_server import free_port

    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "chat", "--url", f"http://127.0.0.1:{free_port()}"],
        input="",
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=HANG_GUARD_SECONDS,
    )
    assert done.returncode == 1
    assert done.stderr.startswith("carryover chat: cannot reach http://127.0.0.1:")
    assert len(done.stderr.splitlines()) == 1


def _pauses() -> bool:
    from app.api import schemas

    return "requires_action" in str(schemas.Run.model_fields["status"].annotation)


@pytest.mark.skipif(not _pauses(), reason="runs do not pause (requires_action) over HTTP yet")
def test_an_approval_call_is_asked_for_and_answered(tmp_path: Path) -> None:
    with (
        server(tmp_path, CARRYOVER_APPROVAL_REQUIRED="wait") as live,
        chat("--url", live.url) as term,
    ):
        conversation = term.expect(r"conversation (\S+) \(new\)").group(1)
        term.type('/tool wait {"seconds": 0}')
        term.expect(r"requires_action\]")
        term.expect(r'\[pending\] wait\(\{"seconds": 0\}\) waits for approval')
        term.expect(r'approve wait\(\{"seconds": 0\}\)\? \[y/N\]')
        term.child.send("y\r")
        term.expect(r"\[tool\] wait returned: waited 0 seconds")
        term.expect(r'agent: Tool wait returned: "waited 0 seconds"')

        term.type('/tool wait {"seconds": 5}')
        term.expect(r'approve wait\(\{"seconds": 5\}\)\? \[y/N\]')
        term.child.send("n\r")
        term.expect(r"agent: Tool wait failed: .*denied in carryover chat")
        term.type("/quit")
        assert term.exit_status() == 0

        runs = httpx.get(f"{live.url}/conversations/{conversation}/runs").json()["items"]
        assert [r["status"] for r in runs] == ["requires_action", "completed"] * 2


@pytest.mark.skipif(not _pauses(), reason="runs do not pause (requires_action) over HTTP yet")
def test_a_pending_client_call_is_answered_when_the_chat_opens(tmp_path: Path) -> None:
    with server(tmp_path) as live:
        # another application paused the conversation on its client tool
        httpx.post(f"{live.url}/conversations", json={"id": "paused"}).raise_for_status()
        paused = httpx.post(
            f"{live.url}/conversations/paused/runs",
            json={"prompts": ["/tool lookup nvim"], "tools": [{"name": "lookup"}]},
        ).json()
        assert paused["status"] == "requires_action"

        with chat("paused", "--url", live.url) as term:
            term.expect(r"\[pending\] lookup\(nvim\) waits for a result")
            term.expect(r"result of lookup\(nvim\)>")
            term.child.send("a text editor\r")
            term.expect(r'agent: Tool lookup returned: "a text editor"')
            term.type("/quit")
            assert term.exit_status() == 0

        runs = httpx.get(f"{live.url}/conversations/paused/runs").json()["items"]
        assert [r["status"] for r in runs] == ["requires_action", "completed"]


def test_an_error_event_says_the_run_was_not_stored() -> None:
    """A stream that ends with ``error`` (the outcome could not be stored, docs/faults.md)."""
    import io

    from rich.console import Console

    from app.chat import Chat, Turn

    body = (
        'event: run.started\ndata: {"run_id":"run_1","conversation_id":"c","base_etag":"e"}\n\n'
        "event: error\ndata: "
        '{"title":"Database unavailable","detail":"the outcome was not stored","status":503}\n\n'
    )

    def answer(request: httpx.Request) -> httpx.Response:
        assert request.headers["accept"] == "text/event-stream"
        return httpx.Response(201, text=body, headers={"content-type": "text/event-stream"})

    out = io.StringIO()
    talk = Chat("http://test", None, "default", "c", console=Console(file=out, width=200))

    async def run() -> None:
        transport = httpx.MockTransport(answer)
        async with httpx.AsyncClient(base_url="http://test", transport=transport) as client:
            await talk._stream(client, {"prompts": ["x"]}, Turn())

    asyncio.run(run())
    assert out.getvalue() == (
        "[run run_1 not stored: Database unavailable - the outcome was not stored]\n"
    )
