"""A gated provider for in-process apps: each request waits at a gate the test opens.

It answers exactly as the ``echo`` provider does (directives included), but only once the test
releases the request, so a test holds a run in flight for as long as it needs — no ``/sleep``
window to race::

    gate = GatedProvider()
    async with app_factory(agents=gated_pool(make_settings(), gate)) as client:
        running = asyncio.create_task(client.post(".../runs", json={"prompts": ["hi"]}))
        held = await gate.arrival()        # the run's provider request is in flight now
        ...                                # PUT, cancel, a second run, ...
        held.release()                     # the answer streams; the run ends
        await running

``hold`` chooses the requests to hold by their last user text (default: all); the others, and
summary requests (compaction) unless ``hold_summaries=True``, pass straight through. A request
whose run is cancelled while it waits is marked ``cancelled`` (its task was cancelled there).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from app.agent.messages import UserMessage, text_of
from app.agent.providers.base import Provider, ProviderRequest, StreamEvent
from app.agent.providers.echo import EchoProvider
from app.config import AgentProfile, Settings
from app.service.agents import AgentPool, build_agent

#: the longest a test waits for a request to arrive before it calls it a hang
ARRIVAL_TIMEOUT = 60.0


@dataclass
class Held:
    """One provider request waiting at the gate."""

    request: ProviderRequest
    released: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: bool = False  # the request's task was cancelled while it waited
    answered: asyncio.Event = field(default_factory=asyncio.Event)  # the answer was streamed

    @property
    def prompt(self) -> str:
        """The text of the request's last user message ("" when it has none)."""
        users = [m for m in self.request.messages if isinstance(m, UserMessage)]
        return text_of(users[-1]) if users else ""

    def release(self) -> None:
        self.released.set()


class GatedProvider:
    """A :class:`Provider` that holds every request until the test releases it."""

    def __init__(
        self,
        inner: Provider | None = None,
        *,
        hold: Callable[[str], bool] = lambda prompt: True,
        hold_summaries: bool = False,
    ) -> None:
        self.inner: Provider = inner or EchoProvider()
        self.name = self.inner.name  # its answers are the inner provider's, under its name
        self.hold = hold
        self.hold_summaries = hold_summaries
        self.held: list[Held] = []
        self._changed = asyncio.Condition()
        self._open = False

    async def aclose(self) -> None:
        await self.inner.aclose()

    def open(self) -> None:
        """Release every request held now and let every later one through."""
        self._open = True
        for held in self.held:
            held.release()

    def release_all(self) -> None:
        for held in self.held:
            held.release()

    async def arrival(self, prompt: str | None = None, *, count: int = 1) -> Held:
        """The ``count``-th request to arrive (with this last user text, when given), once it
        has; fails after :data:`ARRIVAL_TIMEOUT` (a hang guard)."""

        def found() -> Held | None:
            matching = [h for h in self.held if prompt is None or h.prompt == prompt]
            return matching[count - 1] if len(matching) >= count else None

        async def wait() -> Held:
            async with self._changed:
                await self._changed.wait_for(lambda: found() is not None)
            held = found()
            assert held is not None
            return held

        try:
            return await asyncio.wait_for(wait(), ARRIVAL_TIMEOUT)
        except TimeoutError:
            seen = [h.prompt for h in self.held]
            raise AssertionError(f"no request {prompt!r} #{count} arrived; seen {seen}") from None

    async def stream(self, request: ProviderRequest) -> AsyncIterator[StreamEvent]:
        held = Held(request)
        summary = request.purpose == "summary"
        if (summary and not self.hold_summaries) or (not summary and not self.hold(held.prompt)):
            async for event in self.inner.stream(request):
                yield event
            return
        if self._open:
            held.release()
        async with self._changed:
            self.held.append(held)
            self._changed.notify_all()
        try:
            await held.released.wait()
        except asyncio.CancelledError:
            held.cancelled = True
            raise
        async for event in self.inner.stream(request):
            yield event
        held.answered.set()


def gated_pool(settings: Settings, provider: GatedProvider, name: str = "default") -> AgentPool:
    """The agents of ``settings``, with profile ``name`` answered by ``provider``."""
    pool = AgentPool(settings)
    profile = settings.profiles().get(name, AgentProfile())
    pool.put(name, build_agent(profile, provider=provider))
    return pool
