"""What a provider is sent of the context: the opaque fields another provider issued are
dropped (contract §1)."""

from __future__ import annotations

from .messages import AnyMessage, AssistantMessage, RedactedThinkingBlock, ThinkingBlock


def for_provider(messages: tuple[AnyMessage, ...], provider: str) -> tuple[AnyMessage, ...]:
    """Drop opaque fields another provider issued (contract §1); they would be refused.

    Only a message that holds something to strip (reasoning blocks, ``provider_data``) is
    copied; every other message is passed on as the same object.
    """
    out: list[AnyMessage] = []
    for message in messages:
        if (
            isinstance(message, AssistantMessage)
            and message.provider != provider
            and (
                message.provider_data
                or not message.content
                or any(isinstance(b, _OPAQUE) for b in message.content)
            )
        ):
            content = tuple(
                b
                for b in message.content
                if not isinstance(b, ThinkingBlock | RedactedThinkingBlock)
            )
            if not content:
                continue  # nothing left to replay (it only held reasoning)
            message = message.model_copy(update={"content": content, "provider_data": {}})
        out.append(message)
    return tuple(out)


_OPAQUE = (ThinkingBlock, RedactedThinkingBlock)
