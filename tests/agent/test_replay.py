"""contract §1 — the replayability validator: every rule, and the index it names."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.agent.codec import dumps_context, loads_context
from app.agent.messages import (
    AssistantMessage,
    AttemptError,
    Context,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
    ToolResultMessage,
    UserMessage,
)
from app.agent.replay import ReplayError, open_batch, validate_context, validate_messages

from . import strategies as s


def user(text: str = "hi") -> UserMessage:
    return UserMessage.text(text)


def reply(text: str = "ok", **kwargs: Any) -> AssistantMessage:
    return AssistantMessage(content=(TextBlock(text=text),), **kwargs)


def calls(*ids: str, name: str = "t") -> AssistantMessage:
    return AssistantMessage(
        content=(
            ThinkingBlock(thinking="plan", signature="sig"),
            *(ToolCallBlock(id=i, name=name, arguments="{}") for i in ids),
        ),
        stop_reason="tool_use",
    )


def result(call_id: str, name: str = "t", *, is_error: bool = False) -> ToolResultMessage:
    return ToolResultMessage(
        tool_call_id=call_id, tool_name=name, content=(TextBlock(text="r"),), is_error=is_error
    )


def refused(messages: list[Any], **kwargs: Any) -> ReplayError:
    with pytest.raises(ReplayError) as info:
        validate_messages(messages, **kwargs)
    with pytest.raises(ReplayError) as info_ctx:
        validate_context(Context(messages=tuple(messages)), **kwargs)
    assert info_ctx.value.index == info.value.index
    return info.value


# --- valid histories ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "messages",
    [
        [],
        [user()],
        [user(), reply()],
        [user(), user(), reply(), reply()],
        [reply()],
        [user(), calls("a"), result("a"), reply()],
        [user(), calls("a", "b"), result("a"), result("b"), reply()],
        [user(), calls("a", "b"), result("b"), result("a"), reply()],  # any order within a batch
        [user(), calls("a"), result("a", is_error=True), calls("b"), result("b"), reply()],
        [user(), calls("a"), result("a"), user("more"), calls("a"), result("a")],  # id reused
        [user(), calls("a"), result("a")],  # closed batch at the end
        [user(), reply(stop_reason="max_tokens"), user(), reply(stop_reason="refusal")],
    ],
    ids=lambda m: "-".join(x.type for x in m) or "empty",
)
def test_valid_histories_pass(messages: list[Any]) -> None:
    validate_messages(messages)
    validate_context(Context(messages=tuple(messages)))
    assert open_batch(messages) is None


@s.HEAVY
@given(s.replayable_contexts())
def test_every_replayable_context_validates(context: Context) -> None:
    validate_context(context)
    validate_context(context, allow_open_batch=True)
    assert open_batch(context.messages) is None
    # and still does after a trip through storage
    validate_context(loads_context(dumps_context(context)))


# --- unanswered calls -----------------------------------------------------------------------------


@pytest.mark.parametrize("next_message", [user("next"), reply("next")], ids=["user", "assistant"])
def test_unanswered_call_before_next_message_names_that_message(next_message: Any) -> None:
    error = refused([user(), calls("a", "b"), result("a"), next_message, reply()])
    assert error.index == 3
    assert "'b'" in error.reason
    assert "messages[1]" in error.reason
    assert str(error).startswith("messages[3]: ")


def test_unanswered_call_directly_followed_by_a_user_message() -> None:
    error = refused([user(), calls("a"), user()])
    assert error.index == 2


def test_unanswered_trailing_batch_names_the_assistant() -> None:
    error = refused([user(), calls("a", "b"), result("b")])
    assert error.index == 1
    assert "'a'" in error.reason


# --- results without their call -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("messages", "index"),
    [
        ([result("a")], 0),
        ([user(), result("a")], 1),
        ([user(), reply(), result("a")], 2),
        ([user(), calls("a"), result("b")], 2),
        # answers a call of an earlier, already closed batch
        ([user(), calls("a"), result("a"), user(), calls("b"), result("b"), result("a")], 6),
        ([user(), calls("a"), result("a"), reply(), result("a")], 4),
    ],
)
def test_orphan_tool_result_is_refused_at_its_index(messages: list[Any], index: int) -> None:
    assert refused(messages).index == index


def test_duplicate_result_for_one_call() -> None:
    error = refused([user(), calls("a", "b"), result("a"), result("a"), result("b")])
    assert error.index == 3
    assert "'a'" in error.reason


def test_duplicate_result_after_the_batch_closed() -> None:
    assert refused([user(), calls("a"), result("a"), result("a")]).index == 3


def test_duplicate_call_ids_within_one_message() -> None:
    error = refused([user(), reply(), user(), calls("x", "y", "x")])
    assert error.index == 3
    assert "'x'" in error.reason


def test_duplicate_call_ids_refused_even_if_answered() -> None:
    assert refused([user(), calls("x", "x"), result("x"), result("x")]).index == 1


# --- failed and aborted attempts ------------------------------------------------------------------


@pytest.mark.parametrize(
    "attempt",
    [
        reply(stop_reason="error", error=AttemptError(kind="fatal", message="boom")),
        reply(stop_reason="aborted", error=AttemptError(kind="aborted", message="cancelled")),
        reply(stop_reason="error"),
        reply(stop_reason="aborted"),
        reply(stop_reason="end_turn", error=AttemptError(kind="retryable", message="cut")),
        AssistantMessage(stop_reason="error"),
    ],
    ids=[
        "error",
        "aborted",
        "error-no-object",
        "aborted-no-object",
        "error-object-only",
        "empty-error",
    ],
)
@pytest.mark.parametrize("position", ["middle", "last"])
def test_failed_or_aborted_attempt_is_refused(attempt: AssistantMessage, position: str) -> None:
    messages: list[Any] = [user(), reply(), user(), attempt]
    if position == "middle":
        messages += [user(), reply()]
    error = refused(messages)
    assert error.index == 3
    # not even an open batch makes it acceptable
    assert refused(messages, allow_open_batch=True).index == 3


@s.HEAVY
@given(s.assistant_messages(replayable=False), st.integers(min_value=0, max_value=3))
def test_any_failed_attempt_inside_a_context_is_refused(
    attempt: AssistantMessage, turns: int
) -> None:
    head: list[Any] = []
    for _ in range(turns):
        head += [user(), reply()]
    head.append(user())
    with pytest.raises(ReplayError) as info:
        validate_messages([*head, attempt], allow_open_batch=True)
    assert info.value.index == len(head)


# --- the open trailing batch ----------------------------------------------------------------------


def test_open_trailing_batch_refused_by_default_accepted_when_allowed() -> None:
    messages = [user(), calls("a", "b", "c"), result("b")]
    assert refused(messages).index == 1
    validate_messages(messages, allow_open_batch=True)
    validate_context(Context(messages=tuple(messages)), allow_open_batch=True)
    assert open_batch(messages) == (1, ["a", "c"])


def test_open_batch_without_any_results() -> None:
    messages = [user(), calls("a", "b"), result("a"), result("b"), reply(), user(), calls("x", "y")]
    assert refused(messages).index == 6
    validate_messages(messages, allow_open_batch=True)
    assert open_batch(messages) == (6, ["x", "y"])


def test_allow_open_batch_does_not_excuse_an_earlier_unanswered_call() -> None:
    messages = [user(), calls("a"), user(), calls("b")]
    assert refused(messages, allow_open_batch=True).index == 2


def test_allow_open_batch_does_not_excuse_orphans_or_duplicates() -> None:
    assert refused([user(), calls("a", "b"), result("z")], allow_open_batch=True).index == 2
    assert (
        refused([user(), calls("a", "b"), result("a"), result("a")], allow_open_batch=True).index
        == 3
    )


@pytest.mark.parametrize(
    "messages",
    [
        [],
        [user()],
        [user(), reply()],
        [user(), calls("a"), result("a")],
        [user(), calls("a"), result("a"), reply()],
        [user(), calls("a"), result("a"), user()],
    ],
)
def test_open_batch_is_none_when_nothing_is_open(messages: list[Any]) -> None:
    assert open_batch(messages) is None


@s.HEAVY
@given(s.open_batch_contexts())
def test_open_batch_reports_index_and_missing_ids(drawn: tuple[Context, int, list[str]]) -> None:
    context, index, missing = drawn
    assert missing
    assert open_batch(context.messages) == (index, missing)
    with pytest.raises(ReplayError) as info:
        validate_context(context)
    assert info.value.index == index
    validate_context(context, allow_open_batch=True)
    # answering the missing calls closes the batch
    batch = context.messages[index]
    names = {c.id: c.name for c in batch.tool_calls}
    closed = Context(messages=(*context.messages, *(result(i, names[i]) for i in missing)))
    validate_context(closed)
    assert open_batch(closed.messages) is None


@s.HEAVY
@given(s.replayable_contexts(), st.data())
def test_dropping_any_tool_result_breaks_replay(context: Context, data: st.DataObject) -> None:
    positions = [i for i, m in enumerate(context.messages) if isinstance(m, ToolResultMessage)]
    if not positions:
        return
    drop = data.draw(st.sampled_from(positions))
    messages = [m for i, m in enumerate(context.messages) if i != drop]
    with pytest.raises(ReplayError):
        validate_messages(messages)


@s.HEAVY
@given(s.replayable_contexts(), st.data())
def test_duplicating_any_tool_result_breaks_replay(context: Context, data: st.DataObject) -> None:
    positions = [i for i, m in enumerate(context.messages) if isinstance(m, ToolResultMessage)]
    if not positions:
        return
    dup = data.draw(st.sampled_from(positions))
    messages = list(context.messages)
    messages.insert(dup + 1, messages[dup])
    with pytest.raises(ReplayError) as info:
        validate_messages(messages)
    assert info.value.index == dup + 1


def test_replay_error_is_a_value_error_with_index_and_reason() -> None:
    error = refused([user(), result("a")])
    assert isinstance(error, ValueError)
    assert error.index == 1
    assert "'a'" in error.reason
