"""Settings: environment parsing, TOML agent profiles, validators, secrets kept out of reprs."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from app.config import (
    DEFAULT_TOOLS,
    AgentProfile,
    ApiKeys,
    Settings,
    get_settings,
    is_loopback,
)

MiB = 1024 * 1024


def _error(**values: object) -> str:
    with pytest.raises(ValidationError) as info:
        Settings(**values)  # type: ignore[arg-type]
    return str(info.value)


# --- defaults and environment ----------------------------------------------------------------


def test_defaults_run_offline_on_loopback_with_sqlite() -> None:
    settings = Settings()
    assert (settings.host, settings.port, settings.workers) == ("127.0.0.1", 8000, 1)
    assert settings.database_url == "sqlite:///./carryover.db"
    assert settings.provider == "echo"
    assert settings.model == "echo"
    assert settings.context_window == 128_000
    assert settings.compact_at == 0.8
    assert settings.tools == DEFAULT_TOOLS
    assert settings.config_file is None
    assert not settings.api_keys
    assert settings.allow_unauthenticated_public is False
    assert settings.cors_origins == ()


def test_service_limits_have_production_defaults() -> None:
    settings = Settings()
    assert settings.lease_seconds == 5
    assert settings.busy_wait_seconds == 30
    assert settings.idempotency_ttl_seconds == 86_400
    assert settings.max_body_bytes == 8 * MiB
    assert settings.max_image_bytes == 5 * MiB
    assert settings.max_prompts_per_run == 32
    assert settings.max_text_chars == 200_000
    assert settings.max_context_messages == 10_000
    assert (settings.default_page_size, settings.max_page_size) == (50, 200)


def test_environment_uses_the_carryover_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CARRYOVER_DATABASE_URL", "postgresql://u@db:5432/carryover")
    monkeypatch.setenv("CARRYOVER_PROVIDER", "OpenAI")
    monkeypatch.setenv("CARRYOVER_MODEL", "gpt-test")
    monkeypatch.setenv("CARRYOVER_BASE_URL", "http://127.0.0.1:11434/v1")
    monkeypatch.setenv("CARRYOVER_CONTEXT_WINDOW", "32000")
    monkeypatch.setenv("CARRYOVER_COMPACT_AT", "0.5")
    monkeypatch.setenv("CARRYOVER_PORT", "9000")
    monkeypatch.setenv("CARRYOVER_MAX_TURNS", "7")
    monkeypatch.setenv("CARRYOVER_TOOL_TIMEOUT", "2.5")
    monkeypatch.setenv("CARRYOVER_LEASE_SECONDS", "2")
    monkeypatch.setenv("CARRYOVER_ALLOW_UNAUTHENTICATED_PUBLIC", "true")
    settings = Settings()
    assert settings.database_url == "postgresql://u@db:5432/carryover"
    assert settings.provider == "openai"
    assert settings.model == "gpt-test"
    assert settings.base_url == "http://127.0.0.1:11434/v1"
    assert settings.context_window == 32_000
    assert settings.compact_at == 0.5
    assert settings.port == 9000
    assert settings.max_turns == 7
    assert settings.tool_timeout == 2.5
    assert settings.lease_seconds == 2
    assert settings.allow_unauthenticated_public is True


def test_keyword_arguments_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CARRYOVER_PORT", "9000")
    assert Settings(port=9100).port == 9100


def test_empty_variables_mean_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CARRYOVER_MODEL", "")
    monkeypatch.setenv("CARRYOVER_CONTEXT_WINDOW", "")
    monkeypatch.setenv("OPENAI_API_KEY", "")
    settings = Settings()
    assert settings.model == "echo"
    assert settings.context_window == 128_000
    assert settings.openai_api_key is None


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("a.b:c", ("a.b:c",)),
        (" a.b:c , d:e ", ("a.b:c", "d:e")),
        ('["a.b:c", "pkg.mod:obj.attr"]', ("a.b:c", "pkg.mod:obj.attr")),
        ("[]", ()),
    ],
)
def test_tools_are_comma_separated_or_json(
    monkeypatch: pytest.MonkeyPatch, raw: str, expected: tuple[str, ...]
) -> None:
    monkeypatch.setenv("CARRYOVER_TOOLS", raw)
    assert Settings().tools == expected


def test_cors_origins_are_comma_separated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CARRYOVER_CORS_ORIGINS", "https://app.example, http://localhost:3000")
    assert Settings().cors_origins == ("https://app.example", "http://localhost:3000")


def test_provider_keys_come_from_their_ecosystem_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-secret")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-secret")
    monkeypatch.setenv("CARRYOVER_OPENAI_API_KEY", "ignored-prefixed")
    settings = Settings()
    assert settings.openai_api_key == SecretStr("sk-openai-secret")
    assert settings.anthropic_api_key == SecretStr("sk-ant-secret")
    assert Settings(openai_api_key="given").openai_api_key == SecretStr("given")


def test_api_keys_parse_into_tenants(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CARRYOVER_API_KEYS", "acme:key-one, acme:key-two,globex:key:with:colons")
    keys = Settings().api_keys
    assert len(keys) == 3
    assert keys.tenants == {"acme", "globex"}
    assert keys.tenant_for("key-one") == "acme"
    assert keys.tenant_for("key-two") == "acme"
    assert keys.tenant_for("key:with:colons") == "globex"
    assert keys.tenant_for("key-three") is None
    assert keys.tenant_for("") is None


def test_provider_sets_the_default_window() -> None:
    assert Settings(provider="anthropic", model="m").context_window == 200_000
    assert Settings(provider="openai", model="m").context_window == 128_000
    assert Settings(provider="anthropic", model="m", context_window=1000).context_window == 1000


def test_get_settings_is_cached_until_cleared(monkeypatch: pytest.MonkeyPatch) -> None:
    first = get_settings()
    assert get_settings() is first
    monkeypatch.setenv("CARRYOVER_PORT", "9001")
    assert get_settings().port == 8000
    get_settings.cache_clear()
    assert get_settings().port == 9001


# --- validators ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -0.1, 1.01, 2])
def test_compact_at_must_be_a_share_of_the_window(value: float) -> None:
    assert "must be in (0, 1]" in _error(compact_at=value)


def test_compact_at_one_is_allowed() -> None:
    assert Settings(compact_at=1).compact_at == 1


@pytest.mark.parametrize("value", [0, -5])
def test_context_window_must_be_positive(value: int) -> None:
    assert "context_window must be a positive number of tokens" in _error(context_window=value)


def test_unknown_provider_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CARRYOVER_PROVIDER", "gemini")
    with pytest.raises(ValidationError, match="unknown provider 'gemini'"):
        Settings()


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_real_providers_need_a_model(provider: str) -> None:
    assert f"a model is required when the provider is '{provider}'" in _error(provider=provider)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"tools": ["no_colon"]}, "must be an import path"),
        ({"tools": ["a:b", "a:b"]}, "a tool is listed twice"),
        ({"base_url": "ftp://x"}, "base_url must be an http:// or https:// URL"),
        ({"thinking_budget": 4000, "max_output_tokens": 4000}, "thinking_budget must be smaller"),
        ({"max_turns": 0}, "max_turns"),
        ({"tool_timeout": 0}, "tool_timeout"),
        ({"port": 70000}, "port"),
        ({"workers": 0}, "workers"),
        ({"database_url": "mysql://x/y"}, "database_url must be a sqlite:/// or postgresql://"),
        ({"default_page_size": 500}, "default_page_size (500) must not exceed max_page_size"),
        ({"max_body_bytes": 4 * MiB}, "does not fit in max_body_bytes"),
        ({"cors_origins": ["https://x.example/"]}, "must be '*' or scheme://host[:port]"),
        ({"api_key_env": "not a name"}, "api_key_env must name an environment variable"),
        ({"agents": {"bad name": {}}}, "profile name 'bad name'"),
        ({"log_level": "chatty"}, "log_level"),
    ],
)
def test_nonsense_is_refused_with_a_clear_message(values: dict[str, object], message: str) -> None:
    assert message in _error(**values)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("acme", "entry 1 must look like 'tenant:key'"),
        ("acme:k1,:k2", "entry 2 must look like 'tenant:key'"),
        ("acme:", "entry 1 must look like 'tenant:key'"),
        ("bad tenant:k1", "tenant 'bad tenant'"),
        ("acme:a b", "the key contains whitespace"),
        ("acme:same,globex:same", "the same key is bound to two tenants"),
    ],
)
def test_malformed_api_keys_are_refused_without_echoing_them(raw: str, message: str) -> None:
    text = _error(api_keys=raw)
    assert message in text
    assert "k1" not in text and "k2" not in text and "same," not in text


# --- secrets ---------------------------------------------------------------------------------


def test_secrets_never_appear_in_reprs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-SECRET")
    monkeypatch.setenv("CARRYOVER_API_KEYS", "acme:tenant-SECRET")
    monkeypatch.setenv("CARRYOVER_DATABASE_URL", "postgresql://carryover:db-SECRET@db/carryover")
    settings = Settings(provider="openai", model="m")
    for text in (
        repr(settings),
        str(settings),
        settings.model_dump_json(),
        repr(settings.profiles()),
        repr(settings.api_keys),
        settings.database_url_display,
    ):
        assert "SECRET" not in text, text
    assert "postgresql://carryover:***@db/carryover" in repr(settings)
    assert set(settings.secret_values()) == {"sk-openai-SECRET", "tenant-SECRET", "db-SECRET"}


def test_a_validation_error_does_not_print_the_input(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-SECRET")
    text = _error(provider="openai")
    assert "SECRET" not in text


# --- profiles --------------------------------------------------------------------------------


def test_the_environment_describes_the_default_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant")
    settings = Settings(provider="anthropic", model="claude-x", compact_at=0.6, max_retries=1)
    profiles = settings.profiles()
    assert list(profiles) == ["default"]
    default = settings.profile()
    assert isinstance(default, AgentProfile)
    assert (default.provider, default.model, default.compact_at) == ("anthropic", "claude-x", 0.6)
    assert default.context_window == 200_000
    assert default.max_retries == 1
    assert default.api_key == SecretStr("sk-ant")


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "carryover.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_toml_file_adds_named_profiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(
        tmp_path,
        """
        [agents.claude]
        provider = "anthropic"
        model = "claude-x"
        thinking_budget = 2048
        max_output_tokens = 8192
        tools = []

        [agents.local]
        provider = "openai"
        model = "llama3.1"
        base_url = "http://127.0.0.1:11434/v1"
        api_key_env = "OLLAMA_KEY"
        context_window = 8192
        compact_at = 0.7
        """,
    )
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant")
    monkeypatch.setenv("OLLAMA_KEY", "ollama-key")
    monkeypatch.setenv("CARRYOVER_CONFIG_FILE", str(path))
    profiles = Settings().profiles()
    assert sorted(profiles) == ["claude", "default", "local"]
    assert profiles["default"].provider == "echo"
    claude = profiles["claude"]
    assert (claude.context_window, claude.thinking_budget, claude.tools) == (200_000, 2048, ())
    assert claude.api_key == SecretStr("sk-ant")
    local = profiles["local"]
    assert (local.context_window, local.compact_at) == (8192, 0.7)
    assert local.api_key == SecretStr("ollama-key")
    assert local.tools == DEFAULT_TOOLS


def test_the_toml_file_may_replace_the_default_profile(tmp_path: Path) -> None:
    path = _write(tmp_path, '[agents.default]\nprovider = "openai"\nmodel = "gpt-x"\n')
    settings = Settings(config_file=path)
    assert settings.profile("default").model == "gpt-x"
    assert settings.provider == "echo"  # the environment's own fields are untouched


def test_profiles_given_directly_win(tmp_path: Path) -> None:
    path = _write(tmp_path, '[agents.x]\nmodel = "from-file"\nprovider = "openai"\n')
    settings = Settings(config_file=path, agents={"x": AgentProfile(provider="echo")})
    assert settings.profile("x").provider == "echo"


def test_unknown_profile_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match=r"no agent profile 'nope'; known: \['default'\]"):
        Settings().profile("nope")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[agents.claude]\nprovider = "anthropic"\n', "agents.claude: a model is required"),
        ("[agents.x]\ncompact_at = 1.5\n", "agents.x.compact_at: compact_at is a share"),
        ("[agents.x]\ncontext_window = 0\n", "agents.x.context_window: context_window must be"),
        ('[agents.x]\nprovider = "nope"\n', "agents.x.provider: unknown provider 'nope'"),
        ("[agents.x]\ntemperature = 1\n", "agents.x.temperature: Extra inputs"),
        ('[agents.x]\napi_key = "sk"\n', "keys do not belong in the file"),
        ("[agents]\nx = 1\n", "agents.x must be a table"),
        ("[server]\nport = 1\n", "unknown top-level key(s) ['server']"),
        ("[agents.x\n", "is not valid TOML"),
        ('["agents"."bad name"]\n', "profile names are"),
    ],
)
def test_a_bad_toml_file_is_refused_with_its_location(
    tmp_path: Path, text: str, message: str
) -> None:
    assert message in _error(config_file=_write(tmp_path, text))


def test_a_missing_toml_file_is_refused(tmp_path: Path) -> None:
    assert "does not exist" in _error(config_file=tmp_path / "nope.toml")


# --- exposure --------------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"])
def test_loopback_hosts(host: str) -> None:
    assert is_loopback(host)
    assert Settings(host=host).exposure_problem() is None


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.10", "example.com"])
def test_public_hosts_need_keys_or_the_explicit_flag(host: str) -> None:
    assert not is_loopback(host)
    problem = Settings(host=host).exposure_problem()
    assert problem is not None and "CARRYOVER_API_KEYS" in problem
    assert Settings(host=host, api_keys="acme:k").exposure_problem() is None
    assert Settings(host=host, allow_unauthenticated_public=True).exposure_problem() is None


def test_api_keys_compare_and_hash_by_value() -> None:
    assert ApiKeys.parse("a:k") == ApiKeys({"k": "a"})
    assert hash(ApiKeys.parse("a:k")) == hash(ApiKeys({"k": "a"}))
    assert ApiKeys.parse(["a:k", "b:l"]).tenants == {"a", "b"}
    assert repr(ApiKeys.parse("a:k")) == "ApiKeys(tenants=['a'], keys=1)"
