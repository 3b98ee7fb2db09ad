"""A scripted provider for tests: each request takes the next step of a script.

A step is one of:
- a string: answered as one text block;
- a :class:`Calls` value: one assistant message with those tool calls;
- a :class:`ProviderError`: raised before anything streams;
- a :class:`Partial`: some text streams, then the error is raised (a cut stream);
- :data:`HANG`: some text streams, then the stream waits forever (to test cancellation).
Summary requests (compaction) are answered from ``summaries`` or a default text, and every
request is kept in ``requests`` for assertions.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from app.agent.messages import Usage
from app.agent.providers.base import (
    BlockStop,
    MessageStart,
    MessageStop,
    ProviderError,
    ProviderRequest,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    ToolCallStart,
    UsageUpdate,
)


@dataclass(frozen=True)
class Calls:
    calls: tuple[tuple[str, str, str], ...]  # (id, name, raw arguments)
    text: str = ""


@dataclass(frozen=True)
class Partial:
    text: str
    error: ProviderError


class _Hang:
    pass


HANG = _Hang()
Step = str | Calls | ProviderError | Partial | _Hang


@dataclass
class ScriptedProvider:
    script: list[Step]
    name: str = "scripted"
    summaries: list[str | ProviderError] = field(default_factory=list)
    requests: list[ProviderRequest] = field(default_factory=list)
    summary_requests: list[ProviderRequest] = field(default_factory=list)
    streaming: asyncio.Event = field(default_factory=asyncio.Event)

    async def aclose(self) -> None:
        return None

    async def stream(self, request: ProviderRequest) -> AsyncIterator[StreamEvent]:
        if request.purpose == "summary":
            self.summary_requests.append(request)
            step: Step = (
                self.summaries.pop(0)
                if self.summaries
                else (f"summary #{len(self.summary_requests)}")
            )
        else:
            self.requests.append(request)
            if not self.script:
                raise AssertionError("the script ran out of steps")
            step = self.script.pop(0)
        yield MessageStart(response_id=f"resp_{len(self.requests)}", model="scripted-1")
        if isinstance(step, ProviderError):
            raise step
        if isinstance(step, Partial):
            yield TextDelta(0, step.text)
            raise step.error
        if isinstance(step, _Hang):
            yield TextDelta(0, "partial answer")
            self.streaming.set()
            await asyncio.Event().wait()
            return
        if isinstance(step, Calls):
            offset = 0
            if step.text:
                yield TextDelta(0, step.text)
                offset = 1
            for i, (call_id, name, args) in enumerate(step.calls):
                yield ToolCallStart(i + offset, call_id, name)
                yield ToolCallDelta(i + offset, args)
                yield BlockStop(i + offset)
            yield UsageUpdate(Usage(input_tokens=10, output_tokens=5))
            yield MessageStop("tool_use")
            return
        yield TextDelta(0, step)
        yield BlockStop(0)
        yield UsageUpdate(Usage(input_tokens=10, output_tokens=5))
        yield MessageStop("end_turn")
