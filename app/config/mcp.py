"""MCP servers in the configuration (docs/tools.md, "Remote MCP tools"): a profile's
``mcp_servers`` (:class:`McpServerConfig`) and the URL prefixes a request's own servers must
start with (``CARRYOVER_MCP_ALLOWED_URLS``, :func:`allowed_prefixes`).

A profile's server is operator configuration: its URL needs no allowed prefix, and may name a
private address. Its header values that are secrets come from environment variables
(``header_env``: header name → variable name), never from the TOML file, like provider keys;
``headers`` holds plain values (a ``User-Agent``, a tenant id) and, given as a variable
(``CARRYOVER_MCP_SERVERS``), anything. Everything here is checked offline at start (names, URL
syntax, timeouts); whether a server answers is checked when a run uses it, and reported by
``/readyz`` and ``carryover config``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.agent.mcp import BUILTIN_LABEL, NAME, ApprovalPolicy, McpServer, McpTimeouts
from app.agent.mcp.servers import (
    DEFAULT_CALL_TIMEOUT,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_LIST_TIMEOUT,
)

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: a header name (RFC 9110 token)
_HEADER = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


def url_problem(url: str) -> str | None:
    """Why ``url`` is not an http(s) URL with a host (None when it is one)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - a bad port raises here
    except ValueError as exc:
        return f"{url!r} is not a URL ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{url!r} is not an http:// or https:// URL with a host"
    if any(c.isspace() for c in url):
        return f"{url!r} holds whitespace"
    return None


def header_problem(headers: Mapping[str, str]) -> str | None:
    """Why ``headers`` cannot be sent (a bad name, a value with a line break), or None. The
    values are never named (they may be secrets)."""
    for name, value in headers.items():
        if not _HEADER.fullmatch(name):
            return f"{name!r} is not a header name"
        if any(c in value for c in "\r\n\x00"):
            return f"the value of header {name!r} holds a line break or NUL"
    return None


class McpServerConfig(BaseModel):
    """One MCP server of a profile (a ``[[agents.NAME.mcp_servers]]`` table)."""

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    label: str = Field(pattern=NAME.pattern, description="The server's name in runs and logs")
    url: str
    headers: dict[str, str] = Field(default_factory=dict, repr=False)
    header_env: dict[str, str] = Field(
        default_factory=dict, description="Header name → the variable its value is read from"
    )
    allowed_tools: tuple[str, ...] | None = None
    require_approval: Any = None
    description: str = ""
    connect_timeout: float = Field(default=DEFAULT_CONNECT_TIMEOUT, gt=0, le=600)
    list_timeout: float = Field(default=DEFAULT_LIST_TIMEOUT, gt=0, le=3600)
    call_timeout: float = Field(default=DEFAULT_CALL_TIMEOUT, gt=0, le=3600)

    @field_validator("label")
    @classmethod
    def _not_builtin(cls, value: str) -> str:
        if value == BUILTIN_LABEL:
            raise ValueError(f"{BUILTIN_LABEL!r} is the label of the agent's own tools")
        return value

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        problem = url_problem(value.strip())
        if problem is not None:
            raise ValueError(problem)
        return value.strip()

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str]) -> dict[str, str]:
        problem = header_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("header_env")
    @classmethod
    def _header_env(cls, value: dict[str, str]) -> dict[str, str]:
        problem = header_problem(dict.fromkeys(value, ""))
        if problem is not None:
            raise ValueError(problem)
        for name, variable in value.items():
            if not _ENV_NAME.fullmatch(variable):
                raise ValueError(f"header {name!r}: {variable!r} is not a variable name")
        return value

    @field_validator("allowed_tools")
    @classmethod
    def _allowed(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for tool in value or ():
            if not NAME.fullmatch(tool):
                raise ValueError(f"allowed_tools: {tool!r} is not a tool name")
        return value

    @field_validator("require_approval")
    @classmethod
    def _approval(cls, value: Any) -> Any:
        ApprovalPolicy.parse(value)  # ValueError names what is wrong
        return value

    @model_validator(mode="after")
    def _one_source_per_header(self) -> McpServerConfig:
        both = sorted({h.lower() for h in self.headers} & {h.lower() for h in self.header_env})
        if both:
            raise ValueError(f"header {both[0]!r} is given in headers and in header_env")
        return self

    def missing_variables(self, environ: Mapping[str, str] | None = None) -> list[str]:
        """The ``header_env`` variables that are unset (or empty)."""
        environ = os.environ if environ is None else environ
        return [v for v in self.header_env.values() if not environ.get(v, "").strip()]

    def server(self, environ: Mapping[str, str] | None = None) -> McpServer:
        """The agent's value, its ``header_env`` read now."""
        environ = os.environ if environ is None else environ
        headers = dict(self.headers)
        headers.update((h, environ.get(v, "")) for h, v in self.header_env.items())
        return McpServer(
            label=self.label,
            url=self.url,
            headers=headers,
            allowed_tools=frozenset(self.allowed_tools) if self.allowed_tools is not None else None,
            require_approval=ApprovalPolicy.parse(self.require_approval),
            timeouts=McpTimeouts(
                connect=self.connect_timeout, list=self.list_timeout, call=self.call_timeout
            ),
            description=self.description,
            origin="profile",
        )


def unique_labels(servers: Iterable[McpServerConfig]) -> None:
    seen: set[str] = set()
    for server in servers:
        if server.label in seen:
            raise ValueError(f"mcp_servers: two servers are labelled {server.label!r}")
        seen.add(server.label)


def allowed_prefixes(values: Iterable[str]) -> tuple[str, ...]:
    """``CARRYOVER_MCP_ALLOWED_URLS`` entries, checked: each an http(s) URL with a host (a
    prefix: a request's ``server_url`` must start with one)."""
    out = []
    for value in values:
        problem = url_problem(value)
        if problem is not None:
            raise ValueError(problem)
        out.append(value)
    return tuple(out)


__all__ = [
    "McpServerConfig",
    "allowed_prefixes",
    "header_problem",
    "unique_labels",
    "url_problem",
]
