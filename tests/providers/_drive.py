"""Drive a provider the way the agent does: fold its events with AttemptBuilder."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.agent.assembly import AttemptBuilder
from app.agent.messages import AssistantMessage, AttemptError
from app.agent.providers.base import Provider, ProviderError, ProviderRequest, StreamEvent


@dataclass
class Attempt:
    message: AssistantMessage
    events: list[StreamEvent] = field(default_factory=list)
    error: ProviderError | None = None


async def attempt(provider: Provider, request: ProviderRequest) -> Attempt:
    """Run one attempt; a ProviderError gives the partial (failed) message and the error."""
    builder = AttemptBuilder(provider=provider.name, model=request.model)
    events: list[StreamEvent] = []
    try:
        async for event in provider.stream(request):
            builder.feed(event)
            events.append(event)
        if not builder.complete:
            raise AssertionError("the provider's stream ended without MessageStop")
    except ProviderError as exc:
        failed = builder.failed(
            AttemptError(kind=exc.kind, message=exc.message, status=exc.status, code=exc.code)
        )
        return Attempt(failed, events, exc)
    return Attempt(builder.message(), events)


async def answer(provider: Provider, request: ProviderRequest) -> AssistantMessage:
    """A complete attempt's message (fails the test on a provider error)."""
    result = await attempt(provider, request)
    if result.error is not None:
        raise result.error
    return result.message


async def failure(provider: Provider, request: ProviderRequest) -> Attempt:
    result = await attempt(provider, request)
    assert result.error is not None, f"expected a ProviderError, got {result.message!r}"
    return result
