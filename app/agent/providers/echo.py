"""The offline, deterministic ``echo`` provider (contract §6).

Its answer is derived only from the request: how many messages it saw, whether a summary was
present, and a quote of the last user text. Directives at the start of the last user text let
every path of the service be tried without a real model:

- ``/tool NAME ARGS``  one tool call to NAME whose raw ``arguments`` string is ARGS verbatim;
  once the result is back, a text answer quoting it. NAME may be any name: a server tool, or
  a client tool of the run (the run then pauses until the application sends the result).
- ``/fail``            the request fails with a fatal server error (500), not retried.
- ``/overflow``        fails as a context-window overflow while the request still holds
  anything before the prompt; the agent compacts (keeping the current turn) and retries, and
  the retry succeeds. A prompt that is the whole history cannot overflow.
- ``/sleep SECONDS``   waits that long (at most 3600 s) before answering.

With an output schema (structured outputs) its answer is a deterministic instance of the
schema (:func:`~app.agent.structured.instance_of`); ``/invalid`` answers one that does not
match it first (the correction is then answered with a valid one), ``/invalid always`` never
answers a valid one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from ..codec import compact_json
from ..compaction import SUMMARY_PREFIX
from ..messages import AnyMessage, TextBlock, ToolResultMessage, Usage, UserMessage, text_of
from ..structured import CORRECTION_PREFIX, broken_instance, instance_of
from ..tokens import heuristic_text_tokens, heuristic_tokens
from .base import (
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

MAX_SLEEP = 3600.0


class EchoProvider:
    name = "echo"

    def __init__(self, model: str = "echo-1") -> None:
        self.model = model or "echo-1"

    async def aclose(self) -> None:
        return None

    async def stream(self, request: ProviderRequest) -> AsyncIterator[StreamEvent]:
        messages = request.messages
        has_summary = bool(messages) and _is_summary(messages[0])
        history = messages[1:] if has_summary else messages
        input_tokens = request.estimated_input_tokens
        if input_tokens is None:
            input_tokens = heuristic_text_tokens(request.system_prompt) + sum(
                heuristic_tokens(m) for m in messages
            )
        response_id = f"echo-{len(messages)}"
        yield MessageStart(response_id=response_id, model=request.model or self.model)

        if request.purpose == "summary":
            async for event in _text(_summary(messages), input_tokens):
                yield event
            return

        last = history[-1] if history else None
        if isinstance(last, ToolResultMessage) and request.output_schema is not None:
            async for event in _text(_structured(request, history), input_tokens):
                yield event
            return
        if isinstance(last, ToolResultMessage):
            verb = "failed" if last.is_error else "returned"
            body = "".join(b.text for b in last.content if isinstance(b, TextBlock))
            async for event in _text(f'Tool {last.tool_name} {verb}: "{body}"', input_tokens):
                yield event
            return

        text = text_of(last).strip() if isinstance(last, UserMessage) else ""
        directive, _, rest = text.partition(" ")
        if directive == "/fail":
            raise ProviderError(
                "fatal",
                "echo: simulated fatal server error (/fail), not retried",
                status=500,
                code="server_error",
            )
        if directive == "/overflow" and len(history) > 1:
            raise ProviderError(
                "overflow",
                "echo: simulated context window overflow",
                status=400,
                code="context_length_exceeded",
            )
        if directive == "/sleep":
            seconds, _, rest = rest.partition(" ")
            try:
                delay = min(max(float(seconds), 0.0), MAX_SLEEP)
            except ValueError:
                delay = 0.0
            await asyncio.sleep(delay)
        if request.output_schema is not None and directive != "/tool":
            async for event in _text(_structured(request, history), input_tokens):
                yield event
            return
        if directive == "/tool":
            name, _, arguments = rest.partition(" ")
            if name:
                yield ToolCallStart(index=0, id=f"echo_call_{len(messages)}", name=name)
                yield ToolCallDelta(index=0, arguments=arguments)
                yield BlockStop(index=0)
                yield UsageUpdate(Usage(input_tokens=input_tokens, output_tokens=1))
                yield MessageStop(stop_reason="tool_use")
                return

        seen = f"I saw {len(history)} message{'s' if len(history) != 1 else ''}"
        seen += " and a summary" if has_summary else ""
        async for event in _text(f'Echo: {seen}. You said: "{text}"', input_tokens):
            yield event


def _structured(request: ProviderRequest, history: tuple[AnyMessage, ...]) -> str:
    """An instance of the request's schema; a broken one as ``/invalid`` asks."""
    assert request.output_schema is not None
    schema = request.output_schema.schema
    prompts = [text_of(m).strip() for m in history if isinstance(m, UserMessage)]
    correcting = bool(prompts) and prompts[-1].startswith(CORRECTION_PREFIX)
    asked = next((p for p in reversed(prompts) if not p.startswith(CORRECTION_PREFIX)), "")
    invalid = asked == "/invalid always" or (asked == "/invalid" and not correcting)
    value = broken_instance(schema) if invalid else instance_of(schema)
    return compact_json(value)


def _is_summary(message: AnyMessage) -> bool:
    return isinstance(message, UserMessage) and text_of(message).startswith(SUMMARY_PREFIX)


#: the longest summary the echo provider writes (well under the default max_answer_chars)
MAX_SUMMARY_CHARS = 100_000


def _summary(messages: tuple[AnyMessage, ...]) -> str:
    """A deterministic summary: the previous one, then one short line per folded message."""
    request_text = text_of(messages[-1]) if messages else ""
    previous, _, rest = request_text.partition("\n\nNew messages to fold in:\n")
    previous = previous.removeprefix("Previous summary:\n")
    folded = rest.rsplit("\n\nWrite the updated summary.", 1)[0]
    lines = [line[:120] for line in folded.splitlines() if line.strip()]
    parts = ([] if previous in ("", "(none yet)") else [previous]) + lines
    summary = " | ".join(parts) or "(empty conversation)"
    if len(summary) > MAX_SUMMARY_CHARS:  # a summary is shorter than what it folds: the tail
        summary = "… " + summary[len(summary) - MAX_SUMMARY_CHARS + 2 :]
    return summary


async def _text(text: str, input_tokens: int) -> AsyncIterator[StreamEvent]:
    words = text.split(" ")
    for i, word in enumerate(words):
        yield TextDelta(index=0, text=word if i == 0 else " " + word)
    yield BlockStop(index=0)
    yield UsageUpdate(Usage(input_tokens=input_tokens, output_tokens=heuristic_text_tokens(text)))
    yield MessageStop(stop_reason="end_turn")
