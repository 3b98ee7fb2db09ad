"""Messages, content blocks and the Context: the continuation state of a conversation.

Every message and every block carries a ``type`` tag (contract §1). The values are immutable
pydantic models: sequences are tuples, and ``model_config`` freezes every instance, so a
Context handed to :class:`~app.agent.run.Agent` can never be changed by it. The JSON codec
lives in :mod:`app.agent.codec`; these classes only describe the shape.
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    StrictBool,
    field_validator,
)
from pydantic.config import JsonDict


def whole_number(value: Any) -> Any:
    """A JSON number with a zero fraction (``754.0``) is the integer it equals, as JSON Schema's
    ``integer`` says; any other fraction, a string or a boolean stays refused."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


#: an integer field of a JSON body: ``754`` and ``754.0``, never ``"754"``, ``754.5`` or ``true``
Integer = Annotated[int, Strict(), BeforeValidator(whole_number)]
# (An optional one with bounds puts them before the validator, so that the document says
# ``minimum``: ``Annotated[int, Strict(), Field(ge=0), BeforeValidator(whole_number)] | None``.)


class _Value(BaseModel):
    """Base of every wire value: immutable and strict about unknown fields.

    Unknown fields are refused rather than dropped: dropping a field would change what the
    next provider request sees, which is exactly the loss contract §1 forbids.
    """

    # Always dumped whole (``model_dump`` with nothing excluded), so the schema of an answer
    # marks every field required; the schema of a request keeps the defaults optional.
    model_config = ConfigDict(
        frozen=True, extra="forbid", json_schema_serialization_defaults_required=True
    )


# --- blocks -------------------------------------------------------------------------------


class TextBlock(_Value):
    type: Literal["text"] = "text"
    text: str


class Base64Source(_Value):
    type: Literal["base64"] = "base64"
    media_type: str = Field(min_length=1, max_length=255)
    data: str

    @field_validator("data")
    @classmethod
    def _valid_base64(cls, value: str) -> str:
        try:
            base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"data is not valid base64: {exc}") from None
        return value

    def decoded_size(self) -> int:
        """Size in bytes of the decoded image, computed without decoding it."""
        padding = self.data.count("=", max(0, len(self.data) - 2))
        return (len(self.data) * 3) // 4 - padding


class UrlSource(_Value):
    type: Literal["url"] = "url"
    url: str = Field(min_length=1)


ImageSource = Annotated[Base64Source | UrlSource, Field(discriminator="type")]


class ImageBlock(_Value):
    type: Literal["image"] = "image"
    source: ImageSource


class ThinkingBlock(_Value):
    """Model reasoning. ``thinking`` may be ``""`` (only the signature was streamed)."""

    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str = ""


class RedactedThinkingBlock(_Value):
    type: Literal["redacted_thinking"] = "redacted_thinking"
    data: str


class ToolCallBlock(_Value):
    """A tool call. ``arguments`` is the raw string the model produced, never re-serialized.

    ``server_label``: which server executed the call (a remote MCP server's label, or
    ``carryover`` for the agent's own server tools); absent for a client tool and for any call
    stored before it was recorded. The one field of the wire format that is left out rather
    than written as null, so every call stored without it reads and writes as it was."""

    type: Literal["tool_call"] = "tool_call"
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str
    server_label: str | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        exclude_if=lambda value: value is None,
        description="The server that executes the call: an MCP server's label, or `carryover` "
        "for the agent's own server tools; absent for client tools",
    )


UserBlock = Annotated[TextBlock | ImageBlock, Field(discriminator="type")]
ToolResultBlock = UserBlock
AssistantBlock = Annotated[
    TextBlock | ThinkingBlock | RedactedThinkingBlock | ToolCallBlock,
    Field(discriminator="type"),
]


# --- messages -----------------------------------------------------------------------------


