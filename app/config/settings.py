"""The service's settings (:class:`Settings`): ``CARRYOVER_*`` environment variables, and the
agent profiles of the TOML file named by ``CARRYOVER_CONFIG_FILE`` (see :mod:`app.config`).

Secrets are held as :class:`~pydantic.SecretStr` (or :class:`~app.config.keys.ApiKeys`) so no
repr prints them.

Tests build settings explicitly: ``Settings(provider="openai", model="m")`` — keyword arguments
win over the environment — and call ``get_settings.cache_clear()`` after changing variables.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    Field,
    PrivateAttr,
    SecretStr,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from .keys import _NAME, ApiKeys
from .mcp import allowed_prefixes
from .profiles import (
    DEFAULT_PROFILE,
    AgentProfile,
    _ProfileFields,
    _resolve_key,
    _split_list,
    load_profiles_file,
)

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]

MiB = 1024 * 1024

_ORIGIN = re.compile(r"^https?://[^/\s?#]+$")


def _mask_url(url: str) -> str:
    """``scheme://user:***@host/db``: a database URL fit for a log line."""
    return re.sub(r"^([A-Za-z][\w+.-]*://[^:/@]*):[^@/]*@", r"\1:***@", url)


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    host = host.strip().strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Settings(_ProfileFields, BaseSettings):
    """Everything the service reads from its environment (and, for profiles, the TOML file)."""

    model_config = SettingsConfigDict(
        env_prefix="CARRYOVER_",
        extra="ignore",
        frozen=True,
        env_ignore_empty=True,
        populate_by_name=True,
        # a validation error must not print the input: it holds the keys
        hide_input_in_errors=True,
    )

    # --- service -----------------------------------------------------------------------------
    database_url: str = "sqlite:///./carryover.db"
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    workers: int = Field(default=1, ge=1)
    config_file: Path | None = None
    log_level: LogLevel = "INFO"
    log_format: Literal["text", "json"] = "text"

    # --- provider keys (no prefix, as their ecosystems expect) --------------------------------
    openai_api_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("openai_api_key", "OPENAI_API_KEY")
    )
    anthropic_api_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("anthropic_api_key", "ANTHROPIC_API_KEY")
    )

    # --- runs ----------------------------------------------------------------------------------
    lease_seconds: float = Field(default=5.0, gt=0)
    busy_wait_seconds: float = Field(default=30.0, ge=0)
    idempotency_ttl_seconds: int = Field(default=86_400, ge=1)
    #: how long a run's outcome write is retried while the database fails (docs/faults.md)
    outcome_retry_seconds: float = Field(default=30.0, ge=0, le=600)

    # --- run events and webhooks (docs/runs.md) ------------------------------------------------
    #: how long a run's events stay readable at GET …/runs/{id}/events after they were written
    event_retention_seconds: int = Field(default=86_400, ge=1)
    #: how often a reader of a run in flight looks for new events (short polling)
    event_poll_seconds: float = Field(default=0.25, gt=0, le=10)
    #: an event stream quiet this long gets a ``: keep-alive`` comment (proxies' idle timeouts)
    stream_keepalive_seconds: float = Field(default=15.0, gt=0, le=300)
    #: events a streamed run holds for a reader that lags (JSON bytes, estimated); past it the
    #: reader's stream is cut and it resumes from the stored events (docs/runs.md)
    stream_buffer_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    #: this process delivers webhooks (false: it only writes the outbox; other replicas send)
    webhook_worker: bool = True
    webhook_max_attempts: int = Field(default=8, ge=1, le=100)
    #: the wait after the first failed attempt; it doubles after each (at most an hour)
    webhook_backoff_seconds: float = Field(default=5.0, ge=0)
    webhook_timeout_seconds: float = Field(default=10.0, gt=0)
    #: how often the worker looks for due deliveries
    webhook_poll_seconds: float = Field(default=1.0, gt=0)

    # --- limits --------------------------------------------------------------------------------
    max_body_bytes: int = Field(default=8 * MiB, ge=1024)
    max_image_bytes: int = Field(default=5 * MiB, ge=1)
    max_prompts_per_run: int = Field(default=32, ge=1)
    max_text_chars: int = Field(default=200_000, ge=1)
    max_context_messages: int = Field(default=10_000, ge=1)
    max_page_size: int = Field(default=200, ge=1)
    default_page_size: int = Field(default=50, ge=1)
    # conversation metadata (docs/conversations.md); the columns hold at most 128/1024
    max_metadata_keys: int = Field(default=64, ge=0)
    max_metadata_key_chars: int = Field(default=64, ge=1, le=128)
    max_metadata_value_chars: int = Field(default=512, ge=1, le=1024)

    # --- retention (docs/conversations.md) -----------------------------------------------------
    #: delete a conversation this long after its last update unless it has its own expires_at
    retention_seconds: int | None = Field(default=None, ge=1)
    #: how often the sweeper runs, and how many conversations one batch deletes
    retention_sweep_seconds: float = Field(default=60.0, gt=0)
    retention_sweep_batch: int = Field(default=500, ge=1)
    #: how long an earlier version of a context stays readable (GET context ?version=N, fork
    #: from a version, previous_response_id), counted from when it was written; the current
    #: version is always kept (docs/conversations.md, "Versions")
    version_retention_seconds: int = Field(default=30 * 86_400, ge=1)

    # --- long conversations (docs/performance.md) ----------------------------------------------
    #: messages of parsed contexts kept in memory per process (LRU); 0: no cache
    context_cache_messages: int = Field(default=200_000, ge=0)
    #: bytes of parsed contexts (with their provider encodings) kept per process, estimated
    context_cache_bytes: int = Field(default=256 * 1024 * 1024, ge=0)
    #: bytes of GET context bodies (stored texts, joined) kept per process (LRU); 0: none
    context_body_cache_bytes: int = Field(default=64 * 1024 * 1024, ge=0)
    #: the garbage collector's young-generation threshold once started (0: Python's defaults)
    gc_gen0_threshold: int = Field(default=50_000, ge=0)
    #: the longest one provider answer (or summary) may be, in characters; at most
    #: ``max_text_chars`` so that what a run stores can be PUT back (default: that limit)
    max_answer_chars: int | None = Field(default=None, ge=1)
    #: a run's overall deadline (and a compaction's): past it, it is stopped and ends failed
    run_deadline_seconds: float = Field(default=900.0, gt=0)
    #: the share of ``max_context_messages`` or ``max_body_bytes`` past which a run compacts
    #: its context first (0: never for its size; a run that would pass a bound then fails)
    size_compact_at: float = Field(default=0.9, ge=0, le=1)

    # --- remote MCP tools (docs/tools.md) ------------------------------------------------------
    #: URL prefixes a request's own MCP server (``server_url``) must start with; none by default,
    #: so requests cannot name MCP servers until the operator allows some
    mcp_allowed_urls: Annotated[tuple[str, ...], NoDecode] = ()
    #: how long a server's tool listing is kept, and how many listings / bytes at most
    mcp_list_cache_seconds: float = Field(default=60.0, ge=0)
    mcp_list_cache_entries: int = Field(default=256, ge=0)
    mcp_list_cache_bytes: int = Field(default=8 * MiB, ge=0)
    #: timeouts of a request's own MCP servers (seconds): connect, a listing, one call
    mcp_connect_timeout: float = Field(default=10.0, gt=0, le=600)
    mcp_list_timeout: float = Field(default=30.0, gt=0, le=3600)
    mcp_call_timeout: float = Field(default=60.0, gt=0, le=3600)

    # --- access --------------------------------------------------------------------------------
    api_keys: Annotated[ApiKeys, NoDecode] = Field(default_factory=ApiKeys)
    #: how long a database key lookup (and "are there keys at all") is remembered: a revoked
    #: key stops working within this time
    api_key_cache_seconds: float = Field(default=2.0, ge=0, le=60)
    #: refused credentials a client address may present per window before its requests are
    #: answered 429 without a lookup (docs/security.md); 0: no throttling
    auth_failure_limit: int = Field(default=20, ge=0)
    auth_failure_window_seconds: float = Field(default=60.0, gt=0)
    allow_unauthenticated_public: bool = False
    #: serve /metrics without an API key even when keys are configured
    public_metrics: bool = False
    cors_origins: Annotated[tuple[str, ...], NoDecode] = ()

    # --- profiles given directly (tests, or CARRYOVER_AGENTS as a JSON object) -----------------
    agents: dict[str, AgentProfile] = Field(default_factory=dict)

    _profiles: dict[str, AgentProfile] = PrivateAttr(default_factory=dict)

    @field_validator("openai_api_key", "anthropic_api_key")
    @classmethod
    def _blank_key_is_none(cls, value: SecretStr | None) -> SecretStr | None:
        return value if value is not None and value.get_secret_value().strip() else None

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_level(cls, value: Any) -> Any:
        return value.strip().upper() if isinstance(value, str) else value

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: str) -> str:
        if not re.match(r"^(sqlite|postgresql)(\+\w+)?://", value):
            raise ValueError(
                f"database_url must be a sqlite:/// or postgresql:// URL, got {_mask_url(value)!r}"
            )
        return value

    @field_serializer("database_url", when_used="json")
    def _masked_url(self, value: str) -> str:
        return _mask_url(value)

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("host must not be empty")
        return value.strip()

    @field_validator("cors_origins", "mcp_allowed_urls", mode="before")
    @classmethod
    def _split_origins(cls, value: Any) -> Any:
        return _split_list(value)

    @field_validator("mcp_allowed_urls")
    @classmethod
    def _mcp_prefixes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return allowed_prefixes(value)

    @field_validator("cors_origins")
    @classmethod
    def _origins(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for origin in value:
            if origin != "*" and not _ORIGIN.match(origin):
                raise ValueError(
                    f"CORS origin {origin!r} must be '*' or scheme://host[:port] "
                    "(no path, no trailing slash)"
                )
        return value

    @field_validator("agents")
    @classmethod
    def _agent_names(cls, value: dict[str, AgentProfile]) -> dict[str, AgentProfile]:
        for name in value:
            if not _NAME.match(name):
                raise ValueError(f"profile name {name!r}: use 1-64 letters, digits, '.', '_', '-'")
        return value

    @model_validator(mode="after")
    def _answers_fit_a_put(self) -> Settings:
        if self.max_answer_chars is not None and self.max_answer_chars > self.max_text_chars:
            raise ValueError(
                "max_answer_chars must not exceed max_text_chars: a run would store answers "
                "that a PUT of the context refuses"
            )
        return self

    @property
    def answer_limit(self) -> int:
        """The longest provider answer (or summary) a run takes, in characters."""
        return self.max_answer_chars or self.max_text_chars

    @model_validator(mode="after")
    def _limits_and_profiles(self) -> Settings:
        if self.default_page_size > self.max_page_size:
            raise ValueError(
                f"default_page_size ({self.default_page_size}) must not exceed "
                f"max_page_size ({self.max_page_size})"
            )
        # A base64 image is 4/3 of its decoded size: the largest allowed image must fit a body.
        if self.max_image_bytes * 4 // 3 >= self.max_body_bytes:
            raise ValueError(
                f"max_image_bytes ({self.max_image_bytes}) base64-encoded does not fit in "
                f"max_body_bytes ({self.max_body_bytes})"
            )
        profiles = {DEFAULT_PROFILE: self._env_profile()}
        if self.config_file is not None:
            profiles.update(load_profiles_file(self.config_file, self.provider_keys()))
        profiles.update(self.agents)
        self._profiles = profiles
        return self

    def provider_keys(self) -> dict[str, SecretStr | None]:
        """The key each provider reads when its profile names no ``api_key_env``: both OpenAI
        providers read ``OPENAI_API_KEY``."""
        return {
            "openai": self.openai_api_key,
            "openai-responses": self.openai_api_key,
            "anthropic": self.anthropic_api_key,
        }

    def _env_profile(self) -> AgentProfile:
        fields = {name: getattr(self, name) for name in _ProfileFields.model_fields}
        profile = AgentProfile.model_validate(fields)
        return profile.model_copy(update={"api_key": _resolve_key(profile, self.provider_keys())})

    def profiles(self) -> dict[str, AgentProfile]:
        """Every agent profile by name; ``default`` always exists (the environment's, unless
        the TOML file or ``agents`` defines one)."""
        return dict(self._profiles)

    def profile(self, name: str = DEFAULT_PROFILE) -> AgentProfile:
        """One profile; ``KeyError`` names the ones that exist."""
        profiles = self.profiles()
        if name not in profiles:
            raise KeyError(f"no agent profile {name!r}; known: {sorted(profiles)}")
        return profiles[name]

    def secret_values(self) -> tuple[str, ...]:
        """Every secret this configuration holds, for log redaction."""
        values: list[str] = list(self.api_keys.secret_values())
        for key in (self.openai_api_key, self.anthropic_api_key):
            if key is not None:
                values.append(key.get_secret_value())
        for profile in self.profiles().values():
            if profile.api_key is not None:
                values.append(profile.api_key.get_secret_value())
            for server in profile.mcp_servers:  # MCP headers: configured, or read from variables
                values.extend(server.server().headers.values())
        password = re.match(r"^[A-Za-z][\w+.-]*://[^:/@]*:([^@/]+)@", self.database_url)
        if password:
            values.append(password.group(1))
        return tuple(dict.fromkeys(v for v in values if v))

    @property
    def database_url_display(self) -> str:
        """The database URL with its password masked."""
        return _mask_url(self.database_url)

    def exposure_problem(self, host: str | None = None, db_keys: int = 0) -> str | None:
        """Why serving on ``host`` would be unsafe, or ``None`` when it is fine (contract §6: with
        no API keys configured the server only listens on loopback). ``db_keys``: how many active
        keys the database holds (``carryover keys create``)."""
        host = self.host if host is None else host
        if is_loopback(host) or self.api_keys or db_keys or self.allow_unauthenticated_public:
            return None
        return (
            f"refusing to listen on {host!r} without authentication: no API keys are configured. "
            "Create one with 'carryover keys create --tenant NAME' or set CARRYOVER_API_KEYS "
            "(comma-separated tenant:key pairs), listen on 127.0.0.1, or set "
            "CARRYOVER_ALLOW_UNAUTHENTICATED_PUBLIC=true if something in front of the service "
            "authenticates every request."
        )

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        for name, value in super().__repr_args__():
            yield (name, _mask_url(value)) if name == "database_url" else (name, value)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read once. ``get_settings.cache_clear()`` re-reads them."""
    return Settings()


def default_settings() -> Settings:
    """Settings from their defaults alone: no environment variable, ``.env`` or config file."""

    class Defaults(Settings):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            return (init_settings,)

    return Defaults()


__all__ = [
    "LogLevel",
    "MiB",
    "Settings",
    "_mask_url",
    "default_settings",
    "get_settings",
    "is_loopback",
]
