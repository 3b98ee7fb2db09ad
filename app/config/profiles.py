"""Agent profiles: their fields and validators (:class:`AgentProfile`), and the ``[agents.NAME]``
tables of the TOML file (:func:`load_profiles_file`). Re-exported by :mod:`app.config`, whose
:class:`~app.config.Settings` holds the ``default`` profile's fields itself.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import NoDecode

from .keys import _NAME
from .mcp import McpServerConfig, unique_labels

ProviderName = Literal["echo", "openai", "openai-responses", "anthropic"]

DEFAULT_PROFILE = "default"
DEFAULT_TOOLS: tuple[str, ...] = (
    "app.agent.builtin_tools:time_now",
    "app.agent.builtin_tools:wait",
    "app.agent.builtin_tools:fail",
)
#: context window assumed when a profile does not give one
DEFAULT_CONTEXT_WINDOW: dict[str, int] = {
    "echo": 128_000,
    "openai": 128_000,
    "openai-responses": 128_000,
    "anthropic": 200_000,
}
#: where a provider's key is read from when a profile does not name ``api_key_env``
PROVIDER_KEY_ENV: dict[str, str] = {
    "openai": "OPENAI_API_KEY",
    "openai-responses": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
}
#: the providers that speak OpenAI's APIs: with a ``base_url`` (a compatible server, which may
#: take no key) they need no key
OPENAI_PROVIDERS = frozenset({"openai", "openai-responses"})

#: what a run may set for itself when its profile allows it (docs/runs.md, "Per-run settings")
RUN_SETTINGS: tuple[str, ...] = ("model", "temperature", "max_output_tokens", "instructions")
RunSettingName = Literal["model", "temperature", "max_output_tokens", "instructions"]

_TOOL_PATH = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _split_list(value: Any) -> Any:
    """Environment lists are comma-separated (``a,b``); a JSON array is accepted too."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            return json.loads(text)
        return [item.strip() for item in text.split(",") if item.strip()]
    return value


