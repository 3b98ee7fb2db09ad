"""Hypothesis strategies for every wire value of contract §1: blocks, messages and contexts.

Strings come from the whole of Unicode minus lone surrogates (they cannot be UTF-8 encoded, so
no JSON text on the wire can carry them): NUL, astral characters, line/paragraph separators,
BOM and empty strings are all drawn on purpose. Fields the model declares non-empty (tool call
ids and names, ``tool_call_id``/``tool_name``, ``url``, ``media_type``) get non-empty strings.

Public strategies (reuse them from other test files):

- blocks: ``text_blocks``, ``image_blocks``, ``base64_sources``, ``url_sources``,
  ``thinking_blocks``, ``redacted_thinking_blocks``, ``tool_call_blocks``,
  ``user_blocks``, ``assistant_blocks``;
- metadata: ``usages``, ``attempt_errors``, ``json_values``, ``provider_data``;
- messages: ``user_messages``, ``assistant_messages``, ``tool_result_messages``, ``messages``;
- contexts: ``contexts`` (any shape, not necessarily replayable), ``replayable_contexts``
  (satisfies every replay rule), ``open_batch_contexts`` (replayable except for a trailing
  batch with unanswered calls; draws ``(context, index, missing_ids)``);
- raw strings: ``texts``, ``nonempty_texts``, ``raw_arguments``;
- ``HEAVY``: hypothesis settings for properties over whole contexts.
"""

from __future__ import annotations

import base64
import functools
import json
import random
from typing import Any, get_args

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from app.agent.messages import (
    AssistantMessage,
    AttemptError,
    Base64Source,
    Context,
    ErrorKind,
    ImageBlock,
    RedactedThinkingBlock,
    StopReason,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
    ToolResultMessage,
    UrlSource,
    Usage,
    UserMessage,
)

STOP_REASONS: tuple[str, ...] = get_args(StopReason)
REPLAYABLE_STOP_REASONS: tuple[str, ...] = tuple(
    r for r in STOP_REASONS if r not in ("error", "aborted")
)
ERROR_KINDS: tuple[str, ...] = get_args(ErrorKind)

# For properties over whole contexts: drawing them is slow-ish, and a loaded CI machine must
# not turn that into a flaky deadline or health-check failure.
HEAVY = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Strings that tend to break codecs: NUL, astral plane, JSON syntax, separators, BOM, escapes.
SPECIAL_STRINGS: tuple[str, ...] = (
    "",
    "\x00",
    "a\x00b\x00",
    "\U0001f600",
    "\U0001d11e clef",
    "\U0010ffff",
    "\U0001f3f3\ufe0f\u200d\U0001f308",
    "\u2028\u2029",
    "\ufeffbom",
    '"\\/\b\f\n\r\t',
    "\\u0000",
    "null",
    "{}",
    " ",
    "\x7f\x80\x9f",
    "e\u0301 vs \u00e9",
)

# Any code point that UTF-8 can encode: everything except surrogates (NUL included).
_chars = st.characters(codec="utf-8")


@functools.cache
def texts(*, min_size: int = 0, max_size: int = 40) -> st.SearchStrategy[str]:
    """Arbitrary unicode, biased towards :data:`SPECIAL_STRINGS` and the empty string."""
    special = [s for s in SPECIAL_STRINGS if min_size <= len(s) <= max_size]
    return st.one_of(
        st.sampled_from(special),
        st.text(_chars, min_size=min_size, max_size=max_size),
    )


@functools.cache
def nonempty_texts(max_size: int = 40) -> st.SearchStrategy[str]:
    return texts(min_size=1, max_size=max_size)


# --- JSON values ----------------------------------------------------------------------------

_json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    texts(),
)


@functools.cache
def json_values(max_leaves: int = 15) -> st.SearchStrategy[Any]:
    """Nested JSON: dicts/lists of str/int/bool/None/finite floats."""
    return st.recursive(
        _json_scalars,
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.dictionaries(texts(max_size=12), children, max_size=4),
        ),
        max_leaves=max_leaves,
    )


@functools.cache
def provider_data() -> st.SearchStrategy[dict[str, Any]]:
    """The opaque ``provider_data`` object: any JSON object."""
    return st.one_of(
        st.just({}),
        st.dictionaries(texts(max_size=12), json_values(), max_size=5),
        # shapes real providers send back (reasoning items with encrypted content)
        st.builds(
            lambda rid, enc: {"reasoning": [{"id": rid, "encrypted_content": enc, "summary": []}]},
            texts(),
            texts(max_size=200),
        ),
    )


