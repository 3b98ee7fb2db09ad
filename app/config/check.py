"""The configuration checked as a whole when ``carryover serve`` starts (docs/operations.md).

:class:`~app.config.Settings` validates each value; this module answers the operator's questions
about the configuration as a whole, in the names the operator writes — environment variables
(``CARRYOVER_PORT``) and TOML keys (``agents.local.tools``), never pydantic field names:

- :func:`settings_errors`: a :class:`~pydantic.ValidationError` of :class:`Settings` as lines
  naming the variable and the value given (a secret's value is masked);
- :func:`check` → :class:`Check`: ``errors`` that stop the server (a tool import path that does
  not import, a key variable that holds a broken value), ``unready`` profiles that can only fail
  at run time (their key's variable is unset: ``/readyz`` answers 503 naming them), and
  ``warnings`` (an unknown ``CARRYOVER_*`` variable, with the closest known name);
- :func:`effective` → the effective configuration, secrets masked, each value with where it
  came from (``env``, ``toml``, ``default``), for ``carryover config``.

Known variables are read from :class:`Settings` itself, so a setting added there is known here.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import SecretStr, ValidationError

from app.agent.tools import ToolLoadError, ToolRegistry, load_tool

from .keys import MIN_API_KEY_LENGTH, ApiKeys
from .profiles import OPENAI_PROVIDERS, PROVIDER_KEY_ENV, AgentProfile, _ProfileFields
from .settings import Settings, _mask_url

ENV_PREFIX = "CARRYOVER_"
MASK = "**********"
#: variables of this project's own tooling (tests, clients), not read by the server: no warning
TOOLING_VARIABLES = frozenset(
    {
        "CARRYOVER_TEST_POSTGRES_URL",
        "CARRYOVER_REQUIRE_POSTGRES",
        "CARRYOVER_URL",
        "CARRYOVER_API_KEY",
    }
)
#: settings whose values are secrets (shown masked, never in an error)
SECRET_FIELDS = frozenset({"api_keys", "openai_api_key", "anthropic_api_key"})
#: shown per profile (``agents.NAME.FIELD``) rather than as variables
_PROFILE_ONLY = frozenset({"agents", *_ProfileFields.model_fields})


def variable_of(name: str) -> str:
    """The environment variable that sets the setting ``name``."""
    info = Settings.model_fields.get(name)
    alias = getattr(info, "validation_alias", None) if info is not None else None
    choices = getattr(alias, "choices", None)
    if choices:
        upper = [c for c in choices if isinstance(c, str) and c.isupper()]
        if upper:
            return upper[0]
    return ENV_PREFIX + name.upper()


def known_variables() -> frozenset[str]:
    """Every variable the server reads (``CARRYOVER_*`` and the provider keys)."""
    return frozenset(variable_of(name) for name in Settings.model_fields)


def shown(name: str, raw: str) -> str:
    """A value as an error or ``carryover config`` may show it."""
    if name in SECRET_FIELDS:
        return MASK if raw else ""
    if name == "database_url":
        return _mask_url(raw)
    return raw


_SNAKE = re.compile(r"\b[a-z]+(?:_[a-z]+)+\b")


def _named(message: str) -> str:
    """Field names in a message (``default_page_size``) rewritten as their variables."""
    return _SNAKE.sub(
        lambda m: variable_of(m.group(0)) if m.group(0) in Settings.model_fields else m.group(0),
        message,
    )


def settings_errors(exc: ValidationError, environ: Mapping[str, str] | None = None) -> list[str]:
    """Each error of ``Settings()`` as ``VARIABLE='value': why`` (or ``configuration: why``
    for a rule across several settings, which names them as variables)."""
    environ = os.environ if environ is None else environ
    lines = []
    for error in exc.errors():
        why = str(error["msg"]).removeprefix("Value error, ")
        loc = [str(part) for part in error["loc"]]
        if loc and loc[0] in Settings.model_fields:
            name = loc[0]
            variable = variable_of(name)
            raw = environ.get(variable)
            given = f"={shown(name, raw)!r}" if raw is not None else ""
            inner = f" ({'.'.join(loc[1:])})" if len(loc) > 1 else ""
            lines.append(f"{variable}{given}{inner}: {_named(why)}")
        else:
            lines.append(f"configuration: {_named(why) if 'config file' not in why else why}")
    return lines


# --- the whole check -------------------------------------------------------------------------


@dataclass
class Check:
    """What :func:`check` found."""

    #: stop the server: each names the variable or TOML key and the value
    errors: list[str] = field(default_factory=list)
    #: profile → why it cannot run (only at run time: its key's variable is unset)
    unready: dict[str, str] = field(default_factory=dict)
    #: worth a log line at start, nothing more
    warnings: list[str] = field(default_factory=list)


def profile_origins(settings: Settings) -> dict[str, str]:
    """Where each profile is defined, as an operator would look for it: ``CARRYOVER_*``
    variables, ``config file 'PATH': agents.NAME`` or ``CARRYOVER_AGENTS: agents.NAME``."""
    in_file: set[str] = set()
    if settings.config_file is not None:
        try:
            agents = tomllib.loads(settings.config_file.read_text(encoding="utf-8")).get("agents")
            in_file = set(agents) if isinstance(agents, dict) else set()
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            pass
    origins = {}
    for name in settings.profiles():
        if name in settings.agents:
            origins[name] = f"CARRYOVER_AGENTS: agents.{name}"
        elif name in in_file:
            origins[name] = f"config file {str(settings.config_file)!r}: agents.{name}"
        else:
            origins[name] = "environment"
    return origins


def key_variable(profile: AgentProfile) -> str | None:
    """The variable a profile's key is read from, or ``None`` when it needs no key (echo, or
    an OpenAI-compatible server given by ``base_url``, which may take none)."""
    if profile.provider == "echo":
        return None
    if profile.provider in OPENAI_PROVIDERS and profile.base_url is not None:
        return None  # as app.service.agents.build_provider: such a server may take no key
    return profile.api_key_env or PROVIDER_KEY_ENV[profile.provider]


def _key_value(profile: AgentProfile, settings: Settings, environ: Mapping[str, str]) -> str:
    """The key ``profile`` would use (as app.service.agents.with_key resolves it)."""
    if profile.api_key is not None:
        return profile.api_key.get_secret_value()
    if profile.api_key_env:
        return environ.get(profile.api_key_env, "")
    secret = settings.provider_keys().get(profile.provider)
    return secret.get_secret_value() if secret is not None else ""


def key_problem(
    profile: AgentProfile, settings: Settings, environ: Mapping[str, str] | None = None
) -> str | None:
    """Why ``profile`` cannot reach its provider for want of a key, or ``None``."""
    environ = os.environ if environ is None else environ
    variable = key_variable(profile)
    if variable is None or _key_value(profile, settings, environ).strip():
        return None
    return f"its {profile.provider} key variable {variable} is not set"


def _tool_errors(where: str, profile: AgentProfile) -> list[str]:
    errors = []
    for path in profile.tools:
        try:
            load_tool(path, timeout=profile.tool_timeout)
        except ToolLoadError as exc:
            errors.append(f"{where}={path!r}: {exc}")
        except Exception as exc:  # importing the module ran its code, and that failed
            errors.append(f"{where}={path!r}: importing it raised {type(exc).__name__}: {exc}")
    if not errors:
        try:
            ToolRegistry.from_paths(profile.tools, default_timeout=profile.tool_timeout)
        except ToolLoadError as exc:
            errors.append(f"{where}: {exc}")
    return errors


def _approval_errors(origin: str, name: str, profile: AgentProfile) -> list[str]:
    """``approval_required`` naming a tool the profile does not have: every run of it would
    be refused (a typo must not silently gate nothing), so the server does not start."""
    if not profile.approval_required:
        return []
    tools = ToolRegistry.from_paths(profile.tools, default_timeout=profile.tool_timeout).tools
    unknown = [n for n in profile.approval_required if n not in tools]
    if not unknown:
        return []
    where = (
        "CARRYOVER_APPROVAL_REQUIRED" if origin == "environment" else f"{origin}.approval_required"
    )
    return [
        f"{where}={','.join(profile.approval_required)!r}: {', '.join(map(repr, unknown))} "
        f"{'is not a server tool' if len(unknown) == 1 else 'are not server tools'} of "
        f"profile {name!r} (its tools: {', '.join(sorted(tools)) or 'none'})"
    ]


def _mcp_errors(
    origin: str, name: str, profile: AgentProfile, environ: Mapping[str, str]
) -> list[str]:
    """A profile's MCP servers whose header variables are unset (labels, URLs and timeouts
    were checked when the settings were read). Whether a server answers is checked when a run
    uses it, and reported by ``/readyz`` and ``carryover config``."""
    errors = []
    where = "CARRYOVER_MCP_SERVERS" if origin == "environment" else f"{origin}.mcp_servers"
    for i, server in enumerate(profile.mcp_servers):
        for header, variable in server.header_env.items():
            if not environ.get(variable, "").strip():
                errors.append(
                    f"{where}[{i}] (server {server.label!r} of profile {name!r}): header "
                    f"{header!r} is read from {variable}, which is not set"
                )
    return errors


def check(settings: Settings, environ: Mapping[str, str] | None = None) -> Check:
    """Resolve every profile's tools, key and MCP servers' header variables, and look for
    unknown variables."""
    environ = os.environ if environ is None else environ
    found = Check()
    origins = profile_origins(settings)
    for name, profile in sorted(settings.profiles().items()):
        origin = origins[name]
        where = "CARRYOVER_TOOLS" if origin == "environment" else f"{origin}.tools"
        tool_errors = _tool_errors(where, profile)
        found.errors += tool_errors
        found.errors += _mcp_errors(origin, name, profile, environ)
        if not tool_errors:
            found.errors += _approval_errors(origin, name, profile)
        variable = key_variable(profile)
        value = _key_value(profile, settings, environ)
        if (
            variable is not None
            and value
            and (
                value != value.strip()
                or any(c.isspace() or not c.isprintable() for c in value.strip())
            )
        ):
            found.errors.append(
                f"{variable}={MASK!r} (the key of profile {name!r}): the value holds whitespace "
                "or control characters (it is not shown: it is a secret)"
            )
        problem = key_problem(profile, settings, environ)
        if problem is not None:
            found.unready[name] = problem
    short = settings.api_keys.short_key_tenants()
    if short:
        found.errors.append(
            f"CARRYOVER_API_KEYS={MASK!r}: the key(s) of tenant(s) {', '.join(map(repr, short))} "
            f"are shorter than {MIN_API_KEY_LENGTH} characters, short enough to guess; use "
            "long random keys (such as 32 bytes from the secrets module, URL-safe) or "
            "'carryover keys create --tenant NAME'"
        )
    exporters = environ.get("OTEL_TRACES_EXPORTER", "")
    for name in (n.strip().lower() for n in exporters.split(",") if n.strip()):
        if name not in ("otlp", "console", "none"):
            found.errors.append(
                f"OTEL_TRACES_EXPORTER={exporters!r}: {name!r} is not 'otlp', 'console' or 'none'"
            )
    known = known_variables()
    for variable in sorted(environ):
        if (
            variable.startswith(ENV_PREFIX)
            and variable not in known
            and variable not in TOOLING_VARIABLES
        ):
            close = difflib.get_close_matches(variable, sorted(known), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]}?" if close else ""
            found.warnings.append(f"unknown variable {variable} is ignored{hint}")
    return found


# --- the effective configuration -------------------------------------------------------------


def _sqlite_file(url: str) -> str:
    """`` (= /absolute/path)`` for a SQLite URL with a relative path: the file the server and
    the operator commands would use when run from here."""
    prefix = "sqlite:///"
    if not url.startswith(prefix) or url[len(prefix) :].startswith("/"):
        return ""
    path = url[len(prefix) :].split("?", 1)[0]
    return f" (= {Path(path).expanduser().resolve()})" if path and path != ":memory:" else ""


def _display(name: str, value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, SecretStr):
        return MASK if value.get_secret_value() else ""
    if isinstance(value, ApiKeys):
        return (
            f"{MASK} ({len(value)} key(s) for tenants {', '.join(sorted(value.tenants))})"
            if value
            else ""
        )
    if name == "database_url":
        return _mask_url(str(value)) + _sqlite_file(str(value))
    if name == "mcp_servers":  # the headers' names only: their values may be secrets
        return "; ".join(
            f"{s.label}={s.url}"
            + (
                f" (headers: {', '.join(sorted({*s.headers, *s.header_env}))})"
                if s.headers or s.header_env
                else ""
            )
            for s in value
        )
    if isinstance(value, tuple | list):
        return ",".join(str(v) for v in value)
    return str(value)


def effective(
    settings: Settings, environ: Mapping[str, str] | None = None
) -> list[tuple[str, str, str]]:
    """``(name, value, source)`` for every setting and every profile field, secrets masked.

    ``source`` is ``env`` (a variable set it), ``toml`` (the config file's profile), ``env``
    for ``CARRYOVER_AGENTS`` profiles, or ``default``."""
    environ = os.environ if environ is None else environ
    rows = []
    for name in Settings.model_fields:
        if name in _PROFILE_ONLY:
            continue
        variable = variable_of(name)
        source = "env" if environ.get(variable, "") != "" else "default"
        rows.append((variable, _display(name, getattr(settings, name)), source))
    origins = profile_origins(settings)
    for profile_name, profile in sorted(settings.profiles().items()):
        origin = origins[profile_name]
        table: dict[str, Any] = {}
        if origin.startswith("config file") and settings.config_file is not None:
            document = tomllib.loads(settings.config_file.read_text(encoding="utf-8"))
            table = document.get("agents", {}).get(profile_name, {})
        for key in AgentProfile.model_fields:
            value = getattr(profile, key)
            if origin == "environment":
                source = "env" if environ.get(variable_of(key), "") != "" else "default"
            elif origin.startswith("config file"):
                source = "toml" if key in table else "default"
            else:
                source = "env"
            if key == "api_key":
                key_from = key_variable(profile) or profile.api_key_env
                present = bool(_key_value(profile, settings, environ).strip())
                if present:
                    value_text = f"{MASK} (from {key_from or 'the settings'})"
                else:
                    value_text = f"unset ({key_from})" if key_from else "not needed"
                rows.append(
                    (f"agents.{profile_name}.api_key", value_text, "env" if present else "default")
                )
                continue
            rows.append((f"agents.{profile_name}.{key}", _display(key, value), source))
    return rows


__all__ = [
    "Check",
    "check",
    "effective",
    "key_problem",
    "known_variables",
    "settings_errors",
    "variable_of",
]
