"""What a run changes, computed without I/O: the context rows to delete and insert, and the
transcript entries to append.

The agent's contract (contract §2, §3) is ``result.messages == (base.messages + appended)[F:]``
where ``F`` is the number of messages its compactions folded. So storing a result only ever
deletes a prefix and appends: :func:`plan_context_write` turns that into one range delete and the
inserts of the appended messages, and :func:`run_transcript` lists what the transcript records.

:func:`stored_pending` is what every write of a context keeps on the conversation row of its
pending calls (``conversations.pending_calls``), from the last batch the write already holds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, get_args

from app.agent.codec import dump_message, dumps_message, load_message, loads_message
from app.agent.messages import (
    AnyMessage,
    AssistantMessage,
    Context,
    ToolCallBlock,
    ToolResultMessage,
    UserMessage,
)
from app.agent.pending import PendingKind, open_calls
from app.agent.records import Compaction, Result

from .tables import Dumped

log = logging.getLogger(__name__)

T = TypeVar("T")

TranscriptKind = Literal[
    "prompt",
    "attempt",
    "tool_result",
    "compaction",
    "context_replaced",
    # client tools and approvals (docs/tools.md): a run that paused, the application's result
    # for a client call, its decision on an approval call
    "pause",
    "client_result",
    "approval",
    # a fork's first entry: the source id, its ETag and how many messages were copied
    "forked",
    # after a context_replaced entry: the /v1 items that replacement deleted (their ids)
    "item_deleted",
]
#: the kinds a transcript entry can have, as a set (a stored row of another kind is damaged)
TRANSCRIPT_KINDS: frozenset[str] = frozenset(get_args(TranscriptKind))


@dataclass(frozen=True)
class Answered:
    """How a run's input answered one pending call: a client result, or an approval
    decision (its ``approve`` and ``reason``)."""

    kind: Literal["client", "approval"]
    approve: bool | None = None
    reason: str = ""


@dataclass(frozen=True)
class ContextWrite:
    """How to turn the stored base context into a run's result context, in rows.

    The agent's contract is ``result.messages == (base.messages + appended)[F:]`` where ``F`` is
    the number of messages its compactions folded. Positions number that stream: base messages
    keep theirs, appended messages continue from ``next_position`` (an appended message that a
    later compaction folded in the same run keeps its number but is never written).
    """

    delete_before: int | None  # delete the rows at positions below this one
    inserts: tuple[tuple[int, AnyMessage], ...]  # (position, message) to insert
    next_position: int
    fold_ranges: tuple[tuple[int, int], ...]  # per compaction: positions [start, end) it folded
    rewritten: bool = False  # the result did not extend its base: every message is rewritten


def plan_context_write(
    base: Context, first_position: int, next_position: int, result: Result
) -> ContextWrite:
    """The rows to delete and insert to store ``result.context`` over ``base``, whose messages
    sit at positions ``first_position`` … ``next_position - 1``."""
    old = base.messages
    new = result.context.messages
    fold_ranges: list[tuple[int, int]] = []
    start = first_position
    for compaction in result.compactions:
        fold_ranges.append((start, start + len(compaction.folded)))
        start += len(compaction.folded)
    folded = start - first_position
    dropped = min(folded, len(old))  # base messages folded away
    kept = len(old) - dropped  # base messages still at the front of the result

    if _extends(new, old, kept, dropped):
        first_insert = next_position + (folded - dropped)
        inserts = tuple((first_insert + i, m) for i, m in enumerate(new[kept:]))
        return ContextWrite(
            delete_before=first_position + dropped if dropped else None,
            inserts=inserts,
            next_position=first_insert + len(inserts),
            fold_ranges=tuple(fold_ranges),
        )

    # The result does not extend the base as the agent promises. Storing result.context is
    # still the rule, so rewrite it whole (correct, just not incremental) and say so.
    log.warning(
        "run result does not extend its base context (%d kept messages differ); "
        "rewriting all %d messages",
        kept,
        len(new),
    )
    return ContextWrite(
        delete_before=next_position if old else None,
        inserts=tuple((next_position + i, m) for i, m in enumerate(new)),
        next_position=next_position + len(new),
        fold_ranges=tuple(fold_ranges),
        rewritten=True,
    )


def _extends(
    new: tuple[AnyMessage, ...], old: tuple[AnyMessage, ...], kept: int, dropped: int
) -> bool:
    """``new[:kept] == old[dropped:]``, in O(1) for the agent's own results: the messages a
    run keeps are the base's very objects (it appends and slices, never copies), so the first
    and the last kept one being the base's settles it. Anything else is compared in full
    (slicing and comparing a 20,000-message context costs ~0.4 ms of a run, every run)."""
    if kept == 0:
        return True
    if len(new) >= kept and new[0] is old[dropped] and new[kept - 1] is old[-1]:
        return True
    return new[:kept] == old[dropped:]


def last_batch_of(texts: Sequence[str]) -> Context:
    """A context holding only the last batch of stored messages (their JSON texts): the last
    one that is not a ``tool_result`` and the results after it. Its pending calls are those of
    the whole context; decoding it costs O(last batch), never the history."""
    return Context(messages=_last_batch(texts, loads_message))


def last_batch_of_bodies(bodies: Sequence[Any]) -> tuple[AnyMessage, ...]:
    """As :func:`last_batch_of`, from messages in codec form (decoded JSON values)."""
    return _last_batch(bodies, load_message)


def _last_batch(items: Sequence[T], load: Callable[[T], AnyMessage]) -> tuple[AnyMessage, ...]:
    tail: list[AnyMessage] = []
    for item in reversed(items):
        message = load(item)
        tail.append(message)
        if not isinstance(message, ToolResultMessage):
            break
    return tuple(reversed(tail))


StoredPending = list[dict[str, str]] | None
"""A ``conversations.pending_calls`` value (see :func:`stored_pending`)."""


def stored_pending(
    messages: Sequence[AnyMessage], kinds: Mapping[str, str] | None = None
) -> list[dict[str, str]] | None:
    """``conversations.pending_calls`` for a context whose messages end with ``messages`` (the
    whole context or its last batch alone): its unanswered calls, or None when it awaits
    nothing. O(last batch). Each is ``{"id", "name", "arguments"}``, with ``server_label`` when
    the call records one and ``kind`` (client or approval) when ``kinds`` (by call id: what
    the run that paused decided) has it; a context written without a run (PUT, import, a
    fork's prefix) stores no kind, and its calls' kind is read as the agent infers it."""
    out = []
    for call in open_calls(messages):
        entry = {"id": call.id, "name": call.name, "arguments": call.arguments}
        if call.server_label is not None:
            entry["server_label"] = call.server_label
        kind = (kinds or {}).get(call.id)
        if kind is not None:
            entry["kind"] = kind
        out.append(entry)
    return out or None


def pending_blocks(stored: Sequence[Mapping[str, str]] | None) -> tuple[ToolCallBlock, ...]:
    """The calls a ``conversations.pending_calls`` value holds."""
    return tuple(
        ToolCallBlock(
            id=c["id"], name=c["name"], arguments=c["arguments"], server_label=c.get("server_label")
        )
        for c in stored or ()
    )


def stored_kinds(stored: Sequence[Mapping[str, str]] | None) -> dict[str, PendingKind]:
    """The kinds a ``conversations.pending_calls`` value stores, by call id."""
    return {
        c["id"]: "approval" if c["kind"] == "approval" else "client"
        for c in stored or ()
        if c.get("kind") in ("client", "approval")
    }


@dataclass(frozen=True)
class TranscriptItem:
    kind: TranscriptKind
    failed: bool
    body: dict[str, Any] | Dumped  # Dumped: the body's JSON text, already dumped


def _message_item(message: AnyMessage) -> TranscriptItem:
    body = Dumped(dumps_message(message))  # the text its other records use (codec.py)
    if isinstance(message, UserMessage):
        return TranscriptItem("prompt", False, body)
    if isinstance(message, AssistantMessage):
        return TranscriptItem("attempt", not message.replayable, body)
    return TranscriptItem("tool_result", False, body)


def _compaction_item(compaction: Compaction, fold_range: tuple[int, int]) -> TranscriptItem:
    return TranscriptItem(
        "compaction",
        False,
        {
            "reason": compaction.reason,
            "previous_summary": compaction.previous_summary,
            "summary": compaction.summary,
            "folded": {
                "from_position": fold_range[0],
                "to_position": fold_range[1],
                "count": len(compaction.folded),
            },
            "tokens_before": compaction.tokens_before,
            "tokens_after": compaction.tokens_after,
            "usage": compaction.usage.model_dump(mode="json"),
        },
    )


def compaction_slots(result: Result) -> list[int]:
    """For each compaction, the index in ``result.new_messages`` it happened before.

    The agent records it (``Compaction.at``). A compaction that does not know it (a hand-built
    Result) is placed at the end of the run, and never before an earlier compaction.
    """
    end = len(result.new_messages)
    slots: list[int] = []
    floor = 0
    for compaction in result.compactions:
        slot = end if compaction.at is None else min(max(compaction.at, floor), end)
        slots.append(slot)
        floor = slot
    return slots


def _answer_items(message: AnyMessage, answer: Answered) -> list[TranscriptItem]:
    """A result answering a pending call: ``client_result``, or the ``approval`` decision
    followed by the result it led to (the approved call's, or the denial)."""
    assert isinstance(message, ToolResultMessage)
    if answer.kind == "client":
        return [TranscriptItem("client_result", False, dump_message(message))]
    decision = {
        "tool_call_id": message.tool_call_id,
        "tool_name": message.tool_name,
        "approve": bool(answer.approve),
        "reason": answer.reason,
    }
    return [TranscriptItem("approval", False, decision), _message_item(message)]


def run_transcript(
    result: Result,
    base_len: int,
    plan: ContextWrite,
    answered: Mapping[str, Answered] | None = None,
) -> list[TranscriptItem]:
    """The transcript entries of a run, in the order things happened.

    ``answered`` names the pending calls the run's input answered (by call id): their results
    are recorded as ``client_result`` / ``approval`` entries. A run that paused ends with a
    ``pause`` entry holding its ``required_action``.

    ``base_len`` is no longer needed (compactions say where they happened); it stays until the
    caller in :mod:`app.store.runs` drops it.
    """
    slots = compaction_slots(result)
    # A compaction at slot i comes before new_messages[i]; compactions keep their own order.
    keyed = [
        ((slot, 0, k), [_compaction_item(result.compactions[k], plan.fold_ranges[k])])
        for k, slot in enumerate(slots)
    ]
    todo = dict(answered or {})
    for i, m in enumerate(result.new_messages):
        answer = todo.pop(m.tool_call_id, None) if isinstance(m, ToolResultMessage) else None
        items = [_message_item(m)] if answer is None else _answer_items(m, answer)
        keyed.append(((i, 1, 0), items))
    entries = [e for _, items in sorted(keyed, key=lambda pair: pair[0]) for e in items]
    if result.status == "requires_action" and result.required_action is not None:
        entries.append(
            TranscriptItem("pause", False, result.required_action.model_dump(mode="json"))
        )
    return entries