# --- raw tool-call arguments ------------------------------------------------------------------

_INVALID_JSON_ARGUMENTS = (
    "",
    "{",
    '{"a": 1,,}',
    "{'single': 'quotes'}",
    '{"a": NaN}',
    '{"a": 1} trailing',
    "[1, 2",
    '{"city": "Par',
    "\x00",
    "not json at all \U0001f600",
)


@functools.cache
def raw_arguments() -> st.SearchStrategy[str]:
    """What a model may put in ``arguments``: valid JSON in odd layouts, or anything at all."""
    odd_layouts = st.builds(
        lambda value, indent, seps, ascii_: json.dumps(
            value, indent=indent, separators=seps, ensure_ascii=ascii_
        ),
        json_values(max_leaves=8),
        st.sampled_from([None, 0, 2, "\t"]),
        st.sampled_from([(",", ":"), (", ", ": "), (" , ", " : ")]),
        st.booleans(),
    )
    padded = st.builds(
        lambda s, pre, post: pre + s + post,
        odd_layouts,
        st.sampled_from(["", " ", "\n", "\t "]),
        st.sampled_from(["", " ", "\n\n"]),
    )
    return st.one_of(
        st.sampled_from(_INVALID_JSON_ARGUMENTS),
        texts(max_size=80),
        odd_layouts,
        padded,
    )


# --- blocks -------------------------------------------------------------------------------------

MEDIA_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")

LARGE_IMAGE_BYTES = 1_000_000


def random_bytes(size: int, seed: int) -> bytes:
    """Deterministic pseudo-random bytes (hypothesis cannot draw a megabyte directly)."""
    return random.Random(seed).randbytes(size)


@functools.cache
def image_bytes(*, large: bool = False) -> st.SearchStrategy[bytes]:
    """Raw image payloads: small ones drawn by hypothesis; ``large`` ones up to ~1 MB."""
    if large:
        return st.builds(
            random_bytes,
            st.integers(min_value=LARGE_IMAGE_BYTES - 3, max_value=LARGE_IMAGE_BYTES + 50_000),
            st.integers(min_value=0, max_value=2**32),
        )
    return st.binary(max_size=300)


@functools.cache
def base64_sources(*, large: bool = False) -> st.SearchStrategy[Base64Source]:
    return st.builds(
        lambda raw, media_type: Base64Source(
            media_type=media_type, data=base64.b64encode(raw).decode("ascii")
        ),
        image_bytes(large=large),
        st.one_of(st.sampled_from(MEDIA_TYPES), nonempty_texts(max_size=60)),
    )


@functools.cache
def url_sources() -> st.SearchStrategy[UrlSource]:
    urls = st.one_of(
        st.sampled_from(
            [
                "https://example.com/cat.png",
                "https://example.com/a%20b.png?x=1&y=\u00e9#frag",
                "data:image/png;base64,iVBORw0KGgo=",
                "https://\u4f8b\u3048.jp/\U0001f600.png",
            ]
        ),
        nonempty_texts(max_size=120),
    )
    return st.builds(UrlSource, url=urls)


@functools.cache
def image_blocks(*, large: bool = False) -> st.SearchStrategy[ImageBlock]:
    sources = base64_sources(large=True) if large else st.one_of(base64_sources(), url_sources())
    return st.builds(ImageBlock, source=sources)


@functools.cache
def text_blocks() -> st.SearchStrategy[TextBlock]:
    return st.builds(TextBlock, text=texts(max_size=200))


@functools.cache
def thinking_blocks() -> st.SearchStrategy[ThinkingBlock]:
    return st.builds(ThinkingBlock, thinking=texts(max_size=200), signature=texts(max_size=120))


@functools.cache
def redacted_thinking_blocks() -> st.SearchStrategy[RedactedThinkingBlock]:
    return st.builds(RedactedThinkingBlock, data=texts(max_size=200))


@functools.cache
def tool_call_ids() -> st.SearchStrategy[str]:
    return st.one_of(
        st.from_regex(r"(call|toolu)_[A-Za-z0-9]{1,24}", fullmatch=True),
        nonempty_texts(max_size=30),
    )


@functools.cache
def tool_names() -> st.SearchStrategy[str]:
    return st.one_of(
        st.from_regex(r"[a-z_][a-z0-9_]{0,20}", fullmatch=True),
        nonempty_texts(max_size=30),
    )


