"""Fold a provider's stream events into one assistant message, complete or partial.

One builder serves every provider, so "what arrived before the end" (contract §1) means the same
thing for all of them: a stream that fails or is cancelled half-way still gives an assistant
message with ``stop_reason`` ``error`` or ``aborted``, its ``error`` and the partial content.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .messages import (
    AssistantBlock,
    AssistantMessage,
    AttemptError,
    RedactedThinkingBlock,
    StopReason,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
    Usage,
)
from .providers.base import (
    BlockStop,
    MessageStart,
    MessageStop,
    RedactedThinking,
    SignatureDelta,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolCallDelta,
    ToolCallStart,
    UsageUpdate,
)

_STOP_REASONS: dict[str, StopReason] = {
    "end_turn": "end_turn",
    "stop": "end_turn",
    "tool_use": "tool_use",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "max_tokens": "max_tokens",
    "length": "max_tokens",
    "stop_sequence": "stop_sequence",
    "refusal": "refusal",
    "pause_turn": "pause_turn",
    "content_filter": "content_filter",
}


def normalize_stop_reason(raw: str | None) -> StopReason:
    return _STOP_REASONS.get(raw or "end_turn", "other")


@dataclass
class _Block:
    kind: str
    text: list[str] = field(default_factory=list)
    signature: list[str] = field(default_factory=list)
    call_id: str = ""
    name: str = ""


@dataclass
class AttemptBuilder:
    """Accumulates stream events for one attempt of one provider."""

    provider: str
    model: str
    response_id: str = ""
    usage: Usage = field(default_factory=Usage)
    stop_reason: str | None = None
    provider_data: dict[str, Any] = field(default_factory=dict)
    _blocks: dict[int, _Block] = field(default_factory=dict)
    events: int = 0

    def feed(self, event: StreamEvent) -> None:
        self.events += 1
        match event:
            case MessageStart(response_id=rid, model=model):
                self.response_id = rid or self.response_id
                self.model = model or self.model
            case TextDelta(index=i, text=text):
                self._block(i, "text").text.append(text)
            case ThinkingDelta(index=i, thinking=text):
                self._block(i, "thinking").text.append(text)
            case SignatureDelta(index=i, signature=sig):
                self._block(i, "thinking").signature.append(sig)
            case RedactedThinking(index=i, data=data):
                self._block(i, "redacted_thinking").text.append(data)
            case ToolCallStart(index=i, id=call_id, name=name):
                block = self._block(i, "tool_call")
                block.call_id = call_id or block.call_id
                block.name = name or block.name
            case ToolCallDelta(index=i, arguments=args):
                self._block(i, "tool_call").text.append(args)
            case BlockStop():
                pass
            case UsageUpdate(usage=usage):
                self.usage = usage
            case MessageStop(stop_reason=reason, provider_data=data):
                self.stop_reason = reason
                self.provider_data = dict(data)

    def _block(self, index: int, kind: str) -> _Block:
        block = self._blocks.get(index)
        if block is None:
            block = self._blocks[index] = _Block(kind)
        return block

    def _content(self) -> tuple[AssistantBlock, ...]:
        out: list[AssistantBlock] = []
        for index in sorted(self._blocks):
            b = self._blocks[index]
            if b.kind == "text":
                out.append(TextBlock(text="".join(b.text)))
            elif b.kind == "thinking":
                out.append(ThinkingBlock(thinking="".join(b.text), signature="".join(b.signature)))
            elif b.kind == "redacted_thinking":
                out.append(RedactedThinkingBlock(data="".join(b.text)))
            else:
                out.append(
                    ToolCallBlock(
                        id=b.call_id or f"call_{index}",
                        name=b.name or "unknown",
                        arguments="".join(b.text),
                    )
                )
        return tuple(out)

    @property
    def has_content(self) -> bool:
        """Did any content arrive (a retry would then be a new, visible attempt)?"""
        return bool(self._blocks)

    @property
    def complete(self) -> bool:
        return self.stop_reason is not None

    def message(self) -> AssistantMessage:
        """The finished attempt (the stream reached its stop event)."""
        content = self._content()
        reason = normalize_stop_reason(self.stop_reason)
        if reason == "end_turn" and any(isinstance(b, ToolCallBlock) for b in content):
            reason = "tool_use"  # some compatible servers report "stop" with tool calls
        return AssistantMessage(
            content=content,
            provider=self.provider,
            model=self.model,
            response_id=self.response_id,
            stop_reason=reason,
            usage=self.usage,
            provider_data=self.provider_data,
        )

    def failed(self, error: AttemptError) -> AssistantMessage:
        """The attempt as far as it got, ended by ``error`` (an abort or a failure)."""
        return AssistantMessage(
            content=self._content(),
            provider=self.provider,
            model=self.model,
            response_id=self.response_id,
            stop_reason="aborted" if error.kind == "aborted" else "error",
            usage=self.usage,
            provider_data=self.provider_data,
            error=error,
        )
