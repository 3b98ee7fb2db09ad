"""Anthropic Messages provider, in three modules:

- :mod:`.request`: our messages and tools -> the Messages API request (``messages``,
  ``tools``; the ``tool_use.input`` and thinking decisions);
- :mod:`.stream`: Messages API events -> :mod:`~app.agent.providers.base` stream events
  (usage normalization, the order checks of a stream);
- :mod:`.client`: :class:`AnthropicProvider`, the ``anthropic`` SDK client: request
  parameters, error classification, the streaming and non-streaming calls.
"""

from __future__ import annotations

from .client import AnthropicProvider
from .request import build_messages, build_tools, tool_input

__all__ = [
    "AnthropicProvider",
    "build_messages",
    "build_tools",
    "tool_input",
]
