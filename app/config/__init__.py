"""Configuration: environment variables (prefix ``CARRYOVER_``) and a TOML file of agent profiles.

The environment describes the service and the ``default`` agent profile (contract §6). A TOML file
named by ``CARRYOVER_CONFIG_FILE`` may add named profiles, or replace ``default``::

    [agents.default]
    provider = "anthropic"
    model = "claude-sonnet-4-5"
    context_window = 200000

    [agents.local]
    provider = "openai"
    base_url = "http://127.0.0.1:11434/v1"
    model = "llama3.1"
    api_key_env = "OLLAMA_API_KEY"

Provider keys never live in the file: they come from ``OPENAI_API_KEY`` / ``ANTHROPIC_API_KEY``
as those ecosystems expect, or from the variable a profile names in ``api_key_env``.

The parts, each re-exported here but :mod:`~app.config.check`:

- :mod:`~app.config.settings`: :class:`Settings`, :func:`get_settings`, :func:`default_settings`;
- :mod:`~app.config.keys`: :class:`ApiKeys` (``CARRYOVER_API_KEYS``, tenant:key pairs);
- :mod:`~app.config.profiles`: agent profiles (:class:`AgentProfile`) and the TOML file's
  ``[agents.NAME]`` tables (:func:`load_profiles_file`);
- :mod:`~app.config.check`: the configuration checked as a whole at start, and for
  ``carryover config``.
"""

from __future__ import annotations

from .keys import TENANT_NAME, ApiKeys
from .profiles import (
    DEFAULT_CONTEXT_WINDOW,
    DEFAULT_PROFILE,
    DEFAULT_TOOLS,
    OPENAI_PROVIDERS,
    PROVIDER_KEY_ENV,
    RUN_SETTINGS,
    AgentProfile,
    ProviderName,
    load_profiles_file,
    validation_messages,
)
from .settings import LogLevel, MiB, Settings, default_settings, get_settings, is_loopback

__all__ = [
    "DEFAULT_CONTEXT_WINDOW",
    "DEFAULT_PROFILE",
    "DEFAULT_TOOLS",
    "OPENAI_PROVIDERS",
    "PROVIDER_KEY_ENV",
    "RUN_SETTINGS",
    "TENANT_NAME",
    "AgentProfile",
    "ApiKeys",
    "LogLevel",
    "MiB",
    "ProviderName",
    "Settings",
    "default_settings",
    "get_settings",
    "is_loopback",
    "load_profiles_file",
    "validation_messages",
]
