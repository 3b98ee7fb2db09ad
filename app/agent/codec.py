"""Lossless JSON codec for contexts and messages (contract §1).

``dump_*`` gives plain JSON values in which every field is present (empty strings stay empty
strings; the one exception is a tool call's ``server_label``, left out when it has none);
``load_*`` rebuilds the immutable values and refuses anything it does not know with a
:class:`CodecError` naming the path of the bad element, e.g. ``messages[3].content[0].type``.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from .messages import AnyMessage, Context, Message

_MESSAGE = TypeAdapter(Message)
_MESSAGES = TypeAdapter(tuple[Message, ...])
_MESSAGE_LIST = TypeAdapter(list[Message])

#: messages per pydantic call when a long list is encoded or decoded in pieces: one call holds
#: the GIL from start to end, so a long list in one call stalls every other thread (the event
#: loop included) for all of it; a few hundred messages take a few milliseconds
CHUNK = 500

# Discriminator values pydantic inserts into error locations; they are not part of the path.
_TAGS = frozenset(
    {
        "user",
        "assistant",
        "tool_result",
        "text",
        "image",
        "thinking",
        "redacted_thinking",
        "tool_call",
        "base64",
        "url",
    }
)


class CodecError(ValueError):
    """A value that cannot be decoded; ``path`` points at the offending element."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message


def format_path(loc: Sequence[int | str], prefix: str = "", *, union_root: bool = False) -> str:
    """Render a pydantic error location as ``messages[3].content[0].type``.

    ``union_root``: the location starts at a tagged union (a bare message), whose first
    element is the tag.
    """
    out = prefix
    previous: int | str | None = 0 if union_root else None
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _TAGS and (isinstance(previous, int) or previous == "source"):
            pass  # a union tag, not a field
        else:
            out += f".{part}" if out else part
        previous = part
    return out


def _first_error(exc: ValidationError, prefix: str = "", *, union_root: bool = False) -> CodecError:
    err = exc.errors(include_url=False)[0]
    loc = list(err["loc"])
    message = err["msg"]
    if err["type"] in ("union_tag_invalid", "union_tag_not_found"):
        loc.append("type")
        ctx = err.get("ctx") or {}
        tag = ctx.get("tag")
        expected = ctx.get("expected_tags") or _expected_tags(loc)
        message = (
            f"unknown type {tag!r}; expected one of {expected}"
            if tag is not None
            else f"missing 'type'; expected one of {expected}"
        )
    return CodecError(format_path(loc, prefix, union_root=union_root), message)


def _expected_tags(loc: Sequence[int | str]) -> str:
    """The tags allowed where a ``type`` is missing (pydantic only names them when it is wrong)."""
    parent = next((p for p in reversed(loc[:-1]) if isinstance(p, str)), None)
    if parent == "source":
        return "'base64', 'url'"
    if parent == "content":
        return "'text', 'image', 'thinking', 'redacted_thinking', 'tool_call'"
    return "'user', 'assistant', 'tool_result'"


def dump_message(message: AnyMessage) -> dict[str, Any]:
    return message.model_dump(mode="json")


def dump_messages(messages: Iterable[AnyMessage]) -> list[dict[str, Any]]:
    return [dump_message(m) for m in messages]


def dump_context(context: Context) -> dict[str, Any]:
    return context.model_dump(mode="json")


def load_message(data: Any, path: str = "") -> AnyMessage:
    try:
        return _MESSAGE.validate_python(data)
    except ValidationError as exc:
        raise _first_error(exc, path, union_root=True) from None


def load_messages(data: Any, path: str = "messages") -> tuple[AnyMessage, ...]:
    try:
        return _MESSAGES.validate_python(data)
    except ValidationError as exc:
        raise _first_error(exc, path) from None


def load_context(data: Any) -> Context:
    try:
        return Context.model_validate(data)
    except ValidationError as exc:
        raise _first_error(exc) from None


def dumps_context(context: Context) -> str:
    return compact_json(dump_context(context))


def _parse(text: str | bytes) -> Any:
    """Strict JSON: NaN and Infinity are not JSON and would not come back as they went in."""
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as exc:
        raise CodecError("", f"not JSON: {exc}") from None
    except RecursionError:
        raise CodecError("", "not JSON this codec accepts: nested too deeply") from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def loads_context(text: str | bytes) -> Context:
    return load_context(_parse(text))


#: the JSON texts of the last messages dumped, by identity (a message is immutable): a run's new
#: messages are written to the context, the audit tables and the transcript and their size is
#: counted, each needing the same text; kept for at most ``RECENT_DUMPS`` messages of at most
#: ``RECENT_DUMP_CHARS`` characters each (docs/performance.md)
RECENT_DUMPS = 64
RECENT_DUMP_CHARS = 64 * 1024
_recent: dict[int, tuple[weakref.ref[Any], str]] = {}
_recent_lock = threading.Lock()  # offloaded work dumps messages in worker threads too


