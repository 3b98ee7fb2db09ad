"""Compaction: fold the oldest messages into the summary (contract §2).

Pure functions; :mod:`app.agent.run` decides when to compact and asks the provider for the
summary. Cuts are made only at safe points — never between a tool call and its result, so what
stays is still a replayable history — and the summary is written by the provider from the
previous summary plus the folded messages.
"""

from __future__ import annotations

from collections.abc import Sequence

from .messages import (
    AnyMessage,
    AssistantMessage,
    Context,
    ImageBlock,
    TextBlock,
    ToolCallBlock,
    ToolResultMessage,
    UserMessage,
    text_of,
)
from .providers.base import ProviderRequest
from .records import CompactionReason
from .replay import open_batch
from .tokens import suffix_estimates

SUMMARY_PREFIX = "Summary of the earlier conversation:\n\n"

SUMMARY_SYSTEM_PROMPT = (
    "You maintain the running summary of a conversation between a user and an assistant. "
    "Write an updated summary that merges the previous summary with the new messages. Keep "
    "every fact, decision, name, number, open question and tool outcome the conversation may "
    "need later; drop pleasantries. Answer with the summary text only."
)


def project(context: Context) -> tuple[AnyMessage, ...]:
    """The messages a provider is sent: the summary as one user message, then the messages."""
    if not context.summary:
        return context.messages
    return (UserMessage.text(SUMMARY_PREFIX + context.summary), *context.messages)


def is_safe_cut(messages: Sequence[AnyMessage], index: int) -> bool:
    """Folding ``messages[:index]`` keeps every call next to its result."""
    return 0 < index <= len(messages) and (
        index == len(messages) or not isinstance(messages[index], ToolResultMessage)
    )


def choose_cut(
    context: Context,
    reason: CompactionReason,
    *,
    keep_tokens: int,
    keep_last: bool = True,
    min_fold: int = 0,
) -> int | None:
    """How many leading messages to fold, or ``None`` when nothing can be folded.

    ``threshold``: the fewest messages that bring what stays under ``keep_tokens``; when no cut
    does, fall back to keeping only the current turn. ``overflow`` and ``manual``: keep only
    the current turn (from the last user message), or, when the current turn is all there is,
    from its last safe point. With ``keep_last`` at least one message stays. An assistant
    message with pending calls (and the results after it) always stays. ``min_fold``: fold at
    least this many messages when a safe cut allows (the size bounds, :mod:`app.agent.sizes`);
    when none does, as many as can be.
    """
    messages = context.messages
    limit = len(messages) - 1 if keep_last else len(messages)
    pending = open_batch(messages)
    if pending is not None:
        limit = min(limit, pending[0])  # never fold a pending call (docs/tools.md)
    candidates = [i for i in range(1, limit + 1) if is_safe_cut(messages, i)]
    if not candidates:
        return None
    if reason == "threshold":
        # One pass: the estimate of every suffix from prefix sums (the same values as
        # estimating each messages[i:] on its own, which made this quadratic).
        kept = suffix_estimates(context.system_prompt, context.summary, messages)
        for i in candidates:
            if i >= min_fold and kept[i] <= keep_tokens:
                return i
    safe = set(candidates)
    last_user = max(
        (i for i, m in enumerate(messages) if isinstance(m, UserMessage) and i in safe),
        default=None,
    )
    cut = last_user if last_user is not None else candidates[-1]
    if cut < min_fold:
        cut = next((i for i in candidates if i >= min_fold), candidates[-1])
    return cut


def render(messages: Sequence[AnyMessage]) -> str:
    """A plain-text rendering of folded messages for the summary request."""
    lines: list[str] = []
    for message in messages:
        if isinstance(message, UserMessage):
            images = sum(isinstance(b, ImageBlock) for b in message.content)
            suffix = f" [{images} image(s)]" if images else ""
            lines.append(f"user: {text_of(message)}{suffix}")
        elif isinstance(message, AssistantMessage):
            text = text_of(message)
            if text:
                lines.append(f"assistant: {text}")
            for call in message.content:
                if isinstance(call, ToolCallBlock):
                    lines.append(f"assistant called {call.name}({call.arguments})")
        else:
            status = "failed" if message.is_error else "returned"
            body = "".join(b.text for b in message.content if isinstance(b, TextBlock))
            lines.append(f"tool {message.tool_name} {status}: {body}")
    return "\n".join(lines)


def summary_request(
    previous_summary: str, folded: Sequence[AnyMessage], *, model: str
) -> ProviderRequest:
    previous = previous_summary or "(none yet)"
    prompt = (
        f"Previous summary:\n{previous}\n\nNew messages to fold in:\n{render(folded)}\n\n"
        "Write the updated summary."
    )
    return ProviderRequest(
        system_prompt=SUMMARY_SYSTEM_PROMPT,
        messages=(UserMessage.text(prompt),),
        model=model,
        purpose="summary",
    )
