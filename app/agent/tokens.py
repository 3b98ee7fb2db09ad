"""Token estimates without a tokenizer download (PROVIDERS.md: none works offline).

The heuristic counts characters (about four per token for English text and code, with a
per-message overhead and a flat cost per image). It is calibrated by the usage the provider
reported: the latest assistant message that carries ``usage.input_tokens`` tells how many tokens
the request up to it really took, and the ratio between that and the heuristic for the same
prefix scales the estimate. The ratio is clamped so one odd report cannot swing it far.
Everything is derived from the context itself, so the agent keeps no state between runs.
"""

from __future__ import annotations

from collections.abc import Sequence

from .messages import (
    AnyMessage,
    AssistantMessage,
    ImageBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
    ToolResultMessage,
)

CHARS_PER_TOKEN = 4.0
MESSAGE_OVERHEAD = 4
IMAGE_TOKENS = 1_200
MIN_RATIO, MAX_RATIO = 0.5, 2.5


def _chars(message: AnyMessage) -> float:
    total = 0.0
    for block in message.content:
        if isinstance(block, TextBlock):
            total += len(block.text)
        elif isinstance(block, ImageBlock):
            total += IMAGE_TOKENS * CHARS_PER_TOKEN
        elif isinstance(block, ThinkingBlock):
            total += len(block.thinking) + len(block.signature) / 4
        elif isinstance(block, RedactedThinkingBlock):
            total += len(block.data) / 4
        elif isinstance(block, ToolCallBlock):
            total += len(block.name) + len(block.arguments) + 8
    if isinstance(message, ToolResultMessage):
        total += len(message.tool_call_id) + 8
    return total


def heuristic_tokens(message: AnyMessage) -> int:
    return int(_chars(message) / CHARS_PER_TOKEN) + MESSAGE_OVERHEAD


def heuristic_text_tokens(text: str) -> int:
    return int(len(text) / CHARS_PER_TOKEN) + (MESSAGE_OVERHEAD if text else 0)


def calibration(system_prompt: str, summary: str, messages: Sequence[AnyMessage]) -> float:
    """Ratio of reported to estimated tokens, from the latest assistant usage report."""
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        if isinstance(message, AssistantMessage) and message.usage.input_tokens > 0:
            estimated = (
                heuristic_text_tokens(system_prompt)
                + heuristic_text_tokens(summary)
                + sum(heuristic_tokens(m) for m in messages[:i])
            )
            reported = message.usage.input_tokens
            if estimated <= 0:
                return 1.0
            return min(MAX_RATIO, max(MIN_RATIO, reported / estimated))
    return 1.0


def estimate(system_prompt: str, summary: str, messages: Sequence[AnyMessage]) -> int:
    """Estimated input tokens of a request carrying this system prompt, summary and messages."""
    raw = (
        heuristic_text_tokens(system_prompt)
        + heuristic_text_tokens(summary)
        + sum(heuristic_tokens(m) for m in messages)
    )
    return int(raw * calibration(system_prompt, summary, messages))
