"""Token estimates without a tokenizer download (PROVIDERS.md: none works offline).

The heuristic counts characters (about four per token for English text and code, with a
per-message overhead and a flat cost per image). It is calibrated by the usage the provider
reported: the latest assistant message that carries ``usage.input_tokens`` tells how many tokens
the request up to it really took, and the ratio between that and the heuristic for the same
prefix scales the estimate. The ratio is clamped so one odd report cannot swing it far.
Everything is derived from the context itself, so the agent keeps no state between runs.

Estimating a whole context is one pass over it; :class:`TokenTally` keeps the same estimate as
a running total (per-message heuristics summed, calibration from the latest usage report), so a
caller that stores the tally never recounts the history.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from .messages import (
    AnyMessage,
    AssistantMessage,
    Context,
    ImageBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
    ToolResultMessage,
    _Value,
)


class Folded(Protocol):
    """What :func:`changed_messages` reads of a compaction (``records.Compaction`` is one)."""

    @property
    def folded(self) -> Sequence[AnyMessage]: ...


class RunChanges(Protocol):
    """What :func:`changed_messages` reads of a run's result (``records.Result`` is one)."""

    @property
    def context(self) -> Context: ...

    @property
    def compactions(self) -> Sequence[Folded]: ...


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


def _ratio(reported: int, estimated: int) -> float:
    if estimated <= 0:
        return 1.0
    return min(MAX_RATIO, max(MIN_RATIO, reported / estimated))


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
            return _ratio(message.usage.input_tokens, estimated)
    return 1.0


def _reported(message: AnyMessage) -> int:
    """The input tokens a message's provider reported for the request up to it (0: none)."""
    return message.usage.input_tokens if isinstance(message, AssistantMessage) else 0


def estimate(system_prompt: str, summary: str, messages: Sequence[AnyMessage]) -> int:
    """Estimated input tokens of a request carrying this system prompt, summary and messages.

    One pass over the messages: the heuristic total and, for the calibration, the heuristic
    of the prefix before the latest usage report.
    """
    fixed = heuristic_text_tokens(system_prompt) + heuristic_text_tokens(summary)
    total = 0
    reported = 0
    prefix = 0  # heuristic of the messages before the latest usage report
    for message in messages:
        if (r := _reported(message)) > 0:
            reported, prefix = r, total
        total += heuristic_tokens(message)
    ratio = _ratio(reported, fixed + prefix) if reported else 1.0
    return int((fixed + total) * ratio)


def suffix_estimates(system_prompt: str, summary: str, messages: Sequence[AnyMessage]) -> list[int]:
    """``estimate(system_prompt, summary, messages[i:])`` for every ``i`` in ``0 … len``, in
    one pass (prefix sums of the per-message heuristic), with the same values."""
    fixed = heuristic_text_tokens(system_prompt) + heuristic_text_tokens(summary)
    sums = [0] * (len(messages) + 1)  # sums[i]: heuristic of messages[:i]
    latest = -1  # index of the latest usage report
    for i, message in enumerate(messages):
        sums[i + 1] = sums[i] + heuristic_tokens(message)
        if _reported(message) > 0:
            latest = i
    reported = _reported(messages[latest]) if latest >= 0 else 0
    total = sums[-1]
    out: list[int] = []
    for i in range(len(messages) + 1):
        # messages[i:] holds the latest report iff i <= latest; else it is uncalibrated.
        ratio = _ratio(reported, fixed + sums[latest] - sums[i]) if i <= latest else 1.0
        out.append(int((fixed + total - sums[i]) * ratio))
    return out


# --- running estimates ---------------------------------------------------------------------


class TokenTally(_Value):
    """What :func:`estimate` needs of a context's messages, kept as a running total.

    ``messages``: the heuristic of all messages; ``since_report``: the heuristic of the
    messages from the latest usage report (the latest assistant message with
    ``usage.input_tokens``) to the end, ``None`` when no message carries one; ``reported``: that
    report's input tokens. :func:`tally_of` counts a context from scratch; :meth:`extend`,
    :meth:`drop_prefix` and :func:`advance` keep a tally current in O(what changed), and
    :func:`estimate_with` gives exactly ``estimate(system_prompt, summary, messages)``.

    For the service: store the tally with the conversation, pass it to the run
    (``Input.tokens``) and store ``advance(tally, len(base.messages), result)`` with the
    result's context; recount with :func:`tally_of` whenever the context is replaced (PUT).
    """

    messages: int = 0
    since_report: int | None = None
    reported: int = 0

    def extend(self, messages: Iterable[AnyMessage]) -> TokenTally:
        """The tally after appending ``messages``."""
        total, since, reported = self.messages, self.since_report, self.reported
        for message in messages:
            tokens = heuristic_tokens(message)
            total += tokens
            if (r := _reported(message)) > 0:
                since, reported = tokens, r
            elif since is not None:
                since += tokens
        return TokenTally(messages=total, since_report=since, reported=reported)

    def drop_prefix(self, folded: Iterable[AnyMessage]) -> TokenTally:
        """The tally after the leading messages ``folded`` left the context (a compaction)."""
        dropped = sum(heuristic_tokens(m) for m in folded)
        total = self.messages - dropped
        if self.since_report is None or dropped > self.messages - self.since_report:
            # Every message weighs at least MESSAGE_OVERHEAD, so dropping more than what
            # precedes the report means the report itself was folded: nothing calibrates.
            return TokenTally(messages=total)
        return self.model_copy(update={"messages": total})


def estimate_message(message: AnyMessage) -> int:
    """The uncalibrated estimate of one message (what a running total adds up)."""
    return heuristic_tokens(message)


def tally_of(messages: Sequence[AnyMessage]) -> TokenTally:
    """The tally of a whole context, counted from scratch."""
    return TokenTally().extend(messages)


def estimate_with(tally: TokenTally, system_prompt: str, summary: str) -> int:
    """``estimate(system_prompt, summary, messages)`` from the messages' tally, in O(1)."""
    fixed = heuristic_text_tokens(system_prompt) + heuristic_text_tokens(summary)
    ratio = 1.0
    if tally.since_report is not None:
        ratio = _ratio(tally.reported, fixed + tally.messages - tally.since_report)
    return int((fixed + tally.messages) * ratio)


def advance(tally: TokenTally, base_len: int, result: RunChanges) -> TokenTally:
    """The tally of ``result.context.messages`` from the tally of the run's base context.

    Uses the agent's contract ``result.context.messages == (base + appended)[F:]`` where ``F``
    is what the compactions folded, in that order: so the appended messages are the tail of
    ``folded + result.context.messages`` past ``base_len``. Costs O(appended + folded).
    """
    folded, appended = changed_messages(base_len, result)
    return tally.extend(appended).drop_prefix(folded)


def changed_messages(
    base_len: int, result: RunChanges
) -> tuple[list[AnyMessage], list[AnyMessage]]:
    """What a run changed of its base context of ``base_len`` messages: the messages its
    compactions folded (in order) and the messages it appended (in order; an appended message
    a later compaction folded is in both). O(appended + folded), by the agent's contract
    ``result.context.messages == (base + appended)[F:]``."""
    folded = [m for c in result.compactions for m in c.folded]
    kept = result.context.messages
    appended_count = len(folded) + len(kept) - base_len
    if appended_count <= len(kept):
        appended: list[AnyMessage] = list(kept[len(kept) - appended_count :])
    else:
        appended = [*folded[len(folded) - (appended_count - len(kept)) :], *kept]
    return folded, appended
