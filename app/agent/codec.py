"""Lossless JSON codec for contexts and messages (contract §1).

``dump_*`` gives plain JSON values in which every field is present (empty strings stay empty
strings); ``load_*`` rebuilds the immutable values and refuses anything it does not know with a
:class:`CodecError` naming the path of the bad element, e.g. ``messages[3].content[0].type``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import TypeAdapter, ValidationError

from .messages import AnyMessage, Context, Message

_MESSAGE = TypeAdapter(Message)
_MESSAGES = TypeAdapter(tuple[Message, ...])

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
    return json.dumps(dump_context(context), ensure_ascii=False, separators=(",", ":"))


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


def dumps_message(message: AnyMessage) -> str:
    return json.dumps(dump_message(message), ensure_ascii=False, separators=(",", ":"))


def loads_message(text: str | bytes) -> AnyMessage:
    return load_message(_parse(text))
