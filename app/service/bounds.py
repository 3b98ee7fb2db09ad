"""Limits on what a run stores, not only on what clients send (issue 10).

- :class:`BoundedProvider`: one provider answer — an assistant attempt or a compaction's
  summary, which is the text of a summary answer — is at most ``max_answer_chars`` characters
  (its text, thinking and tool-call arguments together). The attempt that passes it fails with
  a ``fatal`` error coded ``answer_too_large`` (problem ``run-answer-too-large``) before the
  delta that would pass it is taken, so what a failed run keeps of it still fits. Since
  ``max_answer_chars`` is at most ``max_text_chars`` (the settings refuse more), every text
  block and summary a run stores can be PUT back unchanged.
- :class:`RunDeadline`: a run's overall deadline (``run_deadline_seconds``). A provider that
  trickles a token every few seconds never trips a request timeout; the deadline stops the run
  the way a cancel does (the agent closes what it started and returns what it has), and the
  run then ends ``failed`` with a ``fatal`` error coded ``run_deadline`` (problem
  ``run-deadline-exceeded``): ``on_failure`` decides whether what it did is stored, as for any
  failed run.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from types import TracebackType

from app.agent.messages import AttemptError
from app.agent.providers.base import (
    Provider,
    ProviderError,
    ProviderRequest,
    RedactedThinking,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolCallDelta,
)
from app.agent.records import Result

ANSWER_TOO_LARGE = "answer_too_large"
RUN_DEADLINE = "run_deadline"


def _chars(event: StreamEvent) -> int:
    if isinstance(event, TextDelta):
        return len(event.text)
    if isinstance(event, ThinkingDelta):
        return len(event.thinking)
    if isinstance(event, ToolCallDelta):
        return len(event.arguments)
    if isinstance(event, RedactedThinking):
        return len(event.data)
    return 0


class BoundedProvider:
    """A provider whose answers are at most ``max_chars`` characters (see the module)."""

    def __init__(self, inner: Provider, max_chars: int) -> None:
        self.inner = inner
        self.name = inner.name  # its answers are the inner provider's, under its name
        self.max_chars = max_chars

    async def stream(self, request: ProviderRequest) -> AsyncIterator[StreamEvent]:
        total = 0
        async for event in self.inner.stream(request):
            total += _chars(event)
            if total > self.max_chars:
                what = "summary" if request.purpose == "summary" else "answer"
                raise ProviderError(
                    "fatal",
                    f"the provider's {what} passed max_answer_chars ({self.max_chars} "
                    "characters): a run stores nothing a PUT of the context would refuse",
                    code=ANSWER_TOO_LARGE,
                )
            yield event

    async def aclose(self) -> None:
        await self.inner.aclose()


class RunDeadline:
    """Calls ``stop`` once ``seconds`` have passed, unless the block ended before::

    with RunDeadline(seconds, stop) as deadline:
        result = await agent.run(...)
    result = deadline.settle(result)
    """

    def __init__(self, seconds: float, stop: Callable[[], None]) -> None:
        self.seconds = seconds
        self._stop = stop
        self.passed = False
        self._timer: asyncio.TimerHandle | None = None

    def _fire(self) -> None:
        self.passed = True
        self._stop()

    def __enter__(self) -> RunDeadline:
        self._timer = asyncio.get_running_loop().call_later(self.seconds, self._fire)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def settle(self, result: Result) -> Result:
        """A run the deadline stopped failed (it was not cancelled by anyone)."""
        if not self.passed or result.status != "cancelled":
            return result
        return result.model_copy(
            update={
                "status": "failed",
                "error": AttemptError(
                    kind="fatal",
                    message=f"the run passed its deadline of {self.seconds:g} seconds "
                    "(run_deadline_seconds) and was stopped",
                    code=RUN_DEADLINE,
                ),
            }
        )


__all__ = ["ANSWER_TOO_LARGE", "RUN_DEADLINE", "BoundedProvider", "RunDeadline"]
