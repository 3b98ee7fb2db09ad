"""The replayability rules of contract §1: what a provider will accept as history.

- every ``tool_call`` is answered by exactly one ``tool_result`` before the next user or
  assistant message;
- no ``tool_result`` without its call (in the assistant message right before it);
- failed or aborted attempts are not part of a context;
- thinking blocks live inside the assistant message that produced them, in the order
  received (the types make any other place unrepresentable; the codec keeps the order).

Two checks (docs/tools.md, "Client tools and approvals"):

- **replayable** (:func:`validate_context`): what may be sent to a provider — every call
  answered. The agent checks it at the one place requests leave.
- **storable** (:func:`validate_storable`, or ``allow_open_batch=True``): what a run may return
  and a conversation may hold — replayable, except that the last assistant message may still
  have unanswered calls: its *pending* calls (client calls and approval calls). The next run
  answers them before any provider request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .messages import (
    AnyMessage,
    AssistantMessage,
    Context,
    ToolResultMessage,
)


@dataclass(frozen=True)
class ReplayError(ValueError):
    """The first message that breaks a replay rule, by its index in ``messages``."""

    index: int
    reason: str

    def __str__(self) -> str:
        return f"messages[{self.index}]: {self.reason}"


def open_batch(messages: Sequence[AnyMessage]) -> tuple[int, list[str]] | None:
    """The index of a trailing assistant message with unanswered calls, and their ids."""
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        if isinstance(message, ToolResultMessage):
            continue
        if isinstance(message, AssistantMessage) and message.tool_calls:
            answered = {
                m.tool_call_id for m in messages[i + 1 :] if isinstance(m, ToolResultMessage)
            }
            missing = [c.id for c in message.tool_calls if c.id not in answered]
            return (i, missing) if missing else None
        return None
    return None


def validate_messages(messages: Sequence[AnyMessage], *, allow_open_batch: bool = False) -> None:
    """Raise :class:`ReplayError` for the first message that breaks a replay rule."""
    pending: dict[str, str] = {}  # call id -> tool name, for the batch being answered
    batch_owner = -1
    for i, message in enumerate(messages):
        if isinstance(message, ToolResultMessage):
            if message.tool_call_id not in pending:
                owner = "" if batch_owner < 0 else f" of messages[{batch_owner}]"
                raise ReplayError(
                    i, f"tool_result {message.tool_call_id!r} answers no pending tool_call{owner}"
                )
            expected = pending.pop(message.tool_call_id)
            if message.tool_name != expected:
                raise ReplayError(
                    i,
                    f"tool_result {message.tool_call_id!r} names tool {message.tool_name!r}, "
                    f"but the call was to {expected!r}",
                )
            continue
        if pending:
            raise ReplayError(
                i,
                f"tool_call(s) {sorted(pending)} of messages[{batch_owner}] are not answered "
                f"before this {message.type} message",
            )
        if isinstance(message, AssistantMessage):
            _check_assistant(i, message)
            seen: set[str] = set()
            for call in message.tool_calls:
                if call.id in seen:
                    raise ReplayError(i, f"tool_call id {call.id!r} appears twice")
                seen.add(call.id)
                pending[call.id] = call.name
            batch_owner = i
    if pending and not (allow_open_batch and open_batch(messages) is not None):
        raise ReplayError(batch_owner, f"tool_call(s) {sorted(pending)} are never answered")


def _check_assistant(index: int, message: AssistantMessage) -> None:
    if not message.replayable:
        raise ReplayError(
            index,
            f"assistant attempt ended with stop_reason {message.stop_reason!r}; "
            "failed or aborted attempts are run records, not context",
        )


def validate_context(context: Context, *, allow_open_batch: bool = False) -> None:
    """A replayable context (every call answered), or a storable one with ``allow_open_batch``."""
    validate_messages(context.messages, allow_open_batch=allow_open_batch)


def validate_storable(context: Context) -> None:
    """A context a conversation may hold: replayable, or ending with pending calls."""
    validate_messages(context.messages, allow_open_batch=True)
