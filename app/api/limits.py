"""Configured content limits (SPEC §6): checked before anything is written.

The body size is enforced by :class:`BodyLimitMiddleware` while the body streams in; the rest
here, on the parsed values. Exceeding one is a 413 or 422 problem naming the limit.
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.agent.messages import AnyMessage, Base64Source, ImageBlock, TextBlock, UserMessage
from app.config import Settings

from .problems import Problem, limit_exceeded, payload_too_large


def _check_messages(settings: Settings, messages: Iterable[AnyMessage], where: str) -> None:
    for i, message in enumerate(messages):
        for j, block in enumerate(message.content):
            if isinstance(block, TextBlock) and len(block.text) > settings.max_text_chars:
                problem = limit_exceeded("max_text_chars", settings.max_text_chars,
                                         len(block.text))
                problem.extras["path"] = f"{where}[{i}].content[{j}].text"
                raise problem
            if isinstance(block, ImageBlock) and isinstance(block.source, Base64Source):
                size = block.source.decoded_size()
                if size > settings.max_image_bytes:
                    problem = limit_exceeded("max_image_bytes", settings.max_image_bytes, size)
                    problem.extras["path"] = f"{where}[{i}].content[{j}].source.data"
                    raise problem


def check_prompts(settings: Settings, prompts: tuple[UserMessage, ...]) -> None:
    if len(prompts) > settings.max_prompts_per_run:
        raise limit_exceeded("max_prompts_per_run", settings.max_prompts_per_run, len(prompts))
    _check_messages(settings, prompts, "prompts")


def check_context(settings: Settings, context: object) -> None:
    from app.agent.messages import Context

    assert isinstance(context, Context)
    if len(context.messages) > settings.max_context_messages:
        raise limit_exceeded(
            "max_context_messages", settings.max_context_messages, len(context.messages)
        )
    for name in ("system_prompt", "summary"):
        value: str = getattr(context, name)
        if len(value) > settings.max_text_chars:
            problem = limit_exceeded("max_text_chars", settings.max_text_chars, len(value))
            problem.extras["path"] = name
            raise problem
    _check_messages(settings, context.messages, "messages")


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
            await payload_too_large(self.max_bytes).response()(scope, receive, send)
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
                await payload_too_large(self.max_bytes).response()(scope, receive, send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        whole = b"".join(chunks)
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": whole, "more_body": False}
            return await receive()  # after the body: wait for the disconnect

        await self.app(scope, replay, send)


__all__ = ["BodyLimitMiddleware", "Problem", "check_context", "check_prompts"]
