"""Configured content limits (contract §6): checked before anything is written.

The body size is enforced by :class:`BodyLimitMiddleware` while the body streams in; the rest
here, on the parsed values. Exceeding one is a 413 or 422 problem naming the limit. Text blocks
and images are checked by :func:`app.service.bounds.oversized_block`, the rule that also bounds
what a run stores.

Limits, their settings and defaults (``CARRYOVER_`` + the name in capitals):

==========================  ==========  ======================================================
``max_body_bytes``          8 MiB       request body (413 ``payload-too-large``)
``max_image_bytes``         5 MiB       one base64 image, decoded
``max_prompts_per_run``     32          prompts of one run
``max_text_chars``          200 000     a text block, a system prompt or instructions, a summary
``max_context_messages``    10 000      messages of an uploaded context
``max_page_size``           200         ``limit`` of a listing (default page: 50)
==========================  ==========  ======================================================

The middleware also refuses JSON text that no handler could store: a body that is not UTF-8,
or a string with an unpaired UTF-16 surrogate escape (``"\\ud800"``, which RFC 8259 §8.2 leaves
undefined and no database column can hold) — 400 ``malformed-json`` naming the position. The
system prompt and the summary are stored as text columns, which PostgreSQL does not let hold
NUL characters, so they are refused there (422) on both engines alike; messages are stored as
JSON text, where a NUL is an escape, so they may hold one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.agent.messages import AnyMessage
from app.config import Settings
from app.service.bounds import oversized_block

from .problems import MALFORMED_JSON, Problem, limit_exceeded, payload_too_large, validation_error


def check_messages(settings: Settings, messages: Sequence[AnyMessage], where: str) -> None:
    """Messages to be stored as they are (prompts, a context, ``/v1`` items): each text block
    and image within the limits, the problem naming its place under ``where``."""
    found = oversized_block(settings, messages)
    if found is not None:
        problem = limit_exceeded(found.limit, found.maximum, found.actual)
        problem.extras["path"] = f"{where}[{found.message}].content[{found.block}].{found.field}"
        raise problem


def check_text(settings: Settings, value: str, path: str) -> None:
    """A system prompt or a summary: at most ``max_text_chars``, and no NUL characters."""
    if len(value) > settings.max_text_chars:
        problem = limit_exceeded("max_text_chars", settings.max_text_chars, len(value))
        problem.extras["path"] = path
        raise problem
    refuse_nul(value, path)


def refuse_nul(value: str, path: str) -> None:
    """422 for a string bound for a text column that holds a NUL character (PostgreSQL's
    cannot; refused on SQLite too, so that both engines agree)."""
    if "\x00" in value:
        raise validation_error(
            [
                {
                    "path": path,
                    "message": f"must not contain NUL (\\u0000) characters (found at character "
                    f"{value.index(chr(0))})",
                }
            ]
        )


def check_prompts(settings: Settings, prompts: Sequence[AnyMessage]) -> None:
    if len(prompts) > settings.max_prompts_per_run:
        raise limit_exceeded("max_prompts_per_run", settings.max_prompts_per_run, len(prompts))
    check_messages(settings, prompts, "body.prompts")


def check_context(settings: Settings, context: object, where: str = "body") -> None:
    """The limits of a context sent whole, at ``where`` in the request (``body.context`` in an
    export document)."""
    from app.agent.messages import Context

    assert isinstance(context, Context)
    if len(context.messages) > settings.max_context_messages:
        raise limit_exceeded(
            "max_context_messages", settings.max_context_messages, len(context.messages)
        )
    for name in ("system_prompt", "summary"):
        check_text(settings, getattr(context, name), f"{where}.{name}")
    check_messages(settings, context.messages, f"{where}.messages")


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD]([89a-fA-F])[0-9a-fA-F]{2}")
_LOW_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][c-fC-F][0-9a-fA-F]{2}")


def _is_json(content_type: bytes | None) -> bool:
    if content_type is None:
        return False
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or (
        media.startswith(b"application/") and media.endswith(b"+json")
    )


def unpaired_surrogate(body: bytes) -> int | None:
    """Offset of the first ``\\uD800``-``\\uDFFF`` escape in ``body`` (JSON text) that is not
    half of a surrogate pair, or ``None``."""
    paired_low = -1
    for match in _SURROGATE_ESCAPE.finditer(body):
        start = match.start()
        before = start - 1
        while before >= 0 and body[before] == 0x5C:  # backslashes right before the escape
            before -= 1
        if (start - 1 - before) % 2:
            continue  # "\\ud800": an escaped backslash, then plain text
        if start == paired_low:
            continue
        if match.group(1).lower() in b"89ab":  # high surrogate: a low one must follow
            if _LOW_SURROGATE_ESCAPE.match(body, match.end()):
                paired_low = match.end()
                continue
        return start
    return None


def json_text_problem(content_type: bytes | None, body: bytes) -> Problem | None:
    """Why a JSON ``body`` cannot be accepted as text, or ``None``: not UTF-8 (RFC 8259 §8.1),
    or a string holding an unpaired surrogate (§8.2)."""
    if not body or not _is_json(content_type):
        return None
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Problem(
            MALFORMED_JSON,
            f"the request body is not valid UTF-8: byte "
            f"0x{body[exc.start]:02x} at offset {exc.start} ({exc.reason})",
        )
    if b"\\u" not in body:
        return None
    offset = unpaired_surrogate(body)
    if offset is None:
        return None
    escape = body[offset : offset + 6].decode("ascii")
    return Problem(
        MALFORMED_JSON,
        f"the request body holds an unpaired UTF-16 surrogate "
        f"{escape} at offset {offset}: strings must be valid Unicode",
    )


class BodyLimitMiddleware:
    """Refuse request bodies over ``max_bytes`` with 413 before any route sees them.

    The body is read here (up to the limit) and handed on whole; JSON bodies are parsed whole
    anyway, so this costs no extra memory beyond the limit itself.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await payload_too_large(self.max_bytes).response(instance=scope["path"])(
                scope, receive, send
            )
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                await payload_too_large(self.max_bytes).response(instance=scope["path"])(
                    scope, receive, send
                )
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        whole = b"".join(chunks)
        problem = json_text_problem(headers.get(b"content-type"), whole)
        if problem is not None:
            await problem.response(instance=scope["path"])(scope, receive, send)
            return
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": whole, "more_body": False}
            return await receive()  # after the body: wait for the disconnect

        await self.app(scope, replay, send)


__all__ = [
    "BodyLimitMiddleware",
    "Problem",
    "check_context",
    "check_messages",
    "check_prompts",
    "check_text",
    "json_text_problem",
    "refuse_nul",
]
