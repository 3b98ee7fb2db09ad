"""The size of a context as it is stored and sent: the bytes of its JSON.

A context is stored as compact JSON texts, one per message (``dumps_message``), and answered
by GET context as ``{"system_prompt":…,"summary":…,"messages":[…]}`` built from those texts
as they are: its byte size is the body a client PUTs back. :class:`ContextSize` keeps that size
as a running total, as :class:`~app.agent.tokens.TokenTally` keeps the token estimate — counted
once (:func:`size_of`), then kept current in O(what changed) (:meth:`ContextSize.extend`,
:meth:`ContextSize.drop_prefix`, :func:`advance_size`; :func:`result_size` does either) — so
nothing ever serializes a whole context to know how large it is.

:class:`SizeBounds` are the bounds a stored context must stay within (the service's
``max_context_messages`` and ``max_body_bytes``, what a PUT of the context accepts). Given
them (``Input.bounds``), the agent compacts a context that would pass ``compact_at`` of
either bound, and fails a run whose context would pass a bound (``context_too_large``) before
it sends the provider a request its context could not be stored with.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from pydantic import Field

from .codec import compact_json, dumps_message
from .messages import AnyMessage, AttemptError, _Value
from .tokens import RunChanges, changed_messages

#: ``AttemptError.code`` of a run whose context would pass a bound
CONTEXT_TOO_LARGE = "context_too_large"

_OPEN = ',"messages":['  # what follows the head's last field, before the first message
_CLOSE = "]}"


def text_bytes(text: str) -> int:
    """UTF-8 bytes of ``text``."""
    return len(text.encode("utf-8", "surrogatepass"))


def message_bytes(message: AnyMessage) -> int:
    """The bytes of one message as stored (its compact JSON text)."""
    return text_bytes(dumps_message(message))


def frame_bytes(system_prompt: str, summary: str) -> int:
    """The bytes of a context's JSON around its messages (with no message at all)."""
    head = compact_json({"system_prompt": system_prompt, "summary": summary})
    return text_bytes(head) - 1 + len(_OPEN) + len(_CLOSE)


class ContextSize(_Value):
    """A context's JSON size, kept as a running total.

    ``frame``: the bytes around the messages (system prompt, summary, punctuation);
    ``messages``: the bytes of the message texts, summed; ``count``: how many there are.
    :attr:`bytes` is the whole: what GET context answers, byte for byte.
    """

    frame: int = Field(ge=0)
    messages: int = Field(default=0, ge=0)
    count: int = Field(default=0, ge=0)

    @property
    def bytes(self) -> int:
        return self.frame + self.messages + max(self.count - 1, 0)  # the commas between

    @classmethod
    def of_total(cls, total: int, count: int, system_prompt: str, summary: str) -> ContextSize:
        """The size of a context from its stored total (``conversations.context_bytes``)."""
        frame = frame_bytes(system_prompt, summary)
        return cls(frame=frame, messages=max(0, total - frame - max(count - 1, 0)), count=count)

    def extend(self, messages: Iterable[AnyMessage]) -> ContextSize:
        """The size after appending ``messages``."""
        added = [message_bytes(m) for m in messages]
        if not added:
            return self
        return self.model_copy(
            update={"messages": self.messages + sum(added), "count": self.count + len(added)}
        )

    def drop_prefix(self, folded: Sequence[AnyMessage]) -> ContextSize:
        """The size after the leading messages ``folded`` left the context (a compaction)."""
        if not folded:
            return self
        dropped = sum(message_bytes(m) for m in folded)
        return self.model_copy(
            update={
                "messages": max(0, self.messages - dropped),
                "count": max(0, self.count - len(folded)),
            }
        )

    def with_texts(self, system_prompt: str, summary: str) -> ContextSize:
        """The size with this system prompt and summary."""
        return self.model_copy(update={"frame": frame_bytes(system_prompt, summary)})


def size_of(system_prompt: str, summary: str, messages: Sequence[AnyMessage]) -> ContextSize:
    """The size of a context, counted from scratch (one dump of every message)."""
    return ContextSize(frame=frame_bytes(system_prompt, summary)).extend(messages)


