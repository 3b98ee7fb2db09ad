"""Request bodies of the ``/v1`` surface, as OpenAI's reference names their fields. Unknown
fields are refused (400, naming the field); documented fields that do not apply are accepted and
ignored (docs/openai.md lists which)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Metadata = dict[str, str]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ConversationCreate(_Body):
    items: list[dict[str, Any]] | None = Field(
        default=None, max_length=20, description="Up to 20 items to start it with"
    )
    metadata: Metadata | None = None


class ConversationUpdate(_Body):
    metadata: Metadata = Field(description="Replaces the conversation's metadata")


class ItemsCreate(_Body):
    items: list[dict[str, Any]] = Field(max_length=20, description="Up to 20 items to add")


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["function"]
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ResponseCreate(_Body):
    model: str = Field(min_length=1, description="An agent profile (GET /v1/models)")
    input: str | list[dict[str, Any]] = Field(default_factory=list)
    instructions: str | None = None
    conversation: str | dict[str, Any] | None = None
    previous_response_id: str | None = None
    store: bool = True
    stream: bool = False
    background: bool = False
    tools: list[FunctionTool] = Field(default_factory=list)
    metadata: Metadata | None = None
    # per-run settings, as the agent profile allows them (docs/openai.md)
    max_output_tokens: int | None = Field(default=None, ge=1)
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


__all__ = [
    "ConversationCreate",
    "ConversationUpdate",
    "FunctionTool",
    "ItemsCreate",
    "ResponseCreate",
]
