"""OpenAI objects rendered from Carryover's records: a run as a ``response``, a conversation
as a ``conversation``, usage, the list envelope."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from app.agent.messages import AnyMessage, AssistantMessage, ToolResultMessage, UserMessage
from app.agent.structured import parsed_output, violation
from app.service.conversations import ConversationInfo

from ..deps import RUN_ID_PATTERN
from .items import items_of
from .mcp_items import Approved, ItemView

RESPONSE_PREFIX = "resp_"
_RUN_ID = re.compile(RUN_ID_PATTERN)

#: a run's status → the response's
_STATUS = {
    "completed": "completed",
    "requires_action": "completed",  # it completed with function_call items for the client
    "failed": "failed",
    "conflicted": "failed",
    "interrupted": "failed",
    "cancelled": "cancelled",
    "running": "in_progress",
    "queued": "queued",
}


def response_id(run_id: str) -> str:
    return RESPONSE_PREFIX + run_id


def run_id_of(value: str) -> str | None:
    """The run id a response id names (None: not a response id, or one no run can have: its
    run id outside the native grammar, e.g. with a NUL a PostgreSQL parameter cannot hold)."""
    if not value.startswith(RESPONSE_PREFIX):
        return None
    run_id = value[len(RESPONSE_PREFIX) :]
    return run_id if _RUN_ID.fullmatch(run_id) else None


def timestamp(value: datetime | None) -> int:
    return int(value.timestamp()) if value is not None else 0


def usage_of(usage: Mapping[str, Any] | None) -> dict[str, Any]:
    usage = usage or {}
    read = int(usage.get("input_tokens", 0))
    cached = int(usage.get("cache_read_tokens", 0))
    written = int(usage.get("output_tokens", 0))
    return {
        "input_tokens": read,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": written,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": read + written,
    }


@dataclass
class Split:
    """A run's new messages as a response's input items and output items."""

    input: list[dict[str, Any]] = field(default_factory=list)
    output: list[dict[str, Any]] = field(default_factory=list)


def split(
    messages: Sequence[AnyMessage],
    run_id: str,
    pending: Collection[str] = frozenset(),
    approved: Mapping[str, Approved] | None = None,
) -> Split:
    """Input: the prompts and the results the client sent; output: the model's replayable
    attempts and the results of the calls it made in this run (server tools; a call executed
    by a server is one ``mcp_call`` item with its result, or an ``mcp_approval_request`` while
    it is ``pending``), and the results of the calls its approvals answered (``approved``).
    Failed attempts are run records, not items."""
    found = Split()
    made: set[str] = set()
    view = ItemView.of(messages, pending, approved)
    for index, message in enumerate(messages):
        if isinstance(message, UserMessage):
            found.input.extend(items_of(message, run_id, index, view))
        elif isinstance(message, AssistantMessage):
            if message.replayable:
                made.update(c.id for c in message.tool_calls)
                found.output.extend(items_of(message, run_id, index, view))
        elif isinstance(message, ToolResultMessage):
            answered = message.tool_call_id in made or message.tool_call_id in view.approved
            target = found.output if answered else found.input
            target.extend(items_of(message, run_id, index, view))
    return found


def output_text(output: Sequence[Mapping[str, Any]]) -> str:
    return "".join(
        part.get("text", "")
        for item in output
        if item.get("type") == "message"
        for part in item.get("content", ())
        if part.get("type") == "output_text"
    )


#: a failed response's ``error.code`` (one of OpenAI's) by the run error's code, then kind;
#: anything else is ``server_error``
_ERROR_CODES = {
    "quota_exceeded": "rate_limit_exceeded",  # a background run refused at its turn
    "context_too_large": "invalid_prompt",  # the context would pass the stored limits
    "validation_error": "invalid_prompt",  # a queued run's request, checked at its turn
    "unexpected_tool_answer": "invalid_prompt",
    "tool_results_required": "invalid_prompt",
    "overflow": "invalid_prompt",  # the context does not fit the model's window
}


def response_error_code(error: Mapping[str, Any] | None) -> str:
    """The OpenAI ``error.code`` of a response whose run failed with ``error`` (an
    ``AttemptError``'s fields): the client's input for what it can change, else the service's."""
    error = error or {}
    for key in (error.get("code"), error.get("kind")):
        if isinstance(key, str) and key in _ERROR_CODES:
            return _ERROR_CODES[key]
    return "server_error"


def response_object(
    *,
    run_id: str,
    status: str,
    created_at: int,
    model: str,
    output: list[dict[str, Any]],
    usage: Mapping[str, Any] | None,
    error: Mapping[str, Any] | None = None,
    conversation_id: str | None = None,
    store: bool = True,
    background: bool = False,
    instructions: str | None = None,
    tools: Sequence[Mapping[str, Any]] = (),
    metadata: Mapping[str, str] | None = None,
    previous_response_id: str | None = None,
    settings: Mapping[str, Any] | None = None,
    output_schema: dict[str, Any] | None = None,
    final: AssistantMessage | None = None,
) -> dict[str, Any]:
    """``error``: the run's error as its record keeps it (an ``AttemptError``'s fields: its
    ``message`` is the failed response's). ``settings``: what the request set (``text``,
    ``temperature``, ``max_output_tokens``);
    ``output_schema`` and ``final``: a structured response's schema and last answer, given as
    ``output_parsed`` once it matched (a message that does not match is left out: an attempt
    corrected on retry, or the last answer of a response that failed)."""
    state = _STATUS.get(status, status)
    settings = settings or {}
    parsed = None
    if output_schema is not None:  # nothing that did not match is ever presented
        if status == "completed":
            parsed = parsed_output(output_schema, final)
        output = [
            item
            for item in output
            if item.get("type") != "message"
            or (status == "completed" and violation(output_schema, output_text([item])) is None)
        ]
    failure = None
    if state == "failed":
        detail = (error or {}).get("message") or "the run failed"
        failure = {"code": response_error_code(error), "message": str(detail)}
    return {
        "id": response_id(run_id),
        "object": "response",
        "created_at": created_at,
        "status": state,
        "background": background,
        "error": failure,
        "incomplete_details": None,
        "instructions": instructions,
        "max_output_tokens": settings.get("max_output_tokens"),
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": previous_response_id,
        "reasoning": {"effort": None, "summary": None},
        "store": store,
        "temperature": settings.get("temperature"),
        "text": settings.get("text") or {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": list(tools),
        "top_p": None,
        "truncation": "disabled",
        "usage": usage_of(usage) if state not in ("queued", "in_progress") else None,
        "metadata": dict(metadata or {}),
        "conversation": {"id": conversation_id} if conversation_id else None,
        **({"output_parsed": parsed} if output_schema is not None else {}),
    }


def conversation_object(info: ConversationInfo) -> dict[str, Any]:
    return {
        "id": info.conversation.id,
        "object": "conversation",
        "created_at": timestamp(info.conversation.created_at),
        "metadata": dict(info.metadata),
    }


def list_object(
    data: list[dict[str, Any]], *, has_more: bool, first_last: bool = True
) -> dict[str, Any]:
    body: dict[str, Any] = {"object": "list", "data": data}
    if first_last:
        body["first_id"] = data[0]["id"] if data else None
        body["last_id"] = data[-1]["id"] if data else None
    body["has_more"] = has_more
    return body


__all__ = [
    "Split",
    "conversation_object",
    "list_object",
    "output_text",
    "response_id",
    "response_object",
    "run_id_of",
    "split",
    "usage_of",
]
