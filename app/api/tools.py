"""The ``tools`` of a run request (docs/tools.md): each entry a client tool (``"type":
"function"``, the default) or a remote MCP server (``"type": "mcp"``), as OpenAI's Responses API
writes them; and how the entries become the run's client tools and MCP servers.

Shared by the native ``POST …/runs`` (:class:`~app.api.schemas.RunCreate`) and ``/v1/responses``
(:mod:`app.api.v1.schemas`). An MCP entry's ``headers`` are secrets: they reach the server and
nothing else (never a log line, a record, the transcript or an event).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    WithJsonSchema,
    model_validator,
)

from app.agent.mcp import BUILTIN_LABEL, NAME, ApprovalPolicy, McpServer, McpTimeouts
from app.agent.pending import ClientTool as AgentClientTool
from app.config import Settings
from app.config.mcp import header_problem, url_problem

#: MCP servers one request may name (each is listed before the run starts)
MAX_MCP_SERVERS = 8

#: a header's name (an RFC 9110 token) and value (visible characters, spaces and tabs)
_HEADER_NAME = r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}$"
_HEADER_VALUE = r"^[\t\x20-\x7e\x80-\xff]*$"
HeaderName = Annotated[str, Field(pattern=_HEADER_NAME)]
HeaderValue = Annotated[str, Field(max_length=8192, pattern=_HEADER_VALUE)]
Headers = Annotated[
    dict[HeaderName, HeaderValue],
    Field(max_length=32),
    WithJsonSchema(
        {
            "type": "object",
            "maxProperties": 32,
            "propertyNames": {"pattern": _HEADER_NAME},
            "additionalProperties": {"type": "string", "maxLength": 8192, "pattern": _HEADER_VALUE},
        }
    ),
]


class ClientTool(BaseModel):
    """A client tool: offered to the model, executed by the application (a call pauses the
    run: ``requires_action``)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["function"] = "function"
    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    strict: bool | None = Field(
        default=None, description="Accepted (OpenAI's); the schema is sent as given"
    )

    def client_tool(self) -> AgentClientTool:
        return AgentClientTool(
            name=self.name, description=self.description, parameters=self.parameters
        )


class McpToolNames(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tool_names: list[Annotated[str, Field(pattern=NAME.pattern)]]
    read_only: Literal[False] | None = Field(
        default=None, description="Not supported: leave it out (or false)"
    )


class McpApprovalFilter(BaseModel):
    model_config = ConfigDict(extra="forbid")

    always: McpToolNames | None = None
    never: McpToolNames | None = None


class McpTool(BaseModel):
    """A remote MCP server whose tools this run may use, executed by the server (docs/tools.md,
    "Remote MCP tools")."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    type: Literal["mcp"]
    server_label: str = Field(
        pattern=NAME.pattern,
        description="The server's name in this run (not `carryover`: the agent's own tools)",
        json_schema_extra={"not": {"enum": [BUILTIN_LABEL]}},
    )
    server_url: str = Field(
        min_length=1,
        max_length=2048,
        description="Must start with an entry of CARRYOVER_MCP_ALLOWED_URLS (else 422, and no "
        "connection is made)",
    )
    allowed_tools: list[Annotated[str, Field(pattern=NAME.pattern)]] | McpToolNames | None = Field(
        default=None,
        description="The only tools the model sees and the server is called with (default: "
        "every tool it lists)",
    )
    require_approval: Literal["always", "never"] | McpApprovalFilter | None = Field(
        default=None,
        description="Which calls wait for the application's decision; left out: every call "
        '("always", OpenAI\'s default)',
    )
    headers: Headers | None = Field(
        default=None,
        description="Sent to the server with every request (authorization): never stored, "
        "logged or echoed; a queued or background run cannot carry them (422)",
    )
    server_description: str | None = Field(default=None, max_length=4096)

    @model_validator(mode="after")
    def _checked(self) -> McpTool:
        problem = url_problem(self.server_url)
        if problem is not None:
            raise ValueError(f"server_url: {problem}")
        problem = header_problem(self.headers or {})
        if problem is not None:
            raise ValueError(f"headers: {problem}")
        self.policy()  # both lists naming one tool
        return self

    def policy(self) -> ApprovalPolicy:
        value = self.require_approval
        if isinstance(value, McpApprovalFilter):  # an empty filter: the default, every call asks
            return ApprovalPolicy.parse(value.model_dump(exclude_none=True) or None)
        return ApprovalPolicy.parse(value)

    def server(self, settings: Settings) -> McpServer:
        allowed = self.allowed_tools
        names = allowed.tool_names if isinstance(allowed, McpToolNames) else allowed
        return McpServer(
            label=self.server_label,
            url=self.server_url,
            headers=dict(self.headers or {}),
            allowed_tools=frozenset(names) if names is not None else None,
            require_approval=self.policy(),
            timeouts=McpTimeouts(
                connect=settings.mcp_connect_timeout,
                list=settings.mcp_list_timeout,
                call=settings.mcp_call_timeout,
            ),
            description=self.server_description or "",
            origin="request",
        )

    def echo(self) -> dict[str, Any]:
        """The entry as an answer may show it: without its headers."""
        return self.model_dump(mode="json", exclude={"headers"}, exclude_none=True)


def _tool_type(value: Any) -> str | None:
    """The entry's kind; None for what is not an entry at all (``null``, a number, a string),
    which validation then refuses at the entry itself with a 422."""
    if isinstance(value, dict):
        kind = value.get("type", "function")
    elif isinstance(value, (ClientTool, McpTool)):
        kind = value.type
    else:
        return None
    return kind if kind in ("function", "mcp") else "function"


ToolEntry = Annotated[
    Annotated[ClientTool, Tag("function")] | Annotated[McpTool, Tag("mcp")],
    Discriminator(
        _tool_type,
        custom_error_type="tool_entry",
        custom_error_message='a tool is an object: a function tool, or an MCP server (type "mcp")',
    ),
]


def split_tools(
    entries: Sequence[ClientTool | McpTool], settings: Settings
) -> tuple[tuple[AgentClientTool, ...], tuple[int, ...], tuple[McpServer, ...], tuple[int, ...]]:
    """The client tools and MCP servers of ``tools``, each with its place in the list."""
    client: list[AgentClientTool] = []
    client_at: list[int] = []
    servers: list[McpServer] = []
    servers_at: list[int] = []
    for i, entry in enumerate(entries):
        if isinstance(entry, McpTool):
            servers.append(entry.server(settings))
            servers_at.append(i)
        else:
            client.append(entry.client_tool())
            client_at.append(i)
    return tuple(client), tuple(client_at), tuple(servers), tuple(servers_at)


__all__ = ["MAX_MCP_SERVERS", "ClientTool", "McpTool", "ToolEntry", "split_tools"]
