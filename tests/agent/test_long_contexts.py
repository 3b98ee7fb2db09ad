"""Long contexts: compaction in one pass and off the event loop, the running token tally,
``Compaction.at``, and ``for_provider`` copying only what it strips (issue 10)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.agent import compaction as compaction_module
from app.agent import compaction_stage, offload, opaque, tokens
from app.agent import run as run_module
from app.agent.compaction import choose_cut, is_safe_cut
from app.agent.messages import (
    AnyMessage,
    AssistantMessage,
    Context,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from app.agent.records import Compaction, CompactionReason, Input, Result
from app.agent.replay import open_batch
from app.agent.run import for_provider
from app.agent.tokens import (
    TokenTally,
    advance,
    estimate,
    estimate_message,
    estimate_with,
    heuristic_text_tokens,
    heuristic_tokens,
    suffix_estimates,
    tally_of,
)

from .scripted import ScriptedProvider
from .strategies import HEAVY, contexts, messages, replayable_contexts
from .test_agent import echo_agent
from .test_run_failures import agent_for, history

# --- the former algorithm, kept as the oracle -----------------------------------------------


def old_calibration(system_prompt: str, summary: str, messages: Sequence[AnyMessage]) -> float:
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        if isinstance(message, AssistantMessage) and message.usage.input_tokens > 0:
            estimated = (
                heuristic_text_tokens(system_prompt)
                + heuristic_text_tokens(summary)
                + sum(heuristic_tokens(m) for m in messages[:i])
            )
            reported = message.usage.input_tokens
            if estimated <= 0:
                return 1.0
            return min(tokens.MAX_RATIO, max(tokens.MIN_RATIO, reported / estimated))
    return 1.0


def old_estimate(system_prompt: str, summary: str, messages: Sequence[AnyMessage]) -> int:
    raw = (
        heuristic_text_tokens(system_prompt)
        + heuristic_text_tokens(summary)
        + sum(heuristic_tokens(m) for m in messages)
    )
    return int(raw * old_calibration(system_prompt, summary, messages))


def old_choose_cut(
    context: Context, reason: CompactionReason, *, keep_tokens: int, keep_last: bool = True
) -> int | None:
    messages = context.messages
    limit = len(messages) - 1 if keep_last else len(messages)
    # The one rule added since (client tools, docs/tools.md): a pending call is never folded.
    pending = open_batch(messages)
    if pending is not None:
        limit = min(limit, pending[0])
    candidates = [i for i in range(1, limit + 1) if is_safe_cut(messages, i)]
    if not candidates:
        return None
    if reason == "threshold":
        for i in candidates:
            if old_estimate(context.system_prompt, context.summary, messages[i:]) <= keep_tokens:
                return i
    safe = set(candidates)
    last_user = max(
        (i for i, m in enumerate(messages) if isinstance(m, UserMessage) and i in safe),
        default=None,
    )
    return last_user if last_user is not None else candidates[-1]


any_context = st.one_of(contexts(max_messages=24), replayable_contexts(max_turns=6))


@HEAVY
@given(
    context=any_context,
    reason=st.sampled_from(["threshold", "overflow", "manual"]),
    keep_last=st.booleans(),
    keep=st.floats(min_value=0.0, max_value=1.2),
)
def test_choose_cut_picks_the_same_cut_as_the_former_quadratic_algorithm(
    context: Context, reason: CompactionReason, keep_last: bool, keep: float
) -> None:
    # keep_tokens spans 0 … a bit more than the whole context, so every cut gets its chance.
    keep_tokens = int(keep * old_estimate(context.system_prompt, context.summary, context.messages))
    assert choose_cut(
        context, reason, keep_tokens=keep_tokens, keep_last=keep_last
    ) == old_choose_cut(context, reason, keep_tokens=keep_tokens, keep_last=keep_last)


@HEAVY
@given(context=any_context)
def test_one_pass_estimates_equal_the_former_ones(context: Context) -> None:
    sp, summary, msgs = context.system_prompt, context.summary, context.messages
    assert estimate(sp, summary, msgs) == old_estimate(sp, summary, msgs)
    assert suffix_estimates(sp, summary, msgs) == [
        old_estimate(sp, summary, msgs[i:]) for i in range(len(msgs) + 1)
    ]


def test_the_existing_cut_cases_are_unchanged() -> None:
    """The hand-made cases of the agent tests, old and new side by side."""
    base = history(10)
    for keep_tokens in range(0, 3000, 37):
        for reason in ("threshold", "overflow", "manual"):
            for keep_last in (True, False):
                assert choose_cut(
                    base, reason, keep_tokens=keep_tokens, keep_last=keep_last
                ) == old_choose_cut(base, reason, keep_tokens=keep_tokens, keep_last=keep_last)


# --- the running tally ----------------------------------------------------------------------


@HEAVY
@given(
    first=st.lists(messages(), max_size=12),
    second=st.lists(messages(), max_size=12),
    fold=st.integers(min_value=0, max_value=24),
    system_prompt=st.text(max_size=50),
    summary=st.text(max_size=50),
)
def test_a_tally_kept_by_appends_and_folds_equals_a_recount(
    first: list[AnyMessage],
    second: list[AnyMessage],
    fold: int,
    system_prompt: str,
    summary: str,
) -> None:
    whole = [*first, *second]
    fold = min(fold, len(whole))
    kept = tally_of(first).extend(second)
    assert kept == tally_of(whole)
    assert kept.messages == sum(estimate_message(m) for m in whole)
    assert estimate_with(kept, system_prompt, summary) == estimate(system_prompt, summary, whole)
    dropped = kept.drop_prefix(whole[:fold])
    assert dropped == tally_of(whole[fold:])
    assert estimate_with(dropped, system_prompt, summary) == estimate(
        system_prompt, summary, whole[fold:]
    )


async def test_the_incremental_tally_equals_a_full_recount_after_runs_and_compactions() -> None:
    """Runs (some compacting before admission, some overflowing) and manual compactions, each
    started from the kept tally; after each one, advance() equals a recount of its context."""
    agent = echo_agent(context_window=1_500, compact_at=0.6, keep_after_compaction=0.3)
    context = Context(system_prompt="You are concise.")
    tally = tally_of(context.messages)
    reasons: list[str] = []
    for i in range(24):
        if i % 7 == 6:
            result = await agent.compact(context, tokens=tally)
        else:
            text = f"/overflow question {i} " if i % 5 == 4 else f"question {i} "
            prompt = UserMessage.text(text + "z" * 180)
            result = await agent.run(Input(context=context, prompts=(prompt,), tokens=tally))
        assert result.status == "completed", result.error
        tally = advance(tally, len(context.messages), result)
        assert tally == tally_of(result.context.messages)
        reasons += [c.reason for c in result.compactions]
        context = result.context
    assert {"threshold", "overflow", "manual"} <= set(reasons)


async def test_a_given_tally_gives_the_same_run_as_counting() -> None:
    base = history(10)
    results = []
    for given_tally in (None, tally_of(base.messages)):
        provider = ScriptedProvider(script=["ok"], summaries=["the gist"])
        agent = agent_for(provider, context_window=2000, compact_at=0.5, keep_after_compaction=0.2)
        prompt = UserMessage.text("new question")
        results.append(await agent.run(Input(context=base, prompts=(prompt,), tokens=given_tally)))
    assert results[0] == results[1] and results[0].compactions


# --- Compaction.at --------------------------------------------------------------------------


async def test_a_threshold_compaction_on_resume_is_before_the_answers_to_pending_calls() -> None:
    # A stored context ending with a call is a pending call (docs/tools.md); the resuming run
    # compacts first (never folding the pending call), then appends the answer, then prompts.
    call = ToolCallBlock(id="c1", name="lookup", arguments="{}")
    pending = Context(
        messages=(
            *history(10).messages,
            UserMessage.text("what time?"),
            AssistantMessage(content=(call,), stop_reason="tool_use", provider="scripted"),
        )
    )
    answer = ToolResultMessage(
        tool_call_id="c1", tool_name="lookup", content=(TextBlock(text="noon"),)
    )
    provider = ScriptedProvider(script=["ok"], summaries=["the gist"])
    agent = agent_for(provider, context_window=2000, compact_at=0.5, keep_after_compaction=0.2)
    result = await agent.run(
        Input(context=pending, tool_results=(answer,), prompts=(UserMessage.text("next"),))
    )
    [compaction] = result.compactions
    assert compaction.reason == "threshold" and compaction.at == 0
    assert result.new_messages[0] == answer
    assert isinstance(result.new_messages[1], UserMessage)
    # the pending call was not folded: its message is still in the context, before the answer
    calls = [m for m in result.context.messages if isinstance(m, AssistantMessage) and m.tool_calls]
    assert calls[0].tool_calls == (call,)


async def test_an_overflow_compaction_is_right_after_the_attempt_that_overflowed() -> None:
    result = await echo_agent().run(
        Input(context=history(3), prompts=(UserMessage.text("/overflow please"),))
    )
    [compaction] = result.compactions
    assert compaction.reason == "overflow" and compaction.at == 2
    overflowed = result.new_messages[compaction.at - 1]
    assert isinstance(overflowed, AssistantMessage)
    assert overflowed.error is not None and overflowed.error.kind == "overflow"
    assert result.new_messages[compaction.at] == result.final


async def test_a_manual_compaction_is_after_everything_the_run_recorded() -> None:
    result = await echo_agent().compact(history(3))
    [compaction] = result.compactions
    assert compaction.reason == "manual" and compaction.at == len(result.new_messages) == 0


def test_a_stored_compaction_without_at_still_loads() -> None:
    record = {
        "reason": "manual",
        "folded": [],
        "previous_summary": "",
        "summary": "s",
        "tokens_before": 1,
        "tokens_after": 0,
        "usage": Usage().model_dump(mode="json"),
    }
    assert Compaction.model_validate(record).at is None


# --- for_provider ---------------------------------------------------------------------------


def test_for_provider_passes_on_messages_with_nothing_to_strip_as_the_same_objects() -> None:
    plain = [AssistantMessage(content=(TextBlock(text=f"a{i}"),), provider="") for i in range(50)]
    users = [UserMessage.text(f"u{i}") for i in range(50)]
    thinking = AssistantMessage(
        content=(ThinkingBlock(thinking="hmm", signature="sig"), TextBlock(text="x")),
        provider="anthropic",
    )
    with_data = AssistantMessage(
        content=(TextBlock(text="y"),), provider="openai", provider_data={"k": 1}
    )
    sent = for_provider((*plain, *users, thinking, with_data), "echo")
    assert all(a is b for a, b in zip(sent[:100], (*plain, *users), strict=True))
    assert sent[100] is not thinking and sent[100].content == (TextBlock(text="x"),)
    assert sent[101] is not with_data and sent[101].provider_data == {}


# --- off the event loop ---------------------------------------------------------------------


def _spy(monkeypatch: pytest.MonkeyPatch, module: Any, name: str, threads: list[bool]) -> None:
    original: Callable[..., Any] = getattr(module, name)

    def spy(*args: Any, **kw: Any) -> Any:
        threads.append(threading.current_thread() is threading.main_thread())
        return original(*args, **kw)

    monkeypatch.setattr(module, name, spy)


def long_context(n: int) -> Context:
    """``n`` alternating messages of 57 characters (issue 10's reproduction)."""
    out: list[AnyMessage] = []
    for i in range(n):
        text = f"u{i:05d} " + "a" * 50
        out.append(
            UserMessage.text(text)
            if i % 2 == 0
            else AssistantMessage(content=(TextBlock(text=text),), provider="")
        )
    return Context(messages=tuple(out))


async def test_compacting_a_long_context_runs_its_cpu_heavy_steps_in_a_worker_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    base = long_context(9_000)
    prompt = UserMessage.text("next")

    async def once() -> Result:
        return await echo_agent().run(Input(context=base, prompts=(prompt,)))

    with monkeypatch.context() as on_the_loop:
        on_the_loop.setattr(offload, "OFFLOAD_MESSAGES", 10**9)
        reference = await once()
    on_loop: dict[str, list[bool]] = {}
    for module, name in (
        (tokens, "heuristic_tokens"),
        (compaction_module, "choose_cut"),
        (compaction_module, "render"),
        (compaction_stage, "_fold"),
        (run_module, "tally_of"),
    ):
        _spy(monkeypatch, module, name, on_loop.setdefault(name, []))
    walked_on_loop: list[int] = []  # messages for_provider walks on the loop, call by call
    walk = opaque.for_provider

    def walking(messages: Sequence[AnyMessage], provider: str) -> tuple[AnyMessage, ...]:
        if threading.current_thread() is threading.main_thread():
            walked_on_loop.append(len(messages))
        return walk(messages, provider)

    monkeypatch.setattr(opaque, "for_provider", walking)
    result = await once()
    assert result == reference  # the same run, whichever thread did the work
    [compaction] = result.compactions
    assert compaction.reason == "threshold" and len(compaction.folded) > 4_000
    for name in ("choose_cut", "render", "_fold", "tally_of"):
        assert on_loop[name] and not any(on_loop[name]), name
    # On the loop: only what the run itself added (its prompt and answer), not the history.
    assert len(on_loop["heuristic_tokens"]) > 9_000
    assert sum(on_loop["heuristic_tokens"]) <= 4
    # what the provider is sent: the history and the compacted context are walked in a
    # thread; on the loop only the appended prompt and answer
    assert sum(walked_on_loop) <= 4, walked_on_loop


async def test_a_short_context_is_handled_on_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Below the threshold nothing is sent to a thread (the hop would cost more)."""
    seen: list[bool] = []
    _spy(monkeypatch, compaction_module, "choose_cut", seen)
    provider = ScriptedProvider(script=["ok"], summaries=["the gist"])
    agent = agent_for(provider, context_window=2000, compact_at=0.5, keep_after_compaction=0.2)
    result = await agent.run(Input(context=history(10), prompts=(UserMessage.text("q"),)))
    assert result.compactions and seen == [True]


async def test_a_run_on_a_long_context_a_run_returned_uses_no_worker_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the provider is sent of a context a run returned is remembered: the next run finds
    it without a walk, so it sends nothing to a thread either, however long the context (a
    thread hop per run costs more than the O(1) lookup it would carry)."""
    agent = echo_agent(context_window=100_000_000)
    first = await agent.run(
        Input(context=long_context(offload.OFFLOAD_MESSAGES + 10), prompts=(UserMessage.text("a"),))
    )
    tally = tally_of(first.context.messages)
    hops: list[str] = []
    to_thread = offload.asyncio.to_thread

    async def counted(fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        hops.append(getattr(fn, "__name__", repr(fn)))
        return await to_thread(fn, *args, **kw)

    monkeypatch.setattr(offload.asyncio, "to_thread", counted)
    second = await agent.run(
        Input(context=first.context, prompts=(UserMessage.text("b"),), tokens=tally)
    )
    assert second.status == "completed" and second.final is not None
    assert hops == []
    # a context never seen is walked once, in a thread
    fresh = Context(messages=first.context.messages)
    await agent.run(Input(context=fresh, prompts=(UserMessage.text("c"),), tokens=tally))
    assert hops == ["prepare"]


def test_a_tally_is_a_plain_value() -> None:
    assert TokenTally() == tally_of(())
    assert estimate_with(TokenTally(), "", "") == estimate("", "", ())


# --- what a provider is sent, carried over across appends and runs (app/agent/opaque.py) ----


def _imported() -> Context:
    """An uploaded history holding what another provider issued: reasoning to strip, a
    reasoning-only message to drop, ``provider_data`` to clear."""
    messages: list[AnyMessage] = []
    for i in range(30):
        messages.append(UserMessage.text(f"question {i}"))
        if i % 10 == 3:
            messages.append(
                AssistantMessage(
                    content=(ThinkingBlock(thinking="hmm", signature="sig"), TextBlock(text="a")),
                    provider="anthropic",
                )
            )
        elif i % 10 == 6:
            messages.append(
                AssistantMessage(
                    content=(TextBlock(text="b"),), provider="openai", provider_data={"id": i}
                )
            )
        else:
            messages.append(AssistantMessage(content=(TextBlock(text=f"answer {i}"),)))
    return Context(system_prompt="be brief", messages=tuple(messages))


def _checked_views(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every view a request is built from is checked against a fresh walk of its context;
    returns the list of how many messages ``for_provider`` walks, call by call."""
    from app.agent import compaction, opaque

    walked: list[int] = []
    walk = opaque.for_provider
    view_of = opaque.view_of

    def counting(messages: Sequence[AnyMessage], provider: str) -> tuple[AnyMessage, ...]:
        walked.append(len(messages))
        return walk(messages, provider)

    def checked(context: Context, provider: str) -> opaque.ProviderView:
        view = view_of(context, provider)
        fresh = walk(compaction.project(context), provider)
        assert view.messages == fresh
        assert view.tokens == sum(heuristic_tokens(m) for m in fresh)
        return view

    monkeypatch.setattr(opaque, "for_provider", counting)
    monkeypatch.setattr(run_module, "view_of", checked)
    return walked


async def test_every_request_is_what_a_fresh_walk_of_its_context_gives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Across runs, tool batches, a pending call answered and an overflow compaction."""
    walked = _checked_views(monkeypatch)
    agent = echo_agent(context_window=100_000)
    context = _imported()
    for prompt in ("hello", "/tool time_now {}", "/overflow", "after the compaction", "bye"):
        result = await agent.run(Input(context=context, prompts=(UserMessage.text(prompt),)))
        assert result.status == "completed", result.error
        context = result.context
    assert context.summary  # the overflow compacted
    assert walked  # the spy saw the walks it checks


async def test_a_run_on_the_context_a_run_returned_walks_only_what_it_appended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A counting test: the messages walked for the provider on the second run are the same
    for a 10- and a 2,000-message history (its prompt and answer), none of the history."""
    walked = _checked_views(monkeypatch)
    agent = echo_agent(context_window=100_000_000)
    per_size: dict[int, list[int]] = {}
    for size in (10, 2_000):
        first = await agent.run(Input(context=history(size), prompts=(UserMessage.text("one"),)))
        walked.clear()
        second = await agent.run(
            Input(context=first.context, prompts=(UserMessage.text("two"),), tokens=None)
        )
        assert second.status == "completed"
        per_size[size] = list(walked)
    assert per_size[10] == per_size[2_000]
    assert sum(per_size[10]) <= 2  # the prompt, then the answer


async def test_the_echo_provider_reports_the_heuristic_of_what_it_was_sent() -> None:
    sent: list[Any] = []
    agent = echo_agent(context_window=100_000_000)
    original = agent.config.provider.stream

    async def recording(request: Any) -> Any:
        sent.append(request)
        async for event in original(request):
            yield event

    agent.config.provider.stream = recording  # type: ignore[method-assign]
    context = _imported()
    for prompt in ("one", "/tool time_now {}", "three"):
        result = await agent.run(Input(context=context, prompts=(UserMessage.text(prompt),)))
        context = result.context
    for request in sent:
        recount = heuristic_text_tokens(request.system_prompt) + sum(
            heuristic_tokens(m) for m in request.messages
        )
        assert request.estimated_input_tokens == recount
    reports = [m.usage.input_tokens for m in context.messages if isinstance(m, AssistantMessage)]
    assert reports[-len(sent) :] == [r.estimated_input_tokens for r in sent]


async def test_with_nothing_to_strip_and_no_summary_the_view_is_the_contexts_own_tuple() -> None:
    """No copy of a long history per request: the view shares the context's tuple, run after
    run; with a summary (or something to strip) it is a tuple of its own."""
    agent = echo_agent(context_window=100_000_000)
    context = history(3_000)
    for prompt in ("one", "two"):
        result = await agent.run(Input(context=context, prompts=(UserMessage.text(prompt),)))
        context = result.context
        assert opaque.view_of(context, "echo").messages is context.messages
    summarized = context.model_copy(update={"summary": "earlier"})
    view = opaque.view_of(summarized, "echo")
    assert view.messages is not summarized.messages
    assert view.messages[1:] == summarized.messages