def tool_call_blocks(
    *, ids: st.SearchStrategy[str] | None = None
) -> st.SearchStrategy[ToolCallBlock]:
    if ids is None:
        return _any_tool_call_blocks()
    return st.builds(
        ToolCallBlock,
        id=ids,
        name=tool_names(),
        arguments=raw_arguments(),
    )


@functools.cache
def _any_tool_call_blocks() -> st.SearchStrategy[ToolCallBlock]:
    return st.builds(
        ToolCallBlock,
        id=tool_call_ids(),
        name=tool_names(),
        arguments=raw_arguments(),
        server_label=st.none() | st.sampled_from(["carryover", "docs", "wiki-2"]),
    )


@functools.cache
def user_blocks() -> st.SearchStrategy[TextBlock | ImageBlock]:
    return st.one_of(text_blocks(), image_blocks())


@functools.cache
def assistant_blocks() -> st.SearchStrategy[Any]:
    return st.one_of(
        text_blocks(), thinking_blocks(), redacted_thinking_blocks(), tool_call_blocks()
    )


# --- metadata ---------------------------------------------------------------------------------

_token_counts = st.one_of(
    st.integers(min_value=0, max_value=2_000_000), st.integers(min_value=0, max_value=2**63)
)


@functools.cache
def usages() -> st.SearchStrategy[Usage]:
    return st.builds(
        Usage,
        input_tokens=_token_counts,
        output_tokens=_token_counts,
        cache_read_tokens=_token_counts,
        cache_write_tokens=_token_counts,
    )


@functools.cache
def attempt_errors() -> st.SearchStrategy[AttemptError]:
    return st.builds(
        AttemptError,
        kind=st.sampled_from(ERROR_KINDS),
        message=texts(max_size=100),
        status=st.none() | st.integers(min_value=100, max_value=599),
        code=st.none() | texts(max_size=30),
    )


# --- messages ---------------------------------------------------------------------------------


@functools.cache
def user_messages() -> st.SearchStrategy[UserMessage]:
    return st.builds(UserMessage, content=st.lists(user_blocks(), max_size=4).map(tuple))


# what assistant_messages draws from, built once (a strategy built per draw is validated anew
# each time, which costs more than the draw)
_assistant_contents = st.lists(assistant_blocks(), max_size=5)
_stop_reasons = st.sampled_from(STOP_REASONS)
_replayable_stop_reasons = st.sampled_from(REPLAYABLE_STOP_REASONS)
_maybe_errors = st.none() | attempt_errors()
_failed_endings = st.one_of(
    st.tuples(st.sampled_from(("error", "aborted")), _maybe_errors),
    st.tuples(_stop_reasons, attempt_errors()),
)
_provider_names = st.one_of(st.sampled_from(["echo", "openai", "anthropic"]), texts())


@st.composite
def assistant_messages(
    draw: st.DrawFn,
    *,
    replayable: bool | None = None,
    content: st.SearchStrategy[list[Any]] | None = None,
) -> AssistantMessage:
    """An assistant message with full metadata.

    ``replayable=True`` gives only attempts a context may hold; ``False`` only failed/aborted
    ones (``stop_reason`` ``error``/``aborted`` or an ``error`` object); ``None`` anything.
    """
    blocks = draw(content if content is not None else _assistant_contents)
    return _draw_assistant(draw, replayable, blocks)


def _draw_assistant(
    draw: st.DrawFn, replayable: bool | None, blocks: list[Any]
) -> AssistantMessage:
    if replayable is None:
        stop_reason = draw(_stop_reasons)
        error = draw(_maybe_errors)
    elif replayable:
        stop_reason = draw(_replayable_stop_reasons)
        error = None
    else:
        stop_reason, error = draw(_failed_endings)
    return AssistantMessage(
        content=tuple(blocks),
        provider=draw(_provider_names),
        model=draw(texts(max_size=40)),
        response_id=draw(texts(max_size=40)),
        stop_reason=stop_reason,
        usage=draw(usages()),
        provider_data=draw(provider_data()),
        error=error,
    )


def tool_result_messages(
    *, call_id: str | None = None, name: str | None = None
) -> st.SearchStrategy[ToolResultMessage]:
    return st.builds(
        ToolResultMessage,
        tool_call_id=st.just(call_id) if call_id is not None else tool_call_ids(),
        tool_name=st.just(name) if name is not None else tool_names(),
        content=_result_contents(),
        is_error=st.booleans(),
    )


@functools.cache
def _result_contents() -> st.SearchStrategy[tuple[TextBlock | ImageBlock, ...]]:
    return st.lists(user_blocks(), max_size=3).map(tuple)


