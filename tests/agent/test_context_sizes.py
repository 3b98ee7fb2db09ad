"""The stored size of a context (``app.agent.sizes``) and the bounds a run keeps within: the
running size equals the bytes of the context's JSON after appends, folds and whole runs, and
an agent given ``SizeBounds`` compacts near them and fails rather than pass them."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.agent.codec import dumps_context
from app.agent.compaction import choose_cut
from app.agent.messages import AnyMessage, Context, UserMessage
from app.agent.records import Input
from app.agent.sizes import (
    CONTEXT_TOO_LARGE,
    ContextSize,
    SizeBounds,
    advance_size,
    size_of,
)

from .scripted import ScriptedProvider
from .strategies import HEAVY, messages, texts
from .test_agent import echo_agent
from .test_run_failures import agent_for, history


def json_bytes(context: Context) -> int:
    return len(dumps_context(context).encode())


@HEAVY
@given(
    first=st.lists(messages(), max_size=6),
    second=st.lists(messages(), max_size=6),
    fold=st.integers(min_value=0, max_value=12),
    system_prompt=texts(),
    summary=texts(),
)
def test_a_size_kept_by_appends_and_folds_is_the_bytes_of_the_contexts_json(
    first: list[AnyMessage],
    second: list[AnyMessage],
    fold: int,
    system_prompt: str,
    summary: str,
) -> None:
    whole = [*first, *second]
    fold = min(fold, len(whole))
    kept = size_of(system_prompt, "", first).extend(second)
    context = Context(system_prompt=system_prompt, messages=tuple(whole))
    assert kept == size_of(system_prompt, "", whole)
    assert kept.bytes == json_bytes(context)
    folded = kept.drop_prefix(whole[:fold]).with_texts(system_prompt, summary)
    after = Context(system_prompt=system_prompt, summary=summary, messages=tuple(whole[fold:]))
    assert folded.bytes == json_bytes(after)
    again = ContextSize.of_total(folded.bytes, len(after.messages), system_prompt, summary)
    assert again == folded


async def test_the_running_size_equals_a_recount_after_runs_and_compactions() -> None:
    agent = echo_agent(context_window=1_500, compact_at=0.6, keep_after_compaction=0.3)
    bounds = SizeBounds(max_messages=14, max_bytes=1_000_000)
    context = Context(system_prompt="You are concise. ✓")
    size = size_of(context.system_prompt, context.summary, ())
    reasons: list[str] = []
    for i in range(24):
        if i % 7 == 6:
            result = await agent.compact(context, bounds=bounds, size=size)
        else:
            text = f"/overflow question {i} " if i % 5 == 4 else f"question {i} ü "
            prompt = UserMessage.text(text + "z" * 60)
            result = await agent.run(
                Input(context=context, prompts=(prompt,), bounds=bounds, size=size)
            )
        assert result.status == "completed", result.error
        size = advance_size(size, len(context.messages), result)
        assert size.bytes == json_bytes(result.context)
        assert len(result.context.messages) <= 14
        reasons += [c.reason for c in result.compactions]
        context = result.context
    assert {"threshold", "overflow", "manual"} <= set(reasons)


def test_a_cut_folds_at_least_what_the_size_needs() -> None:
    context = history(10)  # 20 messages
    plain = choose_cut(context, "threshold", keep_tokens=10**9)
    assert plain == 1  # the tokens alone ask for nothing more than one message
    assert choose_cut(context, "threshold", keep_tokens=10**9, min_fold=12) == 12
    # past every safe cut: as much as can be folded (keep_last keeps one message)
    assert choose_cut(context, "threshold", keep_tokens=10**9, min_fold=50) == 19


def test_the_fold_a_bound_needs_keeps_half_of_compact_at() -> None:
    context = history(10)  # 20 messages
    size = size_of(context.system_prompt, context.summary, context.messages)
    by_count = SizeBounds(max_messages=20, max_bytes=10**9, compact_at=0.8)
    assert by_count.fold_needed(context.messages, size) == 12  # 8 stay: 0.4 of 20
    by_bytes = SizeBounds(max_messages=10**6, max_bytes=size.bytes, compact_at=1.0)
    n = by_bytes.fold_needed(context.messages, size)
    rest = size.drop_prefix(context.messages[:n])
    assert rest.bytes <= size.bytes // 2 < size.drop_prefix(context.messages[: n - 1]).bytes
    assert (
        SizeBounds(max_messages=1, max_bytes=1, compact_at=0).fold_needed(context.messages, size)
        == 0
    )


async def test_a_run_that_would_pass_a_bound_fails_before_asking_the_provider() -> None:
    provider = ScriptedProvider(script=["never sent"])
    agent = agent_for(provider)
    base = history(5)  # 10 messages
    bounds = SizeBounds(max_messages=10, max_bytes=10**9, compact_at=0)  # no size compaction
    result = await agent.run(
        Input(context=base, prompts=(UserMessage.text("one more"),), bounds=bounds)
    )
    assert result.status == "failed" and result.error is not None
    assert result.error.code == CONTEXT_TOO_LARGE and "max_context_messages" in result.error.message
    assert result.context == base and not result.admitted and not provider.requests


async def test_a_run_near_a_bound_compacts_first_for_its_size() -> None:
    provider = ScriptedProvider(script=["ok"], summaries=["the gist"])
    agent = agent_for(provider, context_window=10**6)  # the tokens never ask for it
    base = history(5)  # 10 messages
    bounds = SizeBounds(max_messages=10, max_bytes=10**9)
    result = await agent.run(
        Input(context=base, prompts=(UserMessage.text("one more"),), bounds=bounds)
    )
    assert result.status == "completed", result.error
    [compaction] = result.compactions
    assert compaction.reason == "threshold" and compaction.at == 0
    assert len(result.context.messages) <= 10 * 0.45 + 1  # what stays, plus the answer
    assert result.context.summary == "the gist"
