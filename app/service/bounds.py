"""Limits on what a run stores, not only on what clients send.

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
  failed run. ``POST …/compact`` is under the same deadline: a compaction past it is stopped
  (its summary request with it), ends ``failed`` the same way and stores nothing.
- :func:`size_bounds` and :func:`refusal`: the stored context's own bounds. A PUT refuses a
  context of more than ``max_context_messages`` messages or whose JSON passes
  ``max_body_bytes``; a run's context could grow past both. So the agent is given the bounds
  (``Input.bounds``): it compacts when its context would pass ``size_compact_at`` of either,
  and fails the run (``context_too_large``, problem ``run-context-too-large``) rather than pass
  one. Whatever a run would store is checked once more before it is stored
  (:func:`refusal`, O(what the run changed), from the stored running size): the count, the
  bytes, and each text block and image the run added (``max_text_chars``,
  ``max_image_bytes``: server-tool results are not otherwise bounded), by the rule a PUT's
  check uses (:func:`oversized_block`). A context that would pass is not stored — even with
  ``on_failure: keep`` — and the run ends ``failed`` (or as it had ended, failed or cancelled,
  its error saying why nothing was kept).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Literal

from app.agent.messages import AnyMessage, AttemptError, Base64Source, ImageBlock, TextBlock
from app.agent.offload import offload
from app.agent.providers.base import (
    Provider,
    ProviderError,
    ProviderRequest,
    RedactedThinking,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolCallDelta,
    wire_of,
)
from app.agent.records import Result
from app.agent.sizes import (
    CONTEXT_TOO_LARGE,
    REMEDY,
    ContextSize,
    SizeBounds,
    passed_reason,
    result_size,
    too_large,
)
from app.config import Settings
from app.store.stores import Loaded

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
        self.wire = wire_of(inner)  # and its requests too (their carried-over encoding)
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

    def __init__(self, seconds: float, stop: Callable[[], object], what: str = "run") -> None:
        self.seconds = seconds
        self._stop = stop
        self.what = what
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
                    message=f"the {self.what} passed its deadline of {self.seconds:g} seconds "
                    "(run_deadline_seconds) and was stopped",
                    code=RUN_DEADLINE,
                ),
            }
        )


def size_bounds(settings: Settings) -> SizeBounds:
    """The bounds a stored context stays within: what a PUT of it accepts."""
    return SizeBounds(
        max_messages=settings.max_context_messages,
        max_bytes=settings.max_body_bytes,
        compact_at=settings.size_compact_at,
    )


@dataclass(frozen=True, slots=True)
class OversizedBlock:
    """A block past its configured limit: the ``block``-th of the ``message``-th message."""

    message: int
    block: int
    limit: Literal["max_text_chars", "max_image_bytes"]
    maximum: int
    actual: int

    @property
    def field(self) -> str:
        """The block's field that holds what passed the limit."""
        return "text" if self.limit == "max_text_chars" else "source.data"

    @property
    def what(self) -> str:
        """The block, as a refusal names it."""
        if self.limit == "max_text_chars":
            return f"a text block of {self.actual} characters"
        return f"an image of {self.actual} bytes"


def oversized_block(
    settings: Settings, messages: Sequence[AnyMessage], start: int = 0
) -> OversizedBlock | None:
    """The first block of ``messages[start:]`` past its limit, or ``None``: a text block of more
    than ``max_text_chars`` characters, a base64 image of more than ``max_image_bytes`` bytes
    decoded. The one rule for both, whether a client sends the messages (app.api.limits) or a
    run adds them (:func:`refusal`)."""
    for i in range(start, len(messages)):
        for j, block in enumerate(messages[i].content):
            if isinstance(block, TextBlock) and len(block.text) > settings.max_text_chars:
                return OversizedBlock(
                    i, j, "max_text_chars", settings.max_text_chars, len(block.text)
                )
            if isinstance(block, ImageBlock) and isinstance(block.source, Base64Source):
                decoded = block.source.decoded_size()
                if decoded > settings.max_image_bytes:
                    return OversizedBlock(
                        i, j, "max_image_bytes", settings.max_image_bytes, decoded
                    )
    return None


def refusal(settings: Settings, base: Loaded, result: Result) -> tuple[ContextSize, str | None]:
    """The size of what the run would store, and why it may not be stored (``None``: it may):
    a PUT of it would be refused. O(what the run changed)."""
    size = result_size(base.size, len(base.context.messages), result)
    passed = size_bounds(settings).passed(size)
    if passed is not None:
        return size, passed_reason(passed)
    messages = result.context.messages
    added = len(messages) + sum(len(c.folded) for c in result.compactions)
    added -= len(base.context.messages)  # the run's messages still in the context: the tail
    found = oversized_block(settings, messages, start=max(0, len(messages) - added))
    if found is not None:
        return size, (
            f"the run's context would hold {found.what}, more than {found.limit} ({found.maximum})"
        )
    return size, None


async def refusal_of(
    settings: Settings, base: Loaded, result: Result
) -> tuple[ContextSize, str | None]:
    """:func:`refusal`, off the event loop (:func:`~app.agent.offload.offload`) when the run
    changed many messages (a compaction of a long context: the folded messages are counted)."""
    changed = abs(len(result.context.messages) - len(base.context.messages))
    changed += sum(len(c.folded) for c in result.compactions)
    return await offload(changed, refusal, settings, base, result)


def refused(result: Result, reason: str) -> Result:
    """``result`` as it ends when its context may not be stored for ``reason``: a run that
    ended well now failed (``context_too_large``); one that failed or was cancelled keeps its
    status and error, which now says that its context was not kept."""
    error = result.error
    if result.status in ("completed", "requires_action") or error is None:
        return result.model_copy(update={"status": "failed", "error": too_large(reason)})
    if error.code == CONTEXT_TOO_LARGE:
        return result  # the agent stopped it for its size already, and says so
    message = f"{error.message}; its context was not kept (on_failure keep): {reason}; {REMEDY}"
    return result.model_copy(update={"error": error.model_copy(update={"message": message})})


__all__ = [
    "ANSWER_TOO_LARGE",
    "CONTEXT_TOO_LARGE",
    "RUN_DEADLINE",
    "BoundedProvider",
    "OversizedBlock",
    "RunDeadline",
    "oversized_block",
    "refusal",
    "refusal_of",
    "refused",
    "size_bounds",
]
