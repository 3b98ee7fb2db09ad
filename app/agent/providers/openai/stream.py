"""OpenAI Chat Completions provider: the response (chunks -> stream events).

Streaming is translated to :mod:`~app.agent.providers.base` events. Usage is requested with
``stream_options.include_usage`` and arrives in a last chunk with no choices.

Reasoning that compatible servers stream in ``reasoning_content`` (vLLM, DeepSeek) or
``reasoning`` (Ollama, OpenRouter) becomes a thinking block with an empty signature; it is not
sent back (no such request field).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from ...messages import Usage, token_count
from ..base import (
    BlockStop,
    MessageStart,
    MessageStop,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolCallDelta,
    ToolCallStart,
)


def _get(obj: Any, name: str) -> Any:
    """A field of an SDK object or a dict; ``None`` when absent.

    The SDK builds response objects without validation, so a field a compatible server left
    out (Ollama's tool-call ``index``) is simply missing.
    """
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(name)
    value = getattr(obj, name, None)
    if value is None:
        extra = getattr(obj, "model_extra", None)
        if isinstance(extra, dict):
            value = extra.get(name)
    return value


def _usage(raw: Any) -> Usage | None:
    if raw is None:
        return None
    details = _get(raw, "prompt_tokens_details")
    return Usage(
        input_tokens=token_count(int(_get(raw, "prompt_tokens") or 0)),
        output_tokens=token_count(int(_get(raw, "completion_tokens") or 0)),
        cache_read_tokens=token_count(int(_get(details, "cached_tokens") or 0)),
    )


@dataclass
class _Call:
    index: int  # our block index
    id: str
    name: str


@dataclass
class _Translator:
    """Chat Completions chunks -> stream events, with stable block indexes."""

    next_index: int = 0
    thinking_index: int | None = None
    text_index: int | None = None
    calls: list[_Call] = field(default_factory=list)
    by_wire_index: dict[int, _Call] = field(default_factory=dict)
    finish_reason: str | None = None
    refused: bool = False  # a ``refusal`` came: the message stops as a refusal
    started: bool = False
    token: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    def _alloc(self) -> int:
        index = self.next_index
        self.next_index += 1
        return index

    def start(self, response_id: Any, model: Any) -> list[StreamEvent]:
        if self.started:
            return []
        self.started = True
        return [MessageStart(response_id=str(response_id or ""), model=str(model or ""))]

    def reasoning(self, text: str) -> list[StreamEvent]:
        if self.thinking_index is None:
            self.thinking_index = self._alloc()
        return [ThinkingDelta(index=self.thinking_index, thinking=text)]

    def text(self, text: str) -> list[StreamEvent]:
        if self.text_index is None:
            self.text_index = self._alloc()
        return [TextDelta(index=self.text_index, text=text)]

    def _new_call(self, call_id: str | None, name: str | None) -> tuple[_Call, list[StreamEvent]]:
        index = self._alloc()
        # A missing id (Ollama) gets one that is stable for this attempt and unique enough
        # not to collide with the ids of other attempts in the conversation.
        call = _Call(index, call_id or f"call_{self.token}_{len(self.calls)}", name or "")
        self.calls.append(call)
        return call, [ToolCallStart(index=index, id=call.id, name=call.name)]

    def tool_call(self, delta: Any) -> list[StreamEvent]:
        wire_index = _get(delta, "index")
        call_id = _get(delta, "id") or None
        function = _get(delta, "function")
        name = _get(function, "name") or None
        arguments = _get(function, "arguments")
        events: list[StreamEvent] = []
        call: _Call | None = None
        if isinstance(wire_index, int):
            call = self.by_wire_index.get(wire_index)
            if call is not None and call_id is not None and call_id != call.id:
                call = None  # a server reusing an index for a new call
        elif call_id is None and name is None and self.calls:
            call = self.calls[-1]  # no index, no id, no name: continues the last call
        elif call_id is not None:
            call = next((c for c in self.calls if c.id == call_id), None)
        if call is None:
            call, events = self._new_call(call_id, name)
            if isinstance(wire_index, int):
                self.by_wire_index[wire_index] = call
        elif name and not call.name:
            call.name = name
            events.append(ToolCallStart(index=call.index, id=call.id, name=name))
        if isinstance(arguments, str) and arguments:
            events.append(ToolCallDelta(index=call.index, arguments=arguments))
        return events

    def text_chunk(self, chunk: dict[str, Any]) -> list[StreamEvent] | None:
        """The events of the commonest chunk, read with a few dict lookups: after the first
        chunk, no usage, one choice of index 0 without a finish reason, whose delta holds
        nothing but a piece of text. ``None`` for any other chunk: the general reading
        (``client._chunk``) takes it, and gives what it would give for this one."""
        if not self.started or chunk.get("usage") is not None:
            return None
        choices = chunk.get("choices")
        if type(choices) is not list or len(choices) != 1:
            return None
        choice = choices[0]
        if type(choice) is not dict or choice.get("index") or choice.get("finish_reason"):
            return None
        delta = choice.get("delta")
        if type(delta) is not dict:
            return None
        content = delta.get("content")
        if (
            type(content) is not str
            or not content
            or delta.get("reasoning_content")
            or delta.get("reasoning")
            or delta.get("refusal")
            or delta.get("tool_calls")
        ):
            return None
        return self.text(content)

    def choice(self, choice: Any, delta: Any) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        for key in ("reasoning_content", "reasoning"):
            value = _get(delta, key)
            if isinstance(value, str) and value:
                events += self.reasoning(value)
                break
        content = _get(delta, "content")
        if isinstance(content, str) and content:
            events += self.text(content)
        refusal = _get(delta, "refusal")  # structured outputs: the model declined, in words
        if isinstance(refusal, str) and refusal:
            self.refused = True
            events += self.text(refusal)
        for tool_call in _get(delta, "tool_calls") or ():
            events += self.tool_call(tool_call)
        reason = _get(choice, "finish_reason")
        if isinstance(reason, str) and reason:
            self.finish_reason = reason
        return events

    def stop(self) -> list[StreamEvent]:
        assert self.finish_reason is not None
        indexes = sorted(
            [i for i in (self.thinking_index, self.text_index) if i is not None]
            + [c.index for c in self.calls]
        )
        reason = "refusal" if self.refused and self.finish_reason == "stop" else self.finish_reason
        return [*(BlockStop(index=i) for i in indexes), MessageStop(stop_reason=reason)]
