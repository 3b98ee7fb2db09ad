"""What a run takes and gives back: Input, Result and the compaction record (SPEC §2).

Only ``Result.context`` is continuation state. ``new_messages``, ``final`` and ``compactions``
are run records, kept for audit and display.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .messages import AssistantMessage, AttemptError, Context, Message, Usage, UserMessage, _Value

RunStatus = Literal["completed", "failed", "cancelled"]
CompactionReason = Literal["threshold", "overflow", "manual"]


class Compaction(_Value):
    """One compaction: why, what it folded, and the summary it produced."""

    reason: CompactionReason
    folded: tuple[Message, ...]
    previous_summary: str
    summary: str
    tokens_before: int = Field(ge=0)
    tokens_after: int = Field(ge=0)
    usage: Usage = Usage()


class Input(_Value):
    context: Context
    prompts: tuple[UserMessage, ...] = ()


class Result(_Value):
    """The outcome of one run. A failed or cancelled run returns one too (SPEC §3)."""

    status: RunStatus
    context: Context
    new_messages: tuple[Message, ...] = ()
    final: AssistantMessage | None = None
    compactions: tuple[Compaction, ...] = ()
    usage: Usage = Usage()
    error: AttemptError | None = None
    admitted: bool = False