class Usage(_Value):
    """Token usage of one request, normalized across providers.

    ``input_tokens`` counts every input token of the request, cached ones included (OpenAI's
    ``prompt_tokens``; for Anthropic the sum of ``input_tokens``, ``cache_read_input_tokens``
    and ``cache_creation_input_tokens``); the cache fields say how many of them were read from
    or written to the provider's prompt cache.
    """

    input_tokens: Integer = Field(default=0, ge=0)
    output_tokens: Integer = Field(default=0, ge=0)
    cache_read_tokens: Integer = Field(default=0, ge=0)
    cache_write_tokens: Integer = Field(default=0, ge=0)

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
        )


#: the largest integer a number in JSON keeps exactly everywhere: the bound of the versions,
#: sequence numbers and counts the API takes (a larger one cannot name anything)
MAX_SAFE_INTEGER = 2**53 - 1
#: the most tokens one request counts: a token limit's bound, and where a provider's reported
#: count is kept (saying more, it sent garbage, which no database integer holds for long)
MAX_TOKEN_COUNT = 2**31 - 1


def token_count(value: int) -> int:
    """A token count a provider reported, as usage keeps it: within 0 and
    :data:`MAX_TOKEN_COUNT`."""
    return min(max(0, value), MAX_TOKEN_COUNT)


ErrorKind = Literal["overflow", "retryable", "fatal", "aborted", "tool_batch", "internal"]


class AttemptError(_Value):
    """Why an assistant attempt (or a run) ended in error."""

    kind: ErrorKind
    message: str
    status: Integer | None = None
    code: str | None = None


StopReason = Literal[
    "end_turn",
    "tool_use",
    "max_tokens",
    "stop_sequence",
    "refusal",
    "pause_turn",
    "content_filter",
    "error",
    "aborted",
    "other",
]


class UserMessage(_Value):
    type: Literal["user"] = "user"
    content: tuple[UserBlock, ...]

    @classmethod
    def text(cls, text: str) -> UserMessage:
        """A user message with one text block (what a bare string prompt means)."""
        return cls(content=(TextBlock(text=text),))


class AssistantMessage(_Value):
    type: Literal["assistant"] = "assistant"
    content: tuple[AssistantBlock, ...] = ()
    provider: str = ""
    model: str = ""
    response_id: str = ""
    stop_reason: StopReason = "end_turn"
    usage: Usage = Usage()
    provider_data: dict[str, Any] = Field(default_factory=dict)
    error: AttemptError | None = None

    @property
    def tool_calls(self) -> tuple[ToolCallBlock, ...]:
        return tuple(b for b in self.content if isinstance(b, ToolCallBlock))

    @property
    def replayable(self) -> bool:
        """An attempt that ended in error or abort is never part of the continuation state."""
        return self.stop_reason not in ("error", "aborted") and self.error is None


class ToolResultMessage(_Value):
    type: Literal["tool_result"] = "tool_result"
    tool_call_id: str = Field(min_length=1)
    tool_name: str = Field(min_length=1)
    content: tuple[ToolResultBlock, ...]
    is_error: StrictBool = False


Message = Annotated[UserMessage | AssistantMessage | ToolResultMessage, Field(discriminator="type")]
AnyMessage = UserMessage | AssistantMessage | ToolResultMessage


#: A string stored in a text column never holds NUL (a PostgreSQL text column cannot): the
#: system prompt, the summary, a metadata value, a run's instructions. The API refuses one
#: (422) on both engines alike and a run's summary drops it.
NO_NUL_PATTERN = "^[^\\u0000]*$"
#: said in the schema of the context's prompt and summary, not checked here
_NO_NUL: JsonDict = {"pattern": NO_NUL_PATTERN}


class Context(_Value):
    """The whole continuation state: nothing else is needed to continue a conversation."""

    system_prompt: str = Field(default="", json_schema_extra=_NO_NUL)
    summary: str = Field(default="", json_schema_extra=_NO_NUL)
    messages: tuple[Message, ...] = ()


def text_of(message: AnyMessage) -> str:
    """The concatenated text blocks of a message (images and tool calls left out)."""
    return "".join(b.text for b in message.content if isinstance(b, TextBlock))
