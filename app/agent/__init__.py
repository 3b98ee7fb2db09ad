"""Carryover's agent core: a plain async library (no HTTP, no SQL). See docs/architecture.md."""

from .codec import CodecError, dump_context, dump_message, load_context, load_message
from .messages import (
    AssistantMessage,
    AttemptError,
    Base64Source,
    Context,
    ImageBlock,
    Message,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
    ToolResultMessage,
    UrlSource,
    Usage,
    UserMessage,
)
from .records import Compaction, Input, Result
from .replay import ReplayError, validate_context, validate_messages
from .run import Agent, AgentConfig
from .tools import Tool, ToolRegistry

__all__ = [
    "Agent",
    "AgentConfig",
    "AssistantMessage",
    "AttemptError",
    "Base64Source",
    "CodecError",
    "Compaction",
    "Context",
    "ImageBlock",
    "Input",
    "Message",
    "RedactedThinkingBlock",
    "ReplayError",
    "Result",
    "TextBlock",
    "ThinkingBlock",
    "Tool",
    "ToolCallBlock",
    "ToolRegistry",
    "ToolResultMessage",
    "UrlSource",
    "Usage",
    "UserMessage",
    "dump_context",
    "dump_message",
    "load_context",
    "load_message",
    "validate_context",
    "validate_messages",
]
