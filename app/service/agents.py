"""Agents by profile name: each profile of the configuration becomes one shared Agent.

An Agent keeps nothing between runs, so one per profile serves every conversation; its provider
holds the HTTP connection pool. Agents are built on first use and closed with the app.
"""

from __future__ import annotations

import os

from pydantic import SecretStr

from app.agent.mcp import ListingCache, McpClient, McpServer
from app.agent.providers.base import Provider, Timeouts
from app.agent.providers.echo import EchoProvider
from app.agent.retry import RetryPolicy
from app.agent.run import Agent, AgentConfig
from app.agent.tools import ToolRegistry
from app.config import OPENAI_PROVIDERS, PROVIDER_KEY_ENV, RUN_SETTINGS, AgentProfile, Settings
from app.errors import CarryoverError

from .bounds import BoundedProvider
from .types import RunRequest

#: ``max_tokens`` sent to Anthropic when a profile does not set ``max_output_tokens``
DEFAULT_ANTHROPIC_MAX_TOKENS = 8192


class UnknownAgent(CarryoverError, LookupError):
    """A request names an agent profile that is not configured: 422 on ``body.agent``."""

    slug = "validation-error"
    status = 422

    def __init__(self, name: str, known: list[str]) -> None:
        message = f"no agent profile named {name!r}; configured: {', '.join(known)}"
        super().__init__(
            f"body.agent: {message}", errors=[{"path": "body.agent", "message": message}]
        )
        self.name = name


class SettingNotAllowed(CarryoverError, ValueError):
    """A run sets what its agent profile does not let a run set (``allowed_run_settings``):
    422 naming the field (on ``/v1``: 400 with ``param``)."""

    slug = "validation-error"
    status = 422

    def __init__(self, agent: str, setting: str, allowed: tuple[str, ...]) -> None:
        message = (
            f"the agent profile {agent!r} does not let a run set {setting!r} "
            f"(its allowed_run_settings: {', '.join(allowed) or 'none'})"
        )
        super().__init__(
            f"body.{setting}: {message}",
            errors=[{"path": f"body.{setting}", "message": message}],
        )
        self.setting = setting


class MissingProviderKey(CarryoverError, RuntimeError):
    """A profile names a real provider but its API key is not configured: 503."""

    slug = "not-ready"
    status = 503


class MisconfiguredProfile(CarryoverError, ValueError):
    """A profile that cannot be built as configured (e.g. ``approval_required`` naming a tool
    it does not have): 503 until the configuration is fixed."""

    slug = "not-ready"
    status = 503


def with_key(profile: AgentProfile, settings: Settings) -> AgentProfile:
    """``profile`` with its API key, when it has none yet: from the variable it names in
    ``api_key_env``, else from ``OPENAI_API_KEY`` / ``ANTHROPIC_API_KEY`` as the settings read
    them. Profiles of the TOML file and the environment arrive resolved; those given as
    ``Settings(agents=...)`` (or ``CARRYOVER_AGENTS``) do not."""
    if profile.api_key is not None or profile.provider == "echo":
        return profile
    if profile.api_key_env:
        value = os.environ.get(profile.api_key_env, "")
    else:
        secret = settings.provider_keys().get(profile.provider)
        value = secret.get_secret_value() if secret is not None else ""
    if not value.strip():
        return profile
    return profile.model_copy(update={"api_key": SecretStr(value)})


def build_provider(profile: AgentProfile) -> Provider:
    if profile.provider == "echo":
        return EchoProvider(model=profile.model)
    key = profile.api_key.get_secret_value() if profile.api_key is not None else ""
    if not key:
        env = profile.api_key_env or PROVIDER_KEY_ENV[profile.provider]
        if profile.provider not in OPENAI_PROVIDERS or profile.base_url is None:
            raise MissingProviderKey(f"the {profile.provider} provider needs {env} to be set")
        key = "unused"  # local OpenAI-compatible servers (Ollama, vLLM, ...) take no key
    timeouts = Timeouts(connect=profile.connect_timeout, idle=profile.idle_timeout)
    if profile.provider in OPENAI_PROVIDERS:
        from app.agent.providers.openai import OpenAIProvider
        from app.agent.providers.openai_responses import OpenAIResponsesProvider

        kind = OpenAIProvider if profile.provider == "openai" else OpenAIResponsesProvider
        return kind(
            api_key=key,
            base_url=profile.base_url,
            model=profile.model,
            timeouts=timeouts,
            stream=profile.stream,
        )
    from app.agent.providers.anthropic import AnthropicProvider

    # Anthropic refuses a request whose max_tokens does not exceed the thinking budget (the
    # profile checks that only when it sets both): the default leaves room for the answer.
    max_tokens = profile.max_output_tokens or (
        DEFAULT_ANTHROPIC_MAX_TOKENS + (profile.thinking_budget or 0)
    )
    return AnthropicProvider(
        api_key=key,
        base_url=profile.base_url,
        model=profile.model,
        max_tokens=max_tokens,
        thinking_budget=profile.thinking_budget,
        timeouts=timeouts,
        stream=profile.stream,
    )


