"""Hand-built agent values for store tests: real Context, Result and Compaction objects."""

from __future__ import annotations

from collections.abc import Sequence

from app.agent.messages import (
    AnyMessage,
    AssistantMessage,
    AttemptError,
    Base64Source,
    Context,
    ErrorKind,
    ImageBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
    ToolResultMessage,
    UrlSource,
    Usage,
    UserMessage,
)
from app.agent.records import Compaction, CompactionReason, Result, RunStatus

user = UserMessage.text


def assistant(text: str) -> AssistantMessage:
    return AssistantMessage(content=(TextBlock(text=text),), provider="echo", model="echo")


def failed_attempt(kind: ErrorKind = "fatal") -> AssistantMessage:
    return AssistantMessage(
        content=(TextBlock(text="partial"),),
        stop_reason="error",
        error=AttemptError(kind=kind, message="it broke"),
    )


def exchange(i: int) -> list[AnyMessage]:
    return [user(f"question {i}"), assistant(f"answer {i}")]


def conversation(n_messages: int, *, summary: str = "", system_prompt: str = "Brief.") -> Context:
    messages: list[AnyMessage] = []
    for i in range(n_messages // 2):
        messages += exchange(i)
    if n_messages % 2:
        messages.append(user("dangling"))
    return Context(system_prompt=system_prompt, summary=summary, messages=tuple(messages))


def compaction(
    folded: Sequence[AnyMessage],
    summary: str,
    *,
    previous: str = "",
    reason: CompactionReason = "threshold",
    at: int | None = None,
) -> Compaction:
    return Compaction(
        reason=reason,
        folded=tuple(folded),
        previous_summary=previous,
        summary=summary,
        tokens_before=1000,
        tokens_after=100,
        usage=Usage(input_tokens=900, output_tokens=50),
        at=at,
    )


def completed_run(base: Context, prompt: str = "next?", answer: str = "sure") -> Result:
    """A plain run: one admitted prompt, one completed attempt."""
    p, a = user(prompt), assistant(answer)
    return Result(
        status="completed",
        context=base.model_copy(update={"messages": (*base.messages, p, a)}),
        new_messages=(p, a),
        final=a,
        usage=Usage(input_tokens=10, output_tokens=5),
        admitted=True,
    )


def result(
    status: RunStatus,
    context: Context,
    new_messages: Sequence[AnyMessage] = (),
    compactions: Sequence[Compaction] = (),
    *,
    error: AttemptError | None = None,
) -> Result:
    attempts = [m for m in new_messages if isinstance(m, AssistantMessage)]
    return Result(
        status=status,
        context=context,
        new_messages=tuple(new_messages),
        final=attempts[-1] if attempts else None,
        compactions=tuple(compactions),
        error=error,
        admitted=any(isinstance(m, UserMessage) for m in new_messages),
    )


def rich_context() -> Context:
    """Every kind of block and field the codec must keep, including empty strings."""
    call = ToolCallBlock(id="call_1", name="lookup", arguments='{"q": "nvim", ')  # not JSON
    return Context(
        system_prompt="You are concise.",
        summary="Earlier: the user asked about editors. ünïcödé ✓",
        messages=(
            UserMessage(
                content=(
                    TextBlock(text="What is in these?"),
                    ImageBlock(source=Base64Source(media_type="image/png", data="iVBORw0KGgo=")),
                    ImageBlock(source=UrlSource(url="https://example.com/a.png")),
                )
            ),
            AssistantMessage(
                content=(
                    ThinkingBlock(thinking="", signature="sig-only"),
                    RedactedThinkingBlock(data="opaque=="),
                    TextBlock(text=""),
                    call,
                ),
                provider="anthropic",
                model="claude",
                response_id="msg_1",
                stop_reason="tool_use",
                usage=Usage(input_tokens=3, output_tokens=4, cache_read_tokens=1),
                provider_data={"reasoning": [{"id": "rs_1", "encrypted_content": "xyz"}]},
            ),
            ToolResultMessage(
                tool_call_id="call_1",
                tool_name="lookup",
                content=(
                    TextBlock(text="a text editor"),
                    ImageBlock(source=UrlSource(url="https://example.com/b.png")),
                ),
                is_error=False,
            ),
            assistant("It is an editor."),
        ),
    )
