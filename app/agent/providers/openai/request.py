"""OpenAI Chat Completions provider: the request (our messages and tools -> the wire format).

Request mapping (our messages -> ``messages``):

- the system prompt goes first as a ``system`` message (left out when empty);
- user text/images -> ``content`` parts (``image_url`` with the https URL, or a ``data:`` URL
  built from a base64 source); a user message of exactly one text block is sent as a plain
  string, which every compatible server understands;
- assistant -> concatenated text as ``content`` and ``tool_calls`` whose ``arguments`` is the
  stored raw string, byte for byte (it may not even be valid JSON: vLLM-style servers that
  re-parse it will refuse it, OpenAI does not). Thinking and redacted-thinking blocks are not
  sent (Chat Completions has no field for them);
- tool results -> ``{"role": "tool", "tool_call_id", "content": text}``. Chat Completions only
  accepts images in user messages, so images returned by tools are sent in ONE user message
  placed right after the last tool message of the batch, each group introduced by a text part
  naming its call; a result with images and no text says where its images went. ``is_error``
  has no wire field and is not sent (the tool runner's error text is the content).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...messages import (
    AnyMessage,
    AssistantMessage,
    Base64Source,
    ImageBlock,
    TextBlock,
    ToolCallBlock,
    ToolResultMessage,
    UserMessage,
)
from ..base import ToolSpec


def _image_url(block: ImageBlock) -> str:
    source = block.source
    if isinstance(source, Base64Source):
        return f"data:{source.media_type};base64,{source.data}"
    return source.url


def _user_content(blocks: Sequence[TextBlock | ImageBlock]) -> str | list[dict[str, Any]]:
    if len(blocks) == 1 and isinstance(blocks[0], TextBlock):
        return blocks[0].text
    parts: list[dict[str, Any]] = []
    for block in blocks:
        if isinstance(block, TextBlock):
            parts.append({"type": "text", "text": block.text})
        else:
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block)}})
    return parts


def _assistant(message: AssistantMessage) -> dict[str, Any]:
    text = "".join(b.text for b in message.content if isinstance(b, TextBlock))
    calls = [b for b in message.content if isinstance(b, ToolCallBlock)]
    out: dict[str, Any] = {"role": "assistant"}
    if calls:
        # ``content`` may be null with tool calls; send text only when there is some.
        out["content"] = text or None
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                # The raw string exactly as the model produced it, never re-serialized.
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in calls
        ]
    else:
        out["content"] = text
    return out


def build_messages(system_prompt: str, messages: Sequence[AnyMessage]) -> list[dict[str, Any]]:
    """The Chat Completions ``messages`` array for a request."""
    out: list[dict[str, Any]] = []
    if system_prompt:
        out.append({"role": "system", "content": system_prompt})
    pending_images: list[dict[str, Any]] = []

    def flush_images() -> None:
        if pending_images:
            out.append({"role": "user", "content": list(pending_images)})
            pending_images.clear()

    for message in messages:
        if isinstance(message, ToolResultMessage):
            text = "".join(b.text for b in message.content if isinstance(b, TextBlock))
            images = [b for b in message.content if isinstance(b, ImageBlock)]
            if images:
                pending_images.append(
                    {
                        "type": "text",
                        "text": f"Image output of tool call {message.tool_call_id} "
                        f"({message.tool_name}):",
                    }
                )
                pending_images.extend(
                    {"type": "image_url", "image_url": {"url": _image_url(b)}} for b in images
                )
                if not text:
                    text = "(the image output follows in the next user message)"
            out.append({"role": "tool", "tool_call_id": message.tool_call_id, "content": text})
            continue
        flush_images()
        if isinstance(message, UserMessage):
            out.append({"role": "user", "content": _user_content(message.content)})
        else:
            out.append(_assistant(message))
    flush_images()
    return out


def build_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.parameters,
            },
        }
        for tool in tools
    ]
