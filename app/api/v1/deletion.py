"""Deleting a conversation item (``DELETE /v1/conversations/{id}/items/{item_id}``): the
context without it, worked out from the transcript's messages. Pure functions, no I/O.

An item is a transcript message's (:mod:`app.api.v1.items`); the context holds the live
messages. The item's message is found in the context by content: the occurrence that has as many
equal messages after it in the context as the transcript has after it (compactions fold the
oldest messages, so counting from the end holds through them). A message no longer there (folded
into the summary, or the context replaced since) cannot be deleted: 400 naming the item.

What goes: a user ``message`` item, a ``function_call_output`` or an assistant message's single
item takes its whole message; a ``function_call`` takes its call out of its assistant message
(the whole message when nothing else is left of it). A call and its result go together: deleting
either deletes both. Any other item of a multi-item assistant message (its text or reasoning
beside other items) is refused (400), and so are the items of calls to MCP servers.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from app.agent.messages import AnyMessage, AssistantMessage, Context, ToolCallBlock
from app.service.responses import StoredMessage

from .errors import OpenAIError, bad_request
from .items import items_of

_DELETABLE = ("message", "function_call", "function_call_output", "reasoning")
_PAIRED = ("function_call", "function_call_output")


@dataclass(frozen=True)
class Plan:
    """The context without the item, and the ids of the items deleted with it."""

    context: Context
    item_ids: tuple[str, ...]


def _refused(item_id: str, why: str) -> OpenAIError:
    return bad_request(f"Item with id '{item_id}' cannot be deleted: {why}.", "item_id")


def _ids(stored: StoredMessage) -> list[str]:
    return [item["id"] for item in items_of(stored.message, stored.run_id, stored.index)]


def deletion_plan(
    item_id: str,
    item: dict[str, Any],
    stored: Sequence[StoredMessage],
    deleted: Collection[str],
    context: Context,
) -> Plan:
    """What deleting ``item`` (of id ``item_id``, one of ``stored``'s messages' items, not in
    ``deleted``) writes: a 400 when it cannot go (see the module)."""
    kind = item.get("type")
    if kind not in _DELETABLE:
        raise _refused(item_id, f"{kind} items cannot be deleted (only {', '.join(_DELETABLE)})")
    # the items deleted now, by the message holding them
    taken: dict[int, list[dict[str, Any]]] = {}
    for s in stored:
        for candidate in items_of(s.message, s.run_id, s.index):
            same = candidate["id"] == item_id
            partner = (
                kind in _PAIRED
                and candidate["type"] in _PAIRED
                and candidate.get("call_id") == item.get("call_id")
                and candidate["id"] not in deleted
            )
            if same or partner:
                taken.setdefault(s.seq, []).append(candidate)
    if not taken:  # the caller found it: only a racing change gets here
        raise _refused(item_id, "it is no longer in the conversation")

    def gone(s: StoredMessage) -> bool:
        return all(i in deleted for i in _ids(s))

    live = [s for s in stored if not gone(s)]
    messages: list[AnyMessage | None] = list(context.messages)
    at: dict[int, int] = {}  # transcript seq -> index in the context
    for s in live:
        if s.seq not in taken:
            continue
        later = sum(1 for o in live if o.seq > s.seq and o.message == s.message)
        places = [i for i, m in enumerate(context.messages) if m == s.message]
        if later >= len(places):
            raise _refused(
                item_id,
                "its message is no longer in the conversation's context (folded into the "
                "summary by a compaction, or the context was replaced since)",
            )
        at[s.seq] = places[len(places) - 1 - later]
    for seq, items in taken.items():
        holder = next(s for s in live if s.seq == seq)
        left = [i for i in _ids(holder) if i not in deleted and i not in {x["id"] for x in items}]
        index = at[seq]
        if not left:
            messages[index] = None
            continue
        message = holder.message
        if not isinstance(message, AssistantMessage) or any(
            x["type"] != "function_call" for x in items
        ):
            raise _refused(
                item_id,
                "it is one of several items of an assistant message: only a function_call "
                "can be deleted from such a message",
            )
        calls = {x["call_id"] for x in items}
        content = tuple(
            b for b in message.content if not (isinstance(b, ToolCallBlock) and b.id in calls)
        )
        messages[index] = message.model_copy(update={"content": content})
    kept = tuple(m for m in messages if m is not None)
    ids = tuple(x["id"] for items in taken.values() for x in items)
    new = Context(system_prompt=context.system_prompt, summary=context.summary, messages=kept)
    return Plan(new, ids)


__all__ = ["Plan", "deletion_plan"]
