"""What a run takes and gives back: Input, Result and the compaction record (SPEC §2).

Only ``Result.context`` is continuation state. ``new_messages``, ``final`` and ``compactions``
are run records, kept for audit and display.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .messages import AssistantMessage, AttemptError, Context, Message, Usage, UserMessage, _Value
from .tokens import TokenTally

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
    # Where it happened (the agent always sets it): the number of the run's ``new_messages``
    # recorded before the compaction, i.e. right before ``new_messages[at]`` (after the last one
    # when ``at`` equals their number). Threshold: at the first prompt (after any results that
    # closed an open batch); overflow: right after the attempt that overflowed; manual: after
    # the closing results. Compactions sharing an ``at`` happened in their listed order. None
    # when not known (a record read back from storage). Not on the wire yet (``exclude``): the
    # run record store has no column for it, so a run's answer and its stored record would
    # disagree. See docs/decisions.md.
    at: int | None = Field(default=None, ge=0, exclude=True)


class Input(_Value):
    """What a run starts from. ``tokens``, when given, is the running tally of
    ``context.messages`` (:func:`app.agent.tokens.tally_of`, kept with
    :func:`app.agent.tokens.advance`); the agent then never recounts the history to decide
    whether to compact. Without it the agent counts the context once."""

    context: Context
    prompts: tuple[UserMessage, ...] = ()
    tokens: TokenTally | None = None


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
