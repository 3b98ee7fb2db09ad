"""What an MCP server of a run is (docs/tools.md, "Remote MCP tools"): where it is, how to talk
to it (headers, timeouts), which of its tools the model may see, and which of those wait for
an approval.

A server comes from an agent profile (operator configuration) or from a request's ``tools``
(``{"type": "mcp", …}``); the values are the same, only their checks differ (the service checks
a request's URL against ``CARRYOVER_MCP_ALLOWED_URLS`` and the addresses it resolves to, before
any connection). ``headers`` are secrets: no ``repr`` shows them, and nothing here writes them
anywhere.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..pending import InvalidTools
from ..tools import BUILTIN_LABEL

#: what a tool name and a server label look like (what OpenAI and Anthropic accept for names)
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

#: seconds, unless a server says otherwise
DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_LIST_TIMEOUT = 30.0
DEFAULT_CALL_TIMEOUT = 60.0


class McpTimeouts(BaseModel):
    """Seconds to connect to the server, to list its tools (connection and handshake
    included), and for one tool call (connection and handshake included)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    connect: float = Field(default=DEFAULT_CONNECT_TIMEOUT, gt=0, le=600)
    list: float = Field(default=DEFAULT_LIST_TIMEOUT, gt=0, le=3600)
    call: float = Field(default=DEFAULT_CALL_TIMEOUT, gt=0, le=3600)


class ApprovalPolicy(BaseModel):
    """Which tools of a server wait for the application's decision (contract §7).

    ``mode`` applies to every tool but those named in ``except_names``, which get the other
    answer. From OpenAI's ``require_approval``: ``"always"`` / ``"never"``;
    ``{"never": {"tool_names": [...]}}`` (those never, the others always — OpenAI's default is
    to ask); ``{"always": {"tool_names": [...]}}`` (those always, the others never). Left out,
    every call asks (OpenAI's default).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Literal["always", "never"] = "always"
    except_names: frozenset[str] = frozenset()

    def requires(self, name: str) -> bool:
        asks = self.mode == "always"
        return not asks if name in self.except_names else asks

    @classmethod
    def parse(cls, value: Any, where: str = "require_approval") -> ApprovalPolicy:
        """The policy a request or a profile writes; ``ValueError`` naming ``where``."""
        if value is None:
            return cls()
        if value in ("always", "never"):
            return cls(mode=value)
        if not isinstance(value, Mapping) or not value or set(value) - {"always", "never"}:
            raise ValueError(
                f'{where}: give "always", "never", {{"never": {{"tool_names": [...]}}}} or '
                f'{{"always": {{"tool_names": [...]}}}}'
            )
        lists: dict[str, frozenset[str]] = {}
        for key, inner in value.items():
            names = inner.get("tool_names") if isinstance(inner, Mapping) else None
            extra = set(inner) - {"tool_names", "read_only"} if isinstance(inner, Mapping) else ()
            if (
                not isinstance(names, list)
                or extra
                or (isinstance(inner, Mapping) and inner.get("read_only") not in (None, False))
            ):
                raise ValueError(
                    f'{where}.{key}: give {{"tool_names": [...]}} (read_only filters are not '
                    "supported)"
                )
            lists[key] = frozenset(_names(names, f"{where}.{key}.tool_names"))
        always, never = lists.get("always", frozenset()), lists.get("never", frozenset())
        both = sorted(always & never)
        if both:
            raise ValueError(f"{where}: {both[0]!r} is listed under both always and never")
        if "never" in lists:  # the rest ask, as OpenAI's default does
            return cls(mode="always", except_names=never)
        return cls(mode="never", except_names=always)

    def render(self) -> Any:
        """The OpenAI form of this policy (what a response echoes)."""
        if not self.except_names:
            return self.mode
        key = "never" if self.mode == "always" else "always"
        return {key: {"tool_names": sorted(self.except_names)}}


def _names(values: Iterable[Any], where: str) -> list[str]:
    out = []
    for i, name in enumerate(values):
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ValueError(f"{where}[{i}]: {name!r} is not a tool name ({NAME.pattern})")
        out.append(name)
    return out


class McpServer(BaseModel):
    """One MCP server of a run.

    ``allowed_tools``: the only tools the model sees and the server is ever called with (None:
    all it lists). ``origin``: ``profile`` (operator configuration) or ``request``.
    ``check_addresses``: connect only after checking that the URL's host resolves to public
    addresses, and to the address checked (a request's server whose allowed prefix does not
    name a private address itself; app/addresses.py).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    label: str = Field(pattern=NAME.pattern)
    url: str
    headers: Mapping[str, str] = Field(default_factory=dict, repr=False)
    allowed_tools: frozenset[str] | None = None
    require_approval: ApprovalPolicy = Field(default_factory=ApprovalPolicy)
    timeouts: McpTimeouts = Field(default_factory=McpTimeouts)
    description: str = ""
    origin: Literal["profile", "request"] = "profile"
    check_addresses: bool = False

    def allows(self, name: str) -> bool:
        return self.allowed_tools is None or name in self.allowed_tools

    @property
    def identity(self) -> str:
        """What its listing is cached under: the URL and a digest of the headers (a server may
        list other tools for other credentials; the headers themselves are never kept)."""
        digest = hashlib.sha256(
            json.dumps(sorted(self.headers.items()), separators=(",", ":")).encode()
        ).hexdigest()
        return f"{self.url}#{digest}"

    def describe(self) -> dict[str, Any]:
        """The server as a run may keep and show it: everything but the headers, whose names
        alone are given."""
        return {
            "server_label": self.label,
            "server_url": self.url,
            "allowed_tools": sorted(self.allowed_tools) if self.allowed_tools is not None else None,
            "require_approval": self.require_approval.render(),
            "header_names": sorted(self.headers),
        }


def check_labels(servers: Iterable[McpServer], field: str, taken: Iterable[McpServer] = ()) -> None:
    """Labels are unique, none is ``carryover`` (the agent's own tools) nor the label of one
    of the ``taken`` servers (the agent's): :class:`~app.agent.pending.InvalidTools` naming
    ``field[i]`` otherwise."""
    agents = {s.label for s in taken}
    seen: set[str] = set()
    for i, server in enumerate(servers):
        where = f"{field}[{i}].server_label"
        if server.label == BUILTIN_LABEL:
            raise InvalidTools(where, f"{BUILTIN_LABEL!r} is the label of the agent's own tools")
        if server.label in agents:
            raise InvalidTools(where, f"{server.label!r} is already an MCP server of this agent")
        if server.label in seen:
            raise InvalidTools(where, f"two MCP servers are labelled {server.label!r}")
        seen.add(server.label)


__all__ = [
    "BUILTIN_LABEL",
    "DEFAULT_CALL_TIMEOUT",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_LIST_TIMEOUT",
    "NAME",
    "ApprovalPolicy",
    "McpServer",
    "McpTimeouts",
    "check_labels",
]
