"""Events a run reports while it goes, for streaming to clients (contract §4 server-sent events)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from .messages import AnyMessage, ToolCallBlock, ToolResultMessage
from .providers.base import StreamEvent
from .records import Compaction


@dataclass(frozen=True)
class Delta:
    """A provider stream event of the attempt in progress (text, thinking, tool call parts)."""

    event: StreamEvent


@dataclass(frozen=True)
class MessageCompleted:
    """A message became part of the run: an admitted prompt, an attempt, a tool result."""

    message: AnyMessage


@dataclass(frozen=True)
class ToolStarted:
    call: ToolCallBlock


@dataclass(frozen=True)
class ToolFinished:
    result: ToolResultMessage


@dataclass(frozen=True)
class CompactionCompleted:
    compaction: Compaction


RunEvent = Delta | MessageCompleted | ToolStarted | ToolFinished | CompactionCompleted
#: where a run's events go: a coroutine function, or a function that takes most events at once
#: and returns None (an awaitable for those it needs the event loop for)
EventSink = Callable[[RunEvent], Awaitable[None] | None]