def build_agent(
    profile: AgentProfile,
    provider: Provider | None = None,
    *,
    max_answer_chars: int | None = None,
    mcp: McpClient | None = None,
) -> Agent:
    """The agent of a profile; ``max_answer_chars`` bounds its provider's answers
    (:class:`~app.service.bounds.BoundedProvider`); ``mcp``: the process's MCP client (a new
    one when not given), for the profile's MCP servers and those runs name."""
    tools = ToolRegistry.from_paths(profile.tools, default_timeout=profile.tool_timeout)
    unknown = sorted(set(profile.approval_required) - set(tools.tools))
    if unknown:
        # a typo must not silently gate nothing (docs/tools.md)
        raise MisconfiguredProfile(
            f"approval_required names {', '.join(unknown)}, which are not server tools of the "
            f"profile (its tools: {', '.join(sorted(tools.tools)) or 'none'})"
        )
    provider = provider or build_provider(profile)
    if max_answer_chars is not None:
        provider = BoundedProvider(provider, max_answer_chars)
    return Agent(
        AgentConfig(
            provider=provider,
            model=profile.model,
            tools=tools,
            context_window=profile.context_window,
            compact_at=profile.compact_at,
            max_turns=profile.max_turns,
            max_output_tokens=profile.max_output_tokens,
            retry=RetryPolicy(max_retries=profile.max_retries),
            approval_required=frozenset(profile.approval_required),
            output_retries=profile.output_retries,
            mcp_servers=tuple(server.server() for server in profile.mcp_servers),
            mcp=mcp if mcp is not None else McpClient(),
        )
    )


def mcp_client(settings: Settings) -> McpClient:
    """The process's MCP client: its listing cache as the settings bound it."""
    cache = ListingCache(
        ttl=settings.mcp_list_cache_seconds,
        max_entries=settings.mcp_list_cache_entries,
        max_bytes=settings.mcp_list_cache_bytes,
    )
    return McpClient(cache=cache, max_result_chars=settings.answer_limit)


class AgentPool:
    """The configured agents, built lazily and shared by every request."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._profiles = {
            name: with_key(profile, settings) for name, profile in settings.profiles().items()
        }
        self._agents: dict[str, Agent] = {}
        self._max_answer_chars = settings.answer_limit
        #: lists and calls MCP tools for every agent of the pool (one listing cache)
        self.mcp = mcp_client(settings)

    @property
    def names(self) -> list[str]:
        return sorted(self._profiles)

    def get(self, name: str) -> Agent:
        agent = self._agents.get(name)
        if agent is None:
            profile = self._profiles.get(name)
            if profile is None:
                raise UnknownAgent(name, self.names)
            agent = self._agents[name] = build_agent(
                profile, max_answer_chars=self._max_answer_chars, mcp=self.mcp
            )
        return agent

    def for_run(self, request: RunRequest) -> Agent:
        """The agent of ``request.agent``, once its profile allows what the run sets for
        itself (the one place both surfaces ask): else :class:`SettingNotAllowed`."""
        agent = self.get(request.agent)
        profile = self._profiles[request.agent]
        settings = request.settings
        given = {
            "model": settings.model,
            "temperature": settings.temperature,
            "max_output_tokens": settings.max_output_tokens,
            "instructions": request.instructions,
        }
        for name in RUN_SETTINGS:
            if given[name] is not None and not profile.allows(name):
                raise SettingNotAllowed(request.agent, name, profile.allowed_run_settings)
        return agent

    def unready(self) -> dict[str, str]:
        """Profiles that cannot run for want of a key, each with why (``/readyz``); an agent
        installed with :meth:`put` is ready."""
        from app.config.check import key_problem

        found = {}
        for name, profile in self._profiles.items():
            problem = None if name in self._agents else key_problem(profile, self._settings)
            if problem is not None:
                found[name] = problem
        return found

    def mcp_servers(self) -> dict[str, tuple[McpServer, ...]]:
        """Each profile's MCP servers (those without any left out)."""
        return {
            name: tuple(server.server() for server in profile.mcp_servers)
            for name, profile in self._profiles.items()
            if profile.mcp_servers
        }

    def put(self, name: str, agent: Agent) -> None:
        """Install a ready agent under a profile name (tests use fakes this way)."""
        self._agents[name] = agent
        if name not in self._profiles:
            self._profiles = {**self._profiles, name: AgentProfile()}

    async def aclose(self) -> None:
        for agent in self._agents.values():
            await agent.provider.aclose()
        self._agents.clear()
