"""Server-executed tool calls as OpenAI's MCP items (docs/openai.md, "MCP tools").

A call that records the server that runs it (``server_label``: an MCP server's label, or
``carryover`` for the agent's own tools) is not a ``function_call`` for the client to answer:

- out, it is one ``mcp_call`` item at the call's place (``server_label``, ``name``,
  ``arguments``, and ``output`` / ``error`` from its result, which has no item of its own); a
  call still awaiting approval is an ``mcp_approval_request`` item instead; the result of a
  call approved by a later response is that response's ``mcp_call`` item (with its
  ``approval_request_id``);
- in, an ``mcp_call`` item is the call and its result, an ``mcp_approval_request`` a call
  awaiting approval, an ``mcp_approval_response`` the decision on one (an approval of the
  run), and an ``mcp_list_tools`` item is taken as said and changes nothing.

What a rendering knows of the calls' results and approvals is an :class:`ItemView`, built from
the messages at hand (a run's, a page of the conversation's, with its neighbours).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from app.agent.messages import (
    AnyMessage,
    AssistantMessage,
    TextBlock,
    ToolCallBlock,
    ToolResultMessage,
)

#: item id prefixes: a call's ``mcp_call`` and its ``mcp_approval_request``
CALL_PREFIX = "mcp"
APPROVAL_PREFIX = "mcpr"


@dataclass(frozen=True)
class Approved:
    """A call answered by an approval of a later response: its approval request and call."""

    approval_request_id: str | None
    call: ToolCallBlock


@dataclass(frozen=True)
class ItemView:
    """What rendering knows besides one message: each known result by call id, the calls
    still awaiting approval, the server-executed calls whose results render in their call's
    item, and the calls a response's approvals answered."""

    results: Mapping[str, ToolResultMessage] = field(default_factory=dict)
    pending: Collection[str] = frozenset()
    served: Collection[str] = frozenset()
    approved: Mapping[str, Approved] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        messages: Iterable[AnyMessage],
        pending: Collection[str] = frozenset(),
        approved: Mapping[str, Approved] | None = None,
    ) -> ItemView:
        results: dict[str, ToolResultMessage] = {}
        served: set[str] = set()
        for message in messages:
            if isinstance(message, ToolResultMessage):
                results[message.tool_call_id] = message
            elif isinstance(message, AssistantMessage) and message.replayable:
                served.update(c.id for c in message.tool_calls if c.server_label is not None)
        return cls(results, frozenset(pending), frozenset(served), dict(approved or {}))


def _text(result: ToolResultMessage) -> str:
    return "".join(b.text for b in result.content if isinstance(b, TextBlock))


def call_item(
    call: ToolCallBlock,
    item_id: str,
    result: ToolResultMessage | None,
    approval_request_id: str | None = None,
) -> dict[str, Any]:
    """An ``mcp_call`` item: the call, and its result when known (``in_progress`` without)."""
    output = error = None
    status = "in_progress"
    if result is not None:
        if result.is_error:
            status = "failed"
            error = {
                "type": "mcp_tool_execution_error",
                "content": [{"type": "text", "text": _text(result)}],
            }
        else:
            status, output = "completed", _text(result)
    return {
        "type": "mcp_call",
        "id": item_id,
        "server_label": call.server_label or "",
        "name": call.name,
        "arguments": call.arguments,
        "approval_request_id": approval_request_id,
        "output": output,
        "error": error,
        "status": status,
    }


def approval_item(call: ToolCallBlock, item_id: str) -> dict[str, Any]:
    """An ``mcp_approval_request`` item: a call awaiting the application's decision."""
    return {
        "type": "mcp_approval_request",
        "id": item_id,
        "server_label": call.server_label or "",
        "name": call.name,
        "arguments": call.arguments,
    }


def result_of(item: Mapping[str, Any], call_id: str, name: str) -> ToolResultMessage:
    """The result an input ``mcp_call`` item carries (its output, or its error)."""
    error = item.get("error")
    if error:
        text = _error_text(error)
        return ToolResultMessage(
            tool_call_id=call_id, tool_name=name, content=(TextBlock(text=text),), is_error=True
        )
    output = item.get("output")
    text = output if isinstance(output, str) and output else "(no output)"
    return ToolResultMessage(tool_call_id=call_id, tool_name=name, content=(TextBlock(text=text),))


def _error_text(error: Any) -> str:
    if isinstance(error, str):
        return error or "error"
    if isinstance(error, Mapping):
        content = error.get("content")
        if isinstance(content, list):
            texts = [str(p.get("text", "")) for p in content if isinstance(p, Mapping)]
            if any(texts):
                return "".join(texts)
        if error.get("message"):
            return str(error["message"])
    return "error"


__all__ = [
    "APPROVAL_PREFIX",
    "CALL_PREFIX",
    "Approved",
    "ItemView",
    "approval_item",
    "call_item",
    "result_of",
]
