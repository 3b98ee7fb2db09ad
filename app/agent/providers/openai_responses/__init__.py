"""OpenAI Responses API provider (``openai-responses``), stateless, in three modules:

- :mod:`.request`: our messages and tools -> the ``input`` items and function tools (the
  reasoning items replayed exactly as received);
- :mod:`.stream`: Responses events and output items -> :mod:`~app.agent.providers.base`
  stream events (reasoning items kept as ``provider_data``, usage, stop reasons, failures);
- :mod:`.client`: :class:`OpenAIResponsesProvider`, the request parameters and the streaming
  and non-streaming calls through the ``openai`` SDK client it shares with the Chat
  Completions provider (:mod:`..openai.sdk`).
"""

from __future__ import annotations

from .client import OpenAIResponsesProvider
from .request import build_input, build_tools

__all__ = ["OpenAIResponsesProvider", "build_input", "build_tools"]
