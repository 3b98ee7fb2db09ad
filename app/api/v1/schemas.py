"""Request bodies of the ``/v1`` surface, as OpenAI's reference names their fields. Unknown
fields are refused (400, naming the field); documented fields that do not apply are accepted and
ignored (docs/openai.md lists which)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from app.agent.mcp import McpServer
from app.agent.messages import MAX_TOKEN_COUNT, NO_NUL_PATTERN
from app.config import Settings

from ..tools import MAX_MCP_SERVERS
from ..tools import McpTool as McpToolBody

Metadata = Annotated[
    dict[str, str],
    Field(
        description="String keys and values, held to the service's metadata limits "
        "(`max_metadata_keys`, `max_metadata_key_chars`, `max_metadata_value_chars`; by default "
        "64 keys, keys of 64 and values of 512 characters) and without NUL characters (400)"
    ),
]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ConversationCreate(_Body):
    items: list[dict[str, Any]] | None = Field(
        default=None, max_length=20, description="Up to 20 items to start it with"
    )
    metadata: Metadata | None = None


class ConversationUpdate(_Body):
    metadata: Metadata = Field(description="Replaces the conversation's metadata (same limits)")


class ItemsCreate(_Body):
    items: list[dict[str, Any]] = Field(max_length=20, description="Up to 20 items to add")


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["function"]
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class McpTool(McpToolBody):
    """OpenAI's MCP tool (docs/openai.md, "MCP tools"): a remote server Carryover calls.
    ``authorization`` is sent as ``Authorization: Bearer …`` (a header: never stored);
    ``connector_id`` and ``tunnel_id`` are not supported (give ``server_url``)."""

    authorization: str | None = Field(default=None, max_length=8192)
    defer_loading: bool | None = None
    allowed_callers: list[str] | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_connectors(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name in ("connector_id", "tunnel_id"):
                if data.get(name) is not None:
                    raise ValueError(f"{name} is not supported here: give server_url")
            data = {k: v for k, v in data.items() if k not in ("connector_id", "tunnel_id")}
        return data

    def server(self, settings: Settings) -> McpServer:
        server = super().server(settings)
        if self.authorization:
            headers = {**server.headers, "Authorization": f"Bearer {self.authorization}"}
            server = server.model_copy(update={"headers": headers})
        return server

    def echo(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude={"headers", "authorization"}, exclude_none=True)


ResponseTool = Annotated[FunctionTool | McpTool, Field(discriminator="type")]


class ResponseCreate(_Body):
    model: str = Field(min_length=1, description="An agent profile (GET /v1/models)")
    input: str | list[dict[str, Any]] = Field(default_factory=list)
    instructions: str | None = Field(default=None, pattern=NO_NUL_PATTERN)
    conversation: str | dict[str, Any] | None = None
    previous_response_id: str | None = None
    store: bool = True
    stream: bool = False
    background: bool = False
    tools: list[ResponseTool] = Field(default_factory=list)
    metadata: Metadata | None = None
    # per-run settings, as the agent profile allows them (docs/openai.md)
    max_output_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKEN_COUNT)
    temperature: float | None = Field(default=None, ge=0, le=2)
    text: dict[str, Any] | None = Field(
        default=None, description='`format`: `{"type": "json_schema", "name", "schema", "strict"}`'
    )
    # accepted and ignored (docs/openai.md)
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: int | None = None
    top_p: float | None = None
    truncation: str | None = None
    reasoning: dict[str, Any] | None = None
    include: list[str] | None = None
    user: str | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    stream_options: dict[str, Any] | None = None
    top_logprobs: int | None = None

    #: the calls its ``mcp_approval_response`` items answered (set by the route, kept with
    #: its run: ``{"approval_request_id", "call"}`` each)
    _approved: list[dict[str, Any]] = PrivateAttr(default_factory=list)

    @property
    def approved(self) -> list[dict[str, Any]]:
        return self._approved

    @model_validator(mode="after")
    def _few_servers(self) -> ResponseCreate:
        servers = sum(1 for t in self.tools if isinstance(t, McpTool))
        if servers > MAX_MCP_SERVERS:
            raise ValueError(f"tools: at most {MAX_MCP_SERVERS} MCP servers per response")
        return self


__all__ = [
    "ConversationCreate",
    "ConversationUpdate",
    "FunctionTool",
    "ItemsCreate",
    "McpTool",
    "ResponseCreate",
]
