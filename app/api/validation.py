"""FastAPI's validation errors as the ``errors`` of a ``validation-error`` problem: each
``{"path", "message"}``, with paths as the client wrote the request (``body.prompts[0]``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fastapi.exceptions import RequestValidationError


def _error_path(
    loc: Sequence[str | int], body: Any, error_type: str, ctx: Mapping[str, Any]
) -> str:
    """``("body", "prompts", 0, "user", "content", 1)`` → ``body.prompts[0].content[1]``.

    pydantic puts the tag of a discriminated union (``user``) and the label of a union member
    (``UserMessage``, ``str``) into ``loc``; they are not in the request, so they are dropped
    by walking the request body alongside the location.
    """
    if not loc:
        return ""
    path = str(loc[0])
    if loc[0] in ("header", "query", "path", "cookie") and len(loc) > 1:
        # the parameter's name (a header's may be capitalised: it is no union label)
        path += f".{loc[1]}"
        loc = loc[1:]
    current: Any = body if loc[0] == "body" else None
    tag_skipped = False
    for segment in loc[1:]:
        if isinstance(segment, int):
            path += f"[{segment}]"
            current = (
                current[segment]
                if isinstance(current, list) and -len(current) <= segment < len(current)
                else None
            )
            tag_skipped = False
            continue
        if isinstance(current, dict):
            if not tag_skipped and current.get("type") == segment:
                # the tag of a discriminated union, even when a field has the same name
                # (a text block's tag "text" and its field "text")
                tag_skipped = True
                continue
            if segment in current:
                path += f".{segment}"
                current = current[segment]
                tag_skipped = False
                continue
            tags = [v for v in current.values() if isinstance(v, str)]
            is_tag = not tag_skipped and segment in tags
            is_label = segment[:1].isupper() or "[" in segment or segment in _TYPE_LABELS
            if is_tag or is_label:
                tag_skipped = tag_skipped or is_tag
                continue
            path += f".{segment}"  # a missing member
            current = None
            continue
        if current is not None or segment in _TYPE_LABELS or segment[:1].isupper():
            continue  # a union member's label under a scalar or list value
        path += f".{segment}"
    if error_type in ("union_tag_invalid", "union_tag_not_found"):
        path += "." + str(ctx.get("discriminator", "type")).strip("'\"")
    return path


_TYPE_LABELS = frozenset(
    {"str", "int", "float", "bool", "bytes", "list", "dict", "tuple", "set", "none", "null"}
)


def _value_at(loc: Sequence[str | int], body: Any) -> Any:
    """The request's value at a pydantic location, skipping the labels that are not in it."""
    current = body
    for segment in loc[1:]:
        if isinstance(segment, int) and isinstance(current, list):
            current = current[segment] if -len(current) <= segment < len(current) else None
        elif isinstance(current, dict) and segment in current:
            current = current[segment]
    return current


#: shown to a client that sent another API's message shape (``{"role": "user", ...}``)
TYPED_FORM = (
    'each message names its kind in "type", not "role": '
    '{"type": "user", "content": [{"type": "text", "text": "hi"}]} '
    '(or, in prompts, the bare string "hi")'
)


def _message(error: Mapping[str, Any], body: Any) -> str:
    message = str(error.get("msg", "invalid"))
    if error.get("type") == "union_tag_not_found":
        value = _value_at(tuple(error.get("loc", ())), body)
        if isinstance(value, dict) and "role" in value and "type" not in value:
            return f"{message}: {TYPED_FORM}"
    return message


def validation_errors(exc: RequestValidationError) -> list[dict[str, str]]:
    """FastAPI's errors as ``{"path", "message"}`` items, in order, without duplicates."""
    body = getattr(exc, "body", None)
    items: list[dict[str, str]] = []
    errors = list(exc.errors())
    for error in [e for e in errors if not _wrong_branch(e, errors)]:
        path = _error_path(
            tuple(error.get("loc", ())), body, error.get("type", ""), error.get("ctx") or {}
        )
        item = {"path": path, "message": _message(error, body)}
        if item not in items:
            items.append(item)
    return items


def _wrong_branch(error: Mapping[str, Any], errors: Sequence[Mapping[str, Any]]) -> bool:
    """A union member that does not even have the value's JSON type (``str`` for an object
    prompt) when another member got further: its "should be a valid string" would only hide
    the error that matters (``body.prompts[0].content[0].type``)."""
    loc = tuple(error.get("loc", ()))
    if not loc or not str(error.get("type", "")).endswith("_type"):
        return False
    label, prefix = loc[-1], loc[:-1]
    if not isinstance(label, str) or not (label in _TYPE_LABELS or label[:1].isupper()):
        return False
    return any(
        tuple(other.get("loc", ()))[: len(prefix)] == prefix
        and len(other.get("loc", ())) > len(prefix)
        and tuple(other.get("loc", ()))[len(prefix)] != label
        and not str(other.get("type", "")).endswith("_type")
        for other in errors
    )