def advance_size(size: ContextSize, base_len: int, result: RunChanges) -> ContextSize:
    """The size of ``result.context`` from the size of the run's base context (of
    ``base_len`` messages): O(appended + folded), as :func:`~app.agent.tokens.advance`."""
    folded, appended = changed_messages(base_len, result)
    after = size.extend(appended).drop_prefix(folded)
    if result.compactions:  # only a compaction changes the summary (a run never the prompt)
        after = after.with_texts(result.context.system_prompt, result.context.summary)
    return after


def result_size(base_size: ContextSize | None, base_len: int, result: RunChanges) -> ContextSize:
    """The size of ``result.context``: advanced from the size of the run's base context (of
    ``base_len`` messages) in O(what the run changed), counted when that size is unknown
    (``None``)."""
    if base_size is None:
        ctx = result.context
        return size_of(ctx.system_prompt, ctx.summary, ctx.messages)
    return advance_size(base_size, base_len, result)


class SizeBounds(_Value):
    """The bounds a stored context stays within (a PUT of it must be accepted).

    ``compact_at``: the share of either bound past which a run compacts first (0: never
    because of its size); a compaction for size keeps at most half of that share.
    """

    max_messages: int = Field(ge=1)
    max_bytes: int = Field(ge=1)
    compact_at: float = Field(default=0.9, ge=0, le=1)

    def passed(self, size: ContextSize) -> tuple[str, int, int] | None:
        """The bound ``size`` passes, as ``(setting, maximum, actual)``, or ``None``."""
        if size.count > self.max_messages:
            return ("max_context_messages", self.max_messages, size.count)
        if size.bytes > self.max_bytes:
            return ("max_body_bytes", self.max_bytes, size.bytes)
        return None

    def near(self, size: ContextSize) -> bool:
        """Past ``compact_at`` of a bound: time to compact."""
        return self.compact_at > 0 and (
            size.count > self.compact_at * self.max_messages
            or size.bytes > self.compact_at * self.max_bytes
        )

    def fold_needed(self, messages: Sequence[AnyMessage], size: ContextSize) -> int:
        """How many leading ``messages`` (of a context of ``size``) a compaction must fold
        for what stays to be within half of ``compact_at`` of both bounds (0: none; the
        frame is taken as it is now, the new summary being unknown). O(what it folds)."""
        if self.compact_at <= 0:
            return 0
        keep = self.compact_at / 2
        keep_messages = math.floor(keep * self.max_messages)
        keep_bytes = math.floor(keep * self.max_bytes)
        n = len(messages)
        i, prefix = 0, 0
        while i < n:
            rest = size.frame + size.messages - prefix + max(n - i - 1, 0)
            if n - i <= keep_messages and rest <= keep_bytes:
                break
            prefix += message_bytes(messages[i])
            i += 1
        return i


#: what a client can do about a context that would pass a bound (the end of every such error)
REMEDY = "compact the conversation (POST …/compact) or PUT a shorter context"


def passed_reason(passed: tuple[str, int, int], what: str = "the run's context") -> str:
    """Why ``what`` may not be stored: the bound :meth:`SizeBounds.passed` names."""
    setting, maximum, actual = passed
    amount = f"{actual} messages" if setting == "max_context_messages" else f"{actual} bytes"
    return f"{what} would hold {amount}, more than {setting} ({maximum})"


def too_large(reason: str) -> AttemptError:
    """The error of a run stopped (or not stored) for ``reason``: it names the bound."""
    return AttemptError(
        kind="fatal",
        code=CONTEXT_TOO_LARGE,
        message=f"{reason}: nothing past the bound was stored; {REMEDY}",
    )


__all__ = [
    "CONTEXT_TOO_LARGE",
    "REMEDY",
    "ContextSize",
    "SizeBounds",
    "advance_size",
    "frame_bytes",
    "message_bytes",
    "passed_reason",
    "result_size",
    "size_of",
    "text_bytes",
    "too_large",
]
