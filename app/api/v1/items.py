"""Items ↔ messages: OpenAI's conversation items and Carryover's messages (docs/openai.md has
the table). Pure functions, no I/O.

- Out (:func:`items_of`): a user message is one ``message`` item (``input_text``,
  ``input_image``); an assistant message is a ``reasoning`` item per thinking block, one
  ``message`` item per run of text blocks (``output_text``) and a ``function_call`` item per
  tool call, in block order; a tool result is a ``function_call_output`` item.
- In (:func:`messages_of`): the reverse; consecutive assistant-side items (reasoning, assistant
  messages, function calls) collapse into one assistant message.

An item's id is its message's identity: the run that added the message, the message's index in
that run's ``new_messages`` and the item's index within the message
(``msg_<run>_<index>_<k>``), so it is the same on every read, through compactions and both
surfaces, without storing anything more.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.agent.messages import (
    AnyMessage,
    AssistantMessage,
    Base64Source,
    ImageBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
    ToolResultMessage,
    UrlSource,
    UserMessage,
)

from .errors import bad_request
from .mcp_items import (
    APPROVAL_PREFIX,
    CALL_PREFIX,
    ItemView,
    approval_item,
    call_item,
    result_of,
)

_NO_VIEW = ItemView()

_PREFIXES = {"message": "msg", "reasoning": "rs", "function_call": "fc"}
_OUTPUT_PREFIX = "fco"
_ID = re.compile(r"^(msg|rs|fc|fco|mcp|mcpr)_([0-9a-f]{32}|[A-Za-z0-9.:-]+)_([0-9]+)_([0-9]+)$")
_DATA_URL = re.compile(r"^data:(.+?);base64,(.*)$", re.DOTALL)


@dataclass(frozen=True)
class ItemKey:
    """Where an item comes from: the run, the message's index in it, the item's within it."""

    run_id: str
    index: int
    k: int


def item_id(prefix: str, run_id: str, index: int, k: int) -> str:
    try:
        run = uuid.UUID(run_id).hex
    except ValueError:
        run = run_id.replace("_", "-")
    return f"{prefix}_{run}_{index}_{k}"


def parse_item_id(value: str) -> ItemKey | None:
    """The key of an id this surface issued (None for anything else)."""
    found = _ID.match(value)
    if found is None:
        return None
    run = found.group(2)
    if re.fullmatch(r"[0-9a-f]{32}", run):
        run = str(uuid.UUID(run))
    return ItemKey(run, int(found.group(3)), int(found.group(4)))


# --- out: messages -> items -------------------------------------------------------------------


def _image_url(block: ImageBlock) -> str:
    source = block.source
    if isinstance(source, UrlSource):
        return source.url
    return f"data:{source.media_type};base64,{source.data}"


def _envelope(block: ThinkingBlock | RedactedThinkingBlock) -> str | None:
    """``encrypted_content``: what the provider needs back, opaque to the client."""
    if isinstance(block, RedactedThinkingBlock):
        value: dict[str, str] = {"redacted": block.data}
    elif block.signature:
        value = {"signature": block.signature}
    else:
        return None
    return base64.b64encode(json.dumps(value, separators=(",", ":")).encode()).decode()


def _user_content(message: UserMessage | ToolResultMessage) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for block in message.content:
        if isinstance(block, TextBlock):
            parts.append({"type": "input_text", "text": block.text})
        else:
            parts.append({"type": "input_image", "image_url": _image_url(block), "detail": "auto"})
    return parts


def items_of(
    message: AnyMessage, run_id: str, index: int, view: ItemView | None = None
) -> list[dict[str, Any]]:
    """The items of one stored message: at least one, but for the result of a call executed by
    a server, which is part of its call's ``mcp_call`` item (:mod:`app.api.v1.mcp_items`;
    ``view`` says what is known of the other messages)."""
    view = view or _NO_VIEW
    if isinstance(message, ToolResultMessage) and message.tool_call_id in view.served:
        return []
    if isinstance(message, ToolResultMessage) and message.tool_call_id in view.approved:
        approved = view.approved[message.tool_call_id]
        item_id_ = item_id(CALL_PREFIX, run_id, index, 0)
        return [call_item(approved.call, item_id_, message, approved.approval_request_id)]
    if isinstance(message, UserMessage):
        return [
            {
                "type": "message",
                "id": item_id("msg", run_id, index, 0),
                "role": "user",
                "status": "completed",
                "content": _user_content(message),
            }
        ]
    if isinstance(message, ToolResultMessage):
        parts = _user_content(message)
        one_text = len(parts) == 1 and parts[0]["type"] == "input_text"
        return [
            {
                "type": "function_call_output",
                "id": item_id(_OUTPUT_PREFIX, run_id, index, 0),
                "call_id": message.tool_call_id,
                "output": parts[0]["text"] if one_text else parts,
                "status": "completed",
            }
        ]
    items: list[dict[str, Any]] = []
    text: dict[str, Any] | None = None
    for block in message.content:
        if isinstance(block, TextBlock):
            if text is None:
                text = {
                    "type": "message",
                    "id": item_id("msg", run_id, index, len(items)),
                    "role": "assistant",
                    "status": "completed",
                    "content": [],
                }
                items.append(text)
            text["content"].append(
                {"type": "output_text", "text": block.text, "annotations": [], "logprobs": []}
            )
            continue
        text = None
        k = len(items)
        if isinstance(block, ToolCallBlock) and block.server_label is not None:
            if block.id in view.pending:
                items.append(approval_item(block, item_id(APPROVAL_PREFIX, run_id, index, k)))
            else:
                found = view.results.get(block.id)
                items.append(call_item(block, item_id(CALL_PREFIX, run_id, index, k), found))
        elif isinstance(block, ToolCallBlock):
            items.append(
                {
                    "type": "function_call",
                    "id": item_id("fc", run_id, index, k),
                    "call_id": block.id,
                    "name": block.name,
                    "arguments": block.arguments,
                    "status": "completed",
                }
            )
        else:
            thinking = block.thinking if isinstance(block, ThinkingBlock) else ""
            items.append(
                {
                    "type": "reasoning",
                    "id": item_id("rs", run_id, index, k),
                    "summary": [{"type": "summary_text", "text": thinking}] if thinking else [],
                    "encrypted_content": _envelope(block),
                    "status": "completed",
                }
            )
    if not items:  # an empty answer is still an item
        items.append(
            {
                "type": "message",
                "id": item_id("msg", run_id, index, 0),
                "role": "assistant",
                "status": "completed",
                "content": [],
            }
        )
    return items


def calls_by_item(message: AssistantMessage, run_id: str, index: int) -> dict[str, ToolCallBlock]:
    """The calls of a stored assistant message by the ids of the ``mcp_call`` and
    ``mcp_approval_request`` items they are shown as (as :func:`items_of` numbers them)."""
    found: dict[str, ToolCallBlock] = {}
    k, in_text = 0, False
    for block in message.content:
        if isinstance(block, TextBlock):
            if not in_text:
                k, in_text = k + 1, True
            continue
        in_text = False
        if isinstance(block, ToolCallBlock):
            found[item_id(CALL_PREFIX, run_id, index, k)] = block
            found[item_id(APPROVAL_PREFIX, run_id, index, k)] = block
        k += 1
    return found


# --- in: items -> messages --------------------------------------------------------------------


@dataclass(frozen=True)
class ApprovalItem:
    """An ``mcp_approval_response``: the decision on the call its request id names."""

    approval_request_id: str
    approve: bool
    reason: str
    where: str


@dataclass
class Parsed:
    """What an ``input`` holds: its messages, the text of its ``system`` / ``developer``
    messages (instructions for this response only), and its ``mcp_approval_response`` items
    (an ``mcp_approval_request`` item is the call awaiting it, under the request's id)."""

    messages: list[AnyMessage] = field(default_factory=list)
    system: list[str] = field(default_factory=list)
    approvals: list[ApprovalItem] = field(default_factory=list)


def _text_of(content: Any, where: str, kinds: tuple[str, ...]) -> list[str]:
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        raise bad_request(f"Invalid type for '{where}': expected a string or an array.", where)
    texts = []
    for j, part in enumerate(content):
        kind = str(part.get("type")) if isinstance(part, dict) else ""
        if kind not in kinds or not isinstance(part.get("text"), str):
            raise bad_request(
                f"Invalid value for '{where}[{j}].type': expected one of {', '.join(kinds)}.",
                f"{where}[{j}].type",
            )
        texts.append(part["text"])
    return texts


def _image(part: Mapping[str, Any], where: str) -> ImageBlock:
    url = part.get("image_url")
    if not isinstance(url, str) or not url:
        raise bad_request(
            f"Missing required parameter: '{where}.image_url' (file_id is not supported).",
            f"{where}.image_url",
        )
    found = _DATA_URL.match(url)
    if found:
        return ImageBlock(source=Base64Source(media_type=found.group(1), data=found.group(2)))
    return ImageBlock(source=UrlSource(url=url))


def _user_blocks(content: Any, where: str) -> tuple[TextBlock | ImageBlock, ...]:
    if isinstance(content, str):
        return (TextBlock(text=content),)
    if not isinstance(content, list):
        raise bad_request(f"Invalid type for '{where}': expected a string or an array.", where)
    blocks: list[TextBlock | ImageBlock] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text") and isinstance(part.get("text"), str):
            blocks.append(TextBlock(text=part["text"]))
        elif kind == "input_image":
            blocks.append(_image(part, f"{where}[{j}]"))
        else:
            raise bad_request(
                f"Invalid value for '{where}[{j}].type': expected input_text or input_image.",
                f"{where}[{j}].type",
            )
    return tuple(blocks)


def _signature(item: Mapping[str, Any], where: str) -> tuple[str, str | None]:
    """(signature, redacted data) from a reasoning item's ``encrypted_content``."""
    value = item.get("encrypted_content")
    if not value:
        return "", None
    try:
        opened = json.loads(base64.b64decode(value, validate=True))
    except (ValueError, binascii.Error):
        raise bad_request(
            f"Invalid value for '{where}.encrypted_content': not content this server issued.",
            f"{where}.encrypted_content",
        ) from None
    if not isinstance(opened, dict):
        raise bad_request(f"Invalid '{where}.encrypted_content'.", f"{where}.encrypted_content")
    return str(opened.get("signature", "")), opened.get("redacted")


def messages_of(
    items: Sequence[Any], tool_names: Callable[[str], str | None], where: str = "input"
) -> Parsed:
    """The messages of ``input`` items (validated; a bad one is a 400 naming its path).
    ``tool_names`` names the tool of a call answered by a ``function_call_output`` whose call is
    not in ``items`` (a pending call of the conversation)."""
    parsed = Parsed()
    blocks: list[Any] = []  # the assistant message being collected
    open_: list[bool] = []  # one assistant-side item was seen (an empty answer is a message)
    calls: dict[str, str] = {}
    served: list[ToolResultMessage] = []  # results of mcp_call items, after their message

    def flush() -> None:
        if open_:
            parsed.messages.append(AssistantMessage(content=tuple(blocks)))
            blocks.clear()
            open_.clear()
        parsed.messages.extend(served)
        served.clear()

    for i, item in enumerate(items):
        at = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise bad_request(f"Invalid type for '{at}': expected an object.", at)
        kind = item.get("type", "message" if "role" in item else None)
        if served and kind not in ("mcp_call", "mcp_approval_request"):
            flush()  # what follows a server's calls comes after their results
        if kind in ("mcp_call", "mcp_approval_request"):
            call = _server_call(item, at)
            calls[call.id] = call.name
            open_.append(True)
            blocks.append(call)
            if kind == "mcp_call":
                served.append(result_of(item, call.id, call.name))
            continue
        if kind == "mcp_approval_response":
            parsed.approvals.append(_approval(item, at))
            continue
        if kind == "mcp_list_tools":
            continue  # what a server offered: the run lists it again
        if kind == "message":
            role = item.get("role")
            if role == "user":
                flush()
                parsed.messages.append(UserMessage(content=_user_blocks(item.get("content"), at)))
            elif role == "assistant":
                open_.append(True)
                said = ("output_text", "input_text", "refusal")
                for text in _text_of(item.get("content"), f"{at}.content", said):
                    blocks.append(TextBlock(text=text))
            elif role in ("system", "developer"):
                told = ("input_text",)
                texts = _text_of(item.get("content"), f"{at}.content", told)
                if any("\x00" in text for text in texts):
                    # it becomes a system prompt, which never holds one (NO_NUL_PATTERN)
                    raise bad_request(
                        f"Invalid value for '{at}.content': must not contain NUL (\\u0000).",
                        f"{at}.content",
                    )
                parsed.system.extend(texts)
            else:
                raise bad_request(
                    f"Invalid value for '{at}.role': expected user, assistant, system or "
                    "developer.",
                    f"{at}.role",
                )
        elif kind == "function_call":
            call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
            if not (isinstance(call_id, str) and call_id and isinstance(name, str) and name):
                raise bad_request(f"'{at}' needs call_id and name (strings).", f"{at}.call_id")
            if not isinstance(arguments, str):
                raise bad_request(f"'{at}.arguments' must be a string.", f"{at}.arguments")
            calls[call_id] = name
            open_.append(True)
            blocks.append(ToolCallBlock(id=call_id, name=name, arguments=arguments))
        elif kind == "reasoning":
            summary = item.get("summary") or []
            text = "".join(
                s.get("text", "") for s in summary if isinstance(s, dict) and "text" in s
            )
            signature, redacted = _signature(item, at)
            open_.append(True)
            if redacted is not None:
                blocks.append(RedactedThinkingBlock(data=str(redacted)))
            else:
                blocks.append(ThinkingBlock(thinking=text, signature=signature))
        elif kind == "function_call_output":
            flush()
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise bad_request(f"Missing required parameter: '{at}.call_id'.", f"{at}.call_id")
            name = calls.get(call_id) or tool_names(call_id)
            if name is None:
                raise bad_request(
                    f"No tool call found for function call output with call_id {call_id}.",
                    f"{at}.call_id",
                )
            content = _user_blocks(item.get("output"), f"{at}.output")
            parsed.messages.append(
                ToolResultMessage(tool_call_id=call_id, tool_name=name, content=content)
            )
        else:
            raise bad_request(
                f"Invalid value for '{at}.type': {kind!r} is not supported "
                "(message, function_call, function_call_output, reasoning, item_reference, "
                "mcp_call, mcp_approval_request, mcp_approval_response, mcp_list_tools).",
                f"{at}.type",
            )
    flush()
    return parsed


def _server_call(item: Mapping[str, Any], at: str) -> ToolCallBlock:
    """The call an ``mcp_call`` / ``mcp_approval_request`` item stands for (its id is the
    call's id)."""
    call_id, name, label = item.get("id"), item.get("name"), item.get("server_label")
    arguments = item.get("arguments", "")
    if not (isinstance(call_id, str) and call_id):
        raise bad_request(f"Missing required parameter: '{at}.id'.", f"{at}.id")
    if not (isinstance(name, str) and name and isinstance(label, str) and label):
        raise bad_request(f"'{at}' needs name and server_label (strings).", f"{at}.name")
    if not isinstance(arguments, str):
        raise bad_request(f"'{at}.arguments' must be a string.", f"{at}.arguments")
    return ToolCallBlock(id=call_id, name=name, arguments=arguments, server_label=label[:64])


def _approval(item: Mapping[str, Any], at: str) -> ApprovalItem:
    request_id, approve = item.get("approval_request_id"), item.get("approve")
    if not (isinstance(request_id, str) and request_id):
        raise bad_request(
            f"Missing required parameter: '{at}.approval_request_id'.",
            f"{at}.approval_request_id",
        )
    if not isinstance(approve, bool):
        raise bad_request(f"'{at}.approve' must be a boolean.", f"{at}.approve")
    reason = item.get("reason")
    return ApprovalItem(request_id, approve, reason if isinstance(reason, str) else "", at)


__all__ = [
    "ApprovalItem",
    "ItemKey",
    "Parsed",
    "calls_by_item",
    "item_id",
    "items_of",
    "messages_of",
    "parse_item_id",
]
