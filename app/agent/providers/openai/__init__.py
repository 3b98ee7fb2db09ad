"""OpenAI Chat Completions-compatible provider (OpenAI, Ollama, vLLM, llama.cpp, LM Studio),
in three modules:

- :mod:`.request`: our messages and tools -> the Chat Completions request;
- :mod:`.stream`: Chat Completions chunks -> :mod:`~app.agent.providers.base` stream events
  (stable block indexes, tool-call ids, reasoning, usage);
- :mod:`.client`: :class:`OpenAIProvider`, the ``openai`` SDK client: request parameters,
  error classification, the streaming and non-streaming calls.
"""

from __future__ import annotations

from .client import OpenAIProvider
from .request import build_messages, build_tools

__all__ = ["OpenAIProvider", "build_messages", "build_tools"]