#: ``json.dumps(value, ensure_ascii=False, separators=(",", ":"))``, with its encoder built once
#: (``json.dumps`` with arguments builds a new one per call)
compact_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def dumps_message(message: AnyMessage) -> str:
    """The compact JSON text of ``message`` (non-ASCII as it is), as stored."""
    found = _recent.get(id(message))
    if found is not None and found[0]() is message:
        return found[1]
    text = compact_json(dump_message(message))
    if len(text) <= RECENT_DUMP_CHARS:
        with _recent_lock:
            _recent[id(message)] = (weakref.ref(message), text)
            if len(_recent) > RECENT_DUMPS:
                del _recent[next(iter(_recent))]
    return text


def loads_message(text: str | bytes) -> AnyMessage:
    return load_message(_parse(text))


def json_pieces(messages: Sequence[AnyMessage], chunk: int = CHUNK) -> Iterator[bytes]:
    """The JSON of ``messages`` (an array), in pieces of up to ``chunk`` messages each, with
    one pydantic call per piece: joined, ``b"[" + b",".join(pieces) + b"]"`` is the array
    (the same values as :func:`dump_messages`, compact, non-ASCII as it is)."""
    for start in range(0, len(messages), chunk):
        yield _MESSAGE_LIST.dump_json(list(messages[start : start + chunk]))[1:-1]


async def dumps_messages_json(messages: Sequence[AnyMessage], chunk: int = CHUNK) -> bytes:
    """The JSON array of ``messages``, built a piece at a time on the event loop, which runs
    its other tasks between pieces (``asyncio.sleep(0)``): no stall longer than a piece."""
    pieces: list[bytes] = []
    for piece in json_pieces(messages, chunk):
        if pieces:
            await asyncio.sleep(0)
        pieces.append(piece)
    return b"[" + b",".join(pieces) + b"]"


def loads_message_texts(
    texts: Sequence[str], path: str = "messages", chunk: int = CHUNK
) -> list[AnyMessage]:
    """Messages from their JSON texts (each a message's JSON), ``chunk`` texts per pydantic
    call (see :data:`CHUNK`); a bad one raises :class:`CodecError` naming ``path[i]…``."""
    out: list[AnyMessage] = []
    for start in range(0, len(texts), chunk):
        body = "[" + ",".join(texts[start : start + chunk]) + "]"
        try:
            out.extend(_MESSAGE_LIST.validate_json(body))
        except ValidationError as exc:
            err = exc.errors(include_url=False)[0]
            loc = list(err["loc"])
            if loc and isinstance(loc[0], int):
                loc[0] += start
            raise CodecError(format_path(loc, path), err["msg"]) from None
    return out


#: part of :func:`dumps_json`'s placeholders: drawn once per process and never sent, so no
#: string of a value can be one of them
_NONCE = secrets.token_hex(16)


class MessageList:
    """A list of messages inside a JSON value for :func:`dumps_json`: encoded in pieces."""

    __slots__ = ("messages",)

    def __init__(self, messages: Sequence[AnyMessage]) -> None:
        self.messages = messages


async def dumps_json(value: Any) -> bytes:
    """``value`` as compact JSON (``json.dumps(value, ensure_ascii=False, allow_nan=False,
    separators=(",", ":"))``, what a ``JSONResponse`` sends), where each :class:`MessageList`
    stands for the JSON array of its messages, encoded by :func:`dumps_messages_json`: the
    event loop runs its other tasks between pieces, once more than a piece's worth of
    messages was encoded since it last did (a run's answer, a few messages, takes no turn)."""
    nonce = _NONCE
    lists: list[Sequence[AnyMessage]] = []

    def placeholder(obj: Any) -> str:
        if not isinstance(obj, MessageList):
            raise TypeError(f"{type(obj).__name__} is not JSON serializable")
        lists.append(obj.messages)
        return f"\x00{nonce}:{len(lists) - 1}"

    text = json.dumps(
        value, ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=placeholder
    )
    out: list[bytes] = []
    at = 0
    encoded = 0  # messages encoded since the event loop last ran other tasks
    for i, messages in enumerate(lists):  # in the order they were written
        token = json.dumps(f"\x00{nonce}:{i}")  # NUL is escaped whatever ensure_ascii says
        index = text.index(token, at)
        out.append(text[at:index].encode())
        if encoded + len(messages) > CHUNK:  # more than a piece since the loop last ran
            await asyncio.sleep(0)
            encoded = 0
        out.append(await dumps_messages_json(messages))
        encoded += len(messages)
        at = index + len(token)
    out.append(text[at:].encode())
    return b"".join(out)


def in_field_order(model: type[Any], values: dict[str, Any]) -> dict[str, Any]:
    """``values`` in the order of ``model``'s fields (the order ``model_dump`` gives them)."""
    return {name: values[name] for name in model.model_fields if name in values}


def model_value(model: BaseModel, **lists: Sequence[AnyMessage]) -> dict[str, Any]:
    """``model.model_dump(mode="json")`` for :func:`dumps_json`, its fields named in
    ``lists`` (lists of messages, e.g. a compaction's ``folded``) as :class:`MessageList`."""
    head = model.model_dump(mode="json", exclude=set(lists))
    pieces = {name: MessageList(messages) for name, messages in lists.items()}
    return in_field_order(type(model), {**head, **pieces})