@functools.cache
def messages() -> st.SearchStrategy[UserMessage | AssistantMessage | ToolResultMessage]:
    return st.one_of(user_messages(), assistant_messages(), tool_result_messages())


@functools.cache
def contexts(max_messages: int = 6) -> st.SearchStrategy[Context]:
    """Any context the codec must carry; not necessarily replayable."""
    return st.builds(
        Context,
        system_prompt=texts(max_size=200),
        summary=texts(max_size=200),
        messages=st.lists(messages(), max_size=max_messages).map(tuple),
    )


# --- replayable contexts ------------------------------------------------------------------------

_no_call_blocks = st.one_of(text_blocks(), thinking_blocks(), redacted_thinking_blocks())
_some_no_call_blocks = st.lists(_no_call_blocks, max_size=3)


@st.composite
def _assistant_with_calls(
    draw: st.DrawFn, *, min_calls: int = 1, max_calls: int = 3
) -> AssistantMessage:
    ids = draw(_call_ids(min_calls, max_calls))
    calls = [
        ToolCallBlock(id=i, name=draw(tool_names()), arguments=draw(raw_arguments())) for i in ids
    ]
    others = draw(_some_no_call_blocks)
    blocks = draw(st.permutations(others + calls))
    return _draw_assistant(draw, True, blocks)


@functools.cache
def _call_ids(min_calls: int, max_calls: int) -> st.SearchStrategy[list[str]]:
    return st.lists(tool_call_ids(), min_size=min_calls, max_size=max_calls, unique=True)


@st.composite
def _answers(draw: st.DrawFn, message: AssistantMessage) -> list[ToolResultMessage]:
    """One result per call of ``message``, in call order or shuffled."""
    results = [
        ToolResultMessage(
            tool_call_id=c.id,
            tool_name=c.name,
            content=draw(_result_contents()),
            is_error=draw(st.booleans()),
        )
        for c in message.tool_calls
    ]
    return list(draw(st.one_of(st.just(results), st.permutations(results))))


@st.composite
def _turn(draw: st.DrawFn) -> list[Any]:
    """user → (assistant with calls → their results)* → optional closing assistant."""
    out: list[Any] = [draw(user_messages())]
    for _ in range(draw(_up_to_two)):
        assistant = draw(_assistants_with_calls)
        out.append(assistant)
        out.extend(draw(_answers(assistant)))
    if draw(st.booleans()):
        out.append(_draw_assistant(draw, True, draw(_some_no_call_blocks)))
    return out


_up_to_two = st.integers(min_value=0, max_value=2)
_assistants_with_calls = _assistant_with_calls()
_turns = _turn()


@st.composite
def replayable_contexts(draw: st.DrawFn, max_turns: int = 3) -> Context:
    """Contexts that satisfy every replay rule of contract §1."""
    return _draw_replayable(draw, max_turns)


def _draw_replayable(draw: st.DrawFn, max_turns: int) -> Context:
    messages_: list[Any] = []
    for _ in range(draw(st.integers(min_value=0, max_value=max_turns))):
        messages_.extend(draw(_turns))
    return Context(
        system_prompt=draw(texts(max_size=100)),
        summary=draw(texts(max_size=100)),
        messages=tuple(messages_),
    )


@st.composite
def open_batch_contexts(draw: st.DrawFn, max_turns: int = 2) -> tuple[Context, int, list[str]]:
    """A replayable context followed by an assistant whose batch is only partly answered.

    Draws ``(context, index_of_that_assistant, ids_still_unanswered_in_call_order)``.
    """
    base = _draw_replayable(draw, max_turns)
    head = list(base.messages)
    if not head or draw(st.booleans()):
        head.append(draw(user_messages()))
    assistant = draw(_assistants_with_calls)
    index = len(head)
    calls = list(assistant.tool_calls)
    answered = (
        draw(st.lists(st.sampled_from(calls), unique_by=lambda c: c.id, max_size=len(calls) - 1))
        if len(calls) > 1
        else []
    )
    answered_ids = {c.id for c in answered}
    results = [
        ToolResultMessage(
            tool_call_id=c.id,
            tool_name=c.name,
            content=draw(_result_contents()),
            is_error=draw(st.booleans()),
        )
        for c in answered
    ]
    missing = [c.id for c in calls if c.id not in answered_ids]
    context = Context(
        system_prompt=base.system_prompt,
        summary=base.summary,
        messages=(*head, assistant, *results),
    )
    return context, index, missing