class _ProfileFields(BaseModel):
    """The fields of an agent profile, shared by :class:`AgentProfile` and :class:`Settings`."""

    provider: ProviderName = "echo"
    model: str = ""
    base_url: str | None = None
    context_window: int = 128_000
    compact_at: float = 0.8
    tools: Annotated[tuple[str, ...], NoDecode] = DEFAULT_TOOLS
    max_turns: int = Field(default=32, ge=1)
    tool_timeout: float = Field(default=60.0, gt=0)
    max_retries: int = Field(default=4, ge=0)
    #: seconds to connect to the provider, and the longest it may send nothing (between two
    #: bytes of an answer: with streaming off, that is the whole answer) before the request is
    #: abandoned as a retryable failure (docs/providers.md, "Timeouts")
    #: ask the provider to stream its answer (server-sent events); false: one JSON answer
    stream: bool = True
    connect_timeout: float = Field(default=10.0, gt=0)
    idle_timeout: float = Field(default=180.0, gt=0)
    thinking_budget: int | None = Field(default=None, ge=1)
    max_output_tokens: int | None = Field(default=None, ge=1)
    api_key_env: str | None = None
    #: server tools (by name) whose calls wait for the application's decision (docs/tools.md)
    approval_required: Annotated[tuple[str, ...], NoDecode] = ()
    #: what a run may set for itself: model, temperature, max_output_tokens, instructions
    allowed_run_settings: Annotated[tuple[RunSettingName, ...], NoDecode] = ("instructions",)
    #: how many times an answer that does not match a run's output schema is sent back to the
    #: model with the violation before the run fails
    output_retries: int = Field(default=1, ge=0, le=5)
    #: remote MCP servers whose tools every run of the profile may use (docs/tools.md)
    mcp_servers: Annotated[tuple[McpServerConfig, ...], NoDecode] = ()

    def allows(self, setting: str) -> bool:
        """May a run of this profile set ``setting`` (one of :data:`RUN_SETTINGS`)?"""
        return setting in self.allowed_run_settings

    @model_validator(mode="before")
    @classmethod
    def _provider_defaults(cls, data: Any) -> Any:
        # The window and the model default by provider, so they are filled before validation.
        if isinstance(data, dict):
            provider = str(data.get("provider") or "echo").strip().lower()
            if data.get("context_window") in (None, ""):
                data = {**data, "context_window": DEFAULT_CONTEXT_WINDOW.get(provider, 128_000)}
            if provider == "echo" and not data.get("model"):
                data = {**data, "model": "echo"}
        return data

    @field_validator("provider", mode="before")
    @classmethod
    def _known_provider(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.strip().lower()
            if value not in get_args(ProviderName):
                raise ValueError(
                    f"unknown provider {value!r}: choose 'echo', 'openai', "
                    "'openai-responses' or 'anthropic'"
                )
        return value

    @field_validator("context_window")
    @classmethod
    def _positive_window(cls, value: int) -> int:
        if value <= 0:
            raise ValueError(f"context_window must be a positive number of tokens, got {value}")
        return value

    @field_validator("compact_at")
    @classmethod
    def _share_of_window(cls, value: float) -> float:
        if not 0 < value <= 1:
            raise ValueError(
                f"compact_at is a share of the context window and must be in (0, 1], got {value}"
            )
        return value

    @field_validator("tools", "approval_required", "allowed_run_settings", mode="before")
    @classmethod
    def _split_tools(cls, value: Any) -> Any:
        return _split_list(value)

    @field_validator("mcp_servers", mode="before")
    @classmethod
    def _servers_json(cls, value: Any) -> Any:
        """As a variable: a JSON array of server objects."""
        if isinstance(value, str):
            try:
                return json.loads(value) if value.strip() else ()
            except ValueError as exc:
                raise ValueError(f"mcp_servers must be a JSON array of objects: {exc}") from None
        return value

    @field_validator("mcp_servers")
    @classmethod
    def _server_labels(cls, value: tuple[McpServerConfig, ...]) -> tuple[McpServerConfig, ...]:
        unique_labels(value)
        return value

    @field_validator("approval_required")
    @classmethod
    def _tool_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
                raise ValueError(f"approval_required: {name!r} is not a tool name")
        return tuple(dict.fromkeys(value))

    @field_validator("tools")
    @classmethod
    def _tool_paths(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for path in value:
            if not _TOOL_PATH.match(path):
                raise ValueError(f"tool {path!r} must be an import path like 'package.module:name'")
        if len(set(value)) != len(value):
            raise ValueError("a tool is listed twice")
        return value

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        value = value.strip()
        if not re.match(r"^https?://[^\s/]+", value):
            raise ValueError(f"base_url must be an http:// or https:// URL, got {value!r}")
        return value

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and not _ENV_NAME.match(value):
            raise ValueError(f"api_key_env must name an environment variable, got {value!r}")
        return value

    @model_validator(mode="after")
    def _coherent(self) -> _ProfileFields:
        if self.provider != "echo" and not self.model.strip():
            raise ValueError(f"a model is required when the provider is {self.provider!r}")
        if (
            self.thinking_budget is not None
            and self.max_output_tokens is not None
            and self.thinking_budget >= self.max_output_tokens
        ):
            raise ValueError("thinking_budget must be smaller than max_output_tokens")
        return self


class AgentProfile(_ProfileFields):
    """One agent profile: which provider and model, how much context, which tools, which limits.

    ``api_key`` is resolved from the environment when the profile is built, never read from the
    TOML file.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    api_key: SecretStr | None = None


def _resolve_key(profile: _ProfileFields, provider_keys: Mapping[str, SecretStr | None]) -> Any:
    if profile.api_key_env:
        value = os.environ.get(profile.api_key_env, "")
        return SecretStr(value) if value else None
    return provider_keys.get(profile.provider)


def validation_messages(exc: ValidationError, prefix: str = "") -> list[str]:
    """Each error as ``where: why`` (``where`` dotted, after ``prefix``)."""
    messages = []
    for error in exc.errors():
        where = ".".join(str(p) for p in (prefix, *error["loc"]) if p != "") or "settings"
        messages.append(f"{where}: {str(error['msg']).removeprefix('Value error, ')}")
    return messages


def load_profiles_file(
    path: Path, provider_keys: Mapping[str, SecretStr | None]
) -> dict[str, AgentProfile]:
    """Read the ``[agents.NAME]`` tables of a TOML file into profiles.

    Each profile's key is resolved from the environment, never read from the file.
    """
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"config file {str(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"config file {str(path)!r} cannot be read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"config file {str(path)!r} is not valid TOML: {exc}") from None
    unknown = sorted(set(document) - {"agents"})
    if unknown:
        raise ValueError(
            f"config file {str(path)!r}: unknown top-level key(s) {unknown}; "
            "profiles go in [agents.NAME] tables"
        )
    agents = document.get("agents", {})
    if not isinstance(agents, dict):
        raise ValueError(f"config file {str(path)!r}: 'agents' must be a table")
    profiles: dict[str, AgentProfile] = {}
    for name, table in agents.items():
        where = f"config file {str(path)!r}: agents.{name}"
        if not _NAME.match(name):
            raise ValueError(f"{where}: profile names are 1-64 letters, digits, '.', '_' or '-'")
        if not isinstance(table, dict):
            raise ValueError(f"{where} must be a table")
        if "api_key" in table:
            raise ValueError(
                f"{where}: keys do not belong in the file; put the key in an environment "
                "variable and name it with api_key_env"
            )
        try:
            profile = AgentProfile.model_validate(table)
        except ValidationError as exc:
            raise ValueError("; ".join(validation_messages(exc, where))) from None
        key = _resolve_key(profile, provider_keys)
        profiles[name] = profile.model_copy(update={"api_key": key})
    return profiles
