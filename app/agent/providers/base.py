"""The seam every model provider plugs into.

A provider turns a :class:`ProviderRequest` into a stream of :class:`StreamEvent` values. It
does not assemble messages itself: :class:`app.agent.assembly.AttemptBuilder` folds the events
into an :class:`~app.agent.messages.AssistantMessage`, so a stream cut half-way still yields the
partial attempt the run record needs (contract §1, §3). Failures are raised as
:class:`ProviderError` with a ``kind`` the run loop acts on:

- ``overflow``  — the request did not fit the context window: compact, then retry;
- ``retryable`` — rate limits, overload, 5xx, a dropped connection, a malformed chunk: back
  off and try again (honouring ``retry_after``); an attempt that streamed something first is
  recorded as a failed attempt;
- ``fatal``     — authentication, invalid request, a stream that breaks the protocol, a 200
  that is not a stream: anything a retry will not fix.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from ..messages import AnyMessage, Usage
from ..structured import OutputSchema
from .wire import Encoded, WireFormat

ErrorClass = Literal["overflow", "retryable", "fatal"]


class ProviderError(Exception):
    """A failed provider request, classified for the run loop."""

    def __init__(
        self,
        kind: ErrorClass,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.kind: ErrorClass = kind
        self.message = message
        self.status = status
        self.code = code
        self.retry_after = retry_after


@dataclass(frozen=True)
class Timeouts:
    """How long a provider request may wait, in seconds: ``connect`` to open the connection,
    ``idle`` for the provider to send anything more (between two bytes of its answer)."""

    connect: float = 10.0
    idle: float = 180.0


@dataclass(frozen=True)
class ToolSpec:
    """What a provider is told about a tool."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ProviderRequest:
    """One model call. ``messages`` already hold the summary projection (contract §1).

    ``purpose`` is ``"summary"`` when the agent asks for a compaction summary; providers send
    it like any request, the offline ``echo`` provider uses it to write a deterministic summary.

    ``estimated_input_tokens``: the heuristic estimate (:mod:`app.agent.tokens`, uncalibrated)
    of the system prompt and ``messages``, when the agent kept it as a running total; a provider
    that reports an estimate rather than a count (``echo``) uses it instead of counting the
    whole request again. Real providers ignore it.

    ``encoded``: ``messages`` already encoded in the provider's wire format (``Provider.wire``),
    carried over from the run's earlier requests (:mod:`app.agent.providers.wire`); a provider
    builds its body from it instead of encoding the history again. ``None``: encode
    ``messages``.

    ``temperature`` and ``output_schema`` (:class:`~app.agent.structured.OutputSchema`): sent
    natively when set (the agent validates the answer, not the provider).
    """

    system_prompt: str
    messages: tuple[AnyMessage, ...]
    tools: tuple[ToolSpec, ...] = ()
    model: str = ""
    purpose: Literal["answer", "summary"] = "answer"
    max_output_tokens: int | None = None
    temperature: float | None = None
    output_schema: OutputSchema | None = None
    estimated_input_tokens: int | None = None
    encoded: Encoded | None = None


# --- stream events ------------------------------------------------------------------------
# ``index`` identifies a content block within the attempt; events for one index arrive in order.


@dataclass(frozen=True)
class MessageStart:
    response_id: str = ""
    model: str = ""


@dataclass(frozen=True)
class TextDelta:
    index: int
    text: str


@dataclass(frozen=True)
class ThinkingDelta:
    index: int
    thinking: str


@dataclass(frozen=True)
class SignatureDelta:
    index: int
    signature: str


@dataclass(frozen=True)
class RedactedThinking:
    index: int
    data: str


@dataclass(frozen=True)
class ToolCallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallDelta:
    index: int
    arguments: str


@dataclass(frozen=True)
class BlockStop:
    """The block at ``index`` is complete (a thinking block then has its signature)."""

    index: int


@dataclass(frozen=True)
class UsageUpdate:
    """Usage so far; later updates replace earlier ones."""

    usage: Usage


@dataclass(frozen=True)
class MessageStop:
    stop_reason: str
    provider_data: dict[str, Any] = field(default_factory=dict)


StreamEvent = (
    MessageStart
    | TextDelta
    | ThinkingDelta
    | SignatureDelta
    | RedactedThinking
    | ToolCallStart
    | ToolCallDelta
    | BlockStop
    | UsageUpdate
    | MessageStop
)


@runtime_checkable
class Provider(Protocol):
    """A model provider. ``name`` is stored on every assistant message it produces.

    A provider that sends the history over the wire may also declare ``wire``, a
    :class:`~app.agent.providers.wire.WireFormat`: the agent then keeps each message's encoding
    from run to run and hands it over as ``ProviderRequest.encoded`` (:func:`wire_of`)."""

    name: str

    def stream(self, request: ProviderRequest) -> AsyncIterator[StreamEvent]:
        """Stream one attempt. Raise :class:`ProviderError` on failure, at any point."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...


def wire_of(provider: Provider) -> WireFormat | None:
    """The wire format ``provider`` declares, if any."""
    wire: WireFormat | None = getattr(provider, "wire", None)
    return wire
