"""A gated OpenAI-compatible server for real ``carryover serve`` processes.

Each ``POST /v1/chat/completions`` is held until the test releases it, so a run stays in flight
exactly as long as the test needs — no ``/sleep`` window to race. The test learns that the
request arrived (:meth:`GatedOpenAI.arrival`), does what it came for (cancel, kill, pause,
a second run, …), and releases it; the answer then streams like a real one::

    with GatedOpenAI() as gate:
        [server] = await servers.start(url, **gate.settings())   # profile "gated"
        running = background_run(server, conv, "hello", agent="gated")
        held = await gate.arrival("hello")                        # in flight now
        ...
        held.release()

:meth:`GatedOpenAI.settings` configures a server through its environment: a profile ``gated``
(``CARRYOVER_AGENTS``: provider ``openai``, the fake's ``base_url``, no key — an OpenAI-compatible
server with a ``base_url`` takes none); the default profile stays ``echo``. The answer is one text,
``Gated: You said: "<last user text>"``, streamed in chunks with its usage.

Requests wait in the fake's handler threads (after the response headers, as a model that takes
its time); closing the fake releases whatever is still held.

:class:`StallAfter` is the same idea for any fake (``class StalledOpenAI(StallAfter,
OpenAIFake)``): each streamed answer sends its first events, then holds the rest until the test
sets ``stall.go`` — a model that stops mid-answer, for cancellation tests.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from ..helpers import HANG_GUARD_SECONDS, until
from ._server import FakeServer, JSONAnswer, RecordedRequest, SSEAnswer, pieces, sse

#: the profile name under which :meth:`GatedOpenAI.settings` configures the fake
PROFILE = "gated"


@dataclass
class HeldRequest:
    """One chat-completions request waiting at the gate."""

    request: RecordedRequest
    prompt: str  # the text of its last user message
    released: threading.Event = field(default_factory=threading.Event)
    answered: threading.Event = field(default_factory=threading.Event)  # whole answer written

    def release(self) -> None:
        self.released.set()


class _GatedEvents(Sequence[bytes]):
    """The SSE events of one answer: the first ``sent`` go out at once (then ``stalled`` is
    set), the rest once ``go`` is set (then ``ended`` is)."""

    def __init__(
        self,
        events: Sequence[bytes],
        *,
        sent: int = 0,
        go: threading.Event,
        ended: threading.Event,
        stalled: threading.Event | None = None,
    ) -> None:
        self._events = list(events)
        self._sent = sent
        self._go, self._ended, self._stalled = go, ended, stalled

    def __len__(self) -> int:
        return len(self._events)

    @overload
    def __getitem__(self, index: int) -> bytes: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[bytes]: ...
    def __getitem__(self, index: int | slice) -> bytes | Sequence[bytes]:
        return self._events[index]

    def __iter__(self) -> Iterator[bytes]:
        yield from self._events[: self._sent]
        if self._stalled is not None:
            self._stalled.set()
        self._go.wait()
        yield from self._events[self._sent :]
        self._ended.set()


@dataclass
class Stall:
    """What a stalled stream did: ``stalled`` once its first events were sent, ``ended`` once
    the rest was; the test sets ``go`` to let the rest out."""

    stalled: threading.Event = field(default_factory=threading.Event)
    go: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)


class StallAfter:
    """Mixin for any :class:`FakeServer`: each SSE answer sends its first ``stall_after``
    events, then waits until the test sets ``stall.go`` (a model that stops mid-answer)::

        class StalledOpenAI(StallAfter, OpenAIFake): ...
    """

    stall_after = 3

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stall = Stall()

    def handle(self, request: RecordedRequest) -> JSONAnswer | SSEAnswer:
        answer: JSONAnswer | SSEAnswer = super().handle(request)  # type: ignore[misc]
        if isinstance(answer, SSEAnswer):
            stall = self.stall
            answer.events = _GatedEvents(
                answer.events,
                sent=self.stall_after,
                go=stall.go,
                ended=stall.ended,
                stalled=stall.stalled,
            )
        return answer

    def stop(self) -> None:
        self.stall.go.set()
        super().stop()  # type: ignore[misc]


class GatedOpenAI(FakeServer):
    """Chat Completions that answer only once the test releases each request."""

    model = "gated-1"

    def __init__(self, hold: Callable[[str], bool] = lambda prompt: True) -> None:
        super().__init__()
        self.hold = hold
        self.held: list[HeldRequest] = []
        self._open = False
        self._ids = itertools.count(1)

    @property
    def base_url(self) -> str:
        return f"{self.origin}/v1"

    def settings(self, name: str = PROFILE) -> dict[str, str]:
        """Server settings (for ``server_env``) that add profile ``name`` answered here."""
        profile = {"provider": "openai", "model": self.model, "base_url": self.base_url}
        return {"agents": json.dumps({name: profile})}

    # --- the gate ----------------------------------------------------------------------

    async def arrival(self, prompt: str | None = None, *, count: int = 1) -> HeldRequest:
        """The ``count``-th held request (with this last user text, when given), once it has
        arrived; fails after a generous timeout (a hang guard, nothing is timed)."""

        async def probe() -> HeldRequest | None:
            with self._lock:
                matching = [h for h in self.held if prompt is None or h.prompt == prompt]
            return matching[count - 1] if len(matching) >= count else None

        return await until(probe, what=f"request {prompt!r} #{count}", within=HANG_GUARD_SECONDS)

    async def release_in_order(self, count: int) -> None:
        """Let ``count`` requests answer one at a time, each once it has arrived, in the order
        they arrived (a model that answers one request after the other)."""
        for n in range(1, count + 1):
            (await self.arrival(count=n)).release()

    def release_all(self) -> None:
        with self._lock:
            for held in self.held:
                held.release()

    def open(self) -> None:
        """Release every held request and let every later one through."""
        with self._lock:
            self._open = True
        self.release_all()

    def stop(self) -> None:
        self.open()  # no handler thread stays blocked
        super().stop()

    # --- answers -----------------------------------------------------------------------

    def handle(self, request: RecordedRequest) -> JSONAnswer | SSEAnswer:
        # called with self._lock held
        if request.method != "POST" or not request.path.rstrip("/").endswith("/chat/completions"):
            return JSONAnswer(404, {"error": {"message": f"no route {request.path}"}})
        body = request.json
        prompt = _last_user_text(body.get("messages") or [])
        events = self._events(body, f'Gated: You said: "{prompt}"')
        held = HeldRequest(request, prompt)
        if self._open or not self.hold(prompt) or not body.get("stream"):
            held.release()
        else:
            self.held.append(held)
        if not body.get("stream"):  # carryover always streams; this is never held
            return JSONAnswer(200, self._whole(body, f'Gated: You said: "{prompt}"'))
        return SSEAnswer(_GatedEvents(events, go=held.released, ended=held.answered))

    def _events(self, body: dict[str, Any], text: str) -> list[bytes]:
        response_id = f"chatcmpl-gated-{next(self._ids)}"
        model = body.get("model") or self.model

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            return sse(
                {
                    "id": response_id,
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": model,
                    "choices": [
                        {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                    ],
                }
            )

        events = [chunk({"role": "assistant", "content": ""})]
        events += [chunk({"content": piece}) for piece in pieces(text, 8)]
        events.append(chunk({}, "stop"))
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
            events.append(
                sse(
                    {
                        "id": response_id,
                        "object": "chat.completion.chunk",
                        "created": 0,
                        "model": model,
                        "choices": [],
                        "usage": usage,
                    }
                )
            )
        events.append(sse("[DONE]"))
        return events

    def _whole(self, body: dict[str, Any], text: str) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-gated-{next(self._ids)}",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model") or self.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
        }


def _last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        return "".join(part.get("text", "") for part in content or [] if part.get("type") == "text")
    return ""
