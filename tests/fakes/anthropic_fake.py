"""A fake Anthropic Messages server: real HTTP on 127.0.0.1, scripted answers.

Usage::

    with AnthropicFake() as fake:                    # or the ``anthropic_fake`` fixture
        fake.add(Reply([Thinking("hmm"), Text("hi")]))
        fake.add(Reply([Thinking(""), ToolUse("get", {"q": 1})]))   # empty thinking + signature
        fake.add(Error.overloaded())                                 # HTTP 529
        fake.add(Reply([Text("so far")], error_event=("overloaded_error", "Overloaded")))
        fake.add(Reply([Text("a long answer")], malformed_at=5))     # event 5: cut JSON
        fake.add(RawSSE([("content_block_delta", {...})]))          # any events, any order
        fake.add(html_page(502, "502 Bad Gateway"))                  # a proxy's HTML page
        provider = AnthropicProvider(api_key=fake.api_key, base_url=fake.base_url, ...)
        fake.requests[-1].json["messages"]           # what the provider sent

Each ``POST /v1/messages`` is validated like the real API (see :meth:`AnthropicFake.validate`);
a request that breaks a rule gets the real 400 error shape and does NOT consume a scripted
answer. A valid request takes the next scripted answer, sent as SSE in the real event format
when the request has ``"stream": true`` and as one JSON message otherwise.

The fake remembers what it issued: every thinking signature (bound to its thinking text, like
the real signatures), every redacted_thinking payload, every tool_use input (by id, with key
order), and which thinking blocks preceded the tool_use blocks of each answer. A replay that
changes, drops or reorders any of them is refused.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import itertools
import json
import re
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from ._server import FakeServer, JSONAnswer, RawHTTP, RecordedRequest, SSEAnswer, html_page, sse
from ._server import pieces as _pieces

__all__ = [
    "AnthropicFake",
    "Error",
    "RawHTTP",
    "RawSSE",
    "Redacted",
    "Reply",
    "Text",
    "Thinking",
    "ToolUse",
    "anthropic_fake",
    "html_page",
]

_SECRET = b"fake-anthropic-signing-key"
_ID_PATTERN = re.compile(r"^[a-zA-Z0-9_-]+$")
_MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")


def sign(thinking: str) -> str:
    """The fake's signature of a thinking text (opaque base64, like the real ones)."""
    digest = hmac.new(_SECRET, thinking.encode(), hashlib.sha256).digest()
    return base64.b64encode(b"\x12\x08sig" + digest).decode()


@dataclass
class Text:
    text: str


@dataclass
class Thinking:
    thinking: str
    signature: str | None = None  # default: sign(thinking)
    stream_signature: bool = True  # False: the stream is cut before its signature_delta


@dataclass
class Redacted:
    data: str | None = None  # default: a fresh opaque payload


@dataclass
class ToolUse:
    name: str
    input: Mapping[str, Any] | None = None
    partial_json: str | None = None  # raw JSON to stream; default json.dumps(input)
    id: str | None = None  # default: a fresh ``toolu_...`` id


Block = Text | Thinking | Redacted | ToolUse


@dataclass
class Reply:
    """One scripted model answer (rendered as SSE or JSON, as the request asks)."""

    blocks: Sequence[Block] = ()
    stop_reason: str | None = None  # default: "tool_use" if any ToolUse else "end_turn"
    input_tokens: int = 25
    output_tokens: int = 9
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    model: str | None = None  # default: the requested model
    id: str | None = None
    # --- stream shape
    chunk_size: int = 4  # characters per text / thinking / partial_json fragment
    ping: bool = True  # a ping right after message_start, like the real API
    unknown_event: bool = False  # an event type the client does not know, mid-stream
    error_event: tuple[str, str] | None = None  # (error type, message) sent after HTTP 200
    error_after: int | None = None  # ... after N events (default: before message_delta)
    cut_after: int | None = None  # drop the connection after N SSE events
    end_after: int | None = None  # end the body cleanly after N events (no message_stop)
    malformed_at: int | None = None  # event N goes out with its JSON cut in the middle
    delay: float = 0.0
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass
class Error:
    """A scripted HTTP error answer with the real Anthropic body shape."""

    status: int
    type: str
    message: str
    headers: Mapping[str, str] = field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        return {
            "type": "error",
            "error": {"type": self.type, "message": self.message},
            "request_id": "req_fake",
        }

    @classmethod
    def overflow(cls) -> Error:
        return cls(
            400, "invalid_request_error", "prompt is too long: 208310 tokens > 200000 maximum"
        )

    @classmethod
    def rate_limit(cls, retry_after: str | None = "3") -> Error:
        headers = {"retry-after": retry_after} if retry_after is not None else {}
        return cls(
            429,
            "rate_limit_error",
            "Number of request tokens has exceeded your per-minute rate limit",
            headers,
        )

    @classmethod
    def overloaded(cls) -> Error:
        return cls(529, "overloaded_error", "Overloaded")

    @classmethod
    def api_error(cls, status: int = 500) -> Error:
        return cls(status, "api_error", "Internal server error")


@dataclass
class RawSSE:
    """Arbitrary SSE events, ``(event name, data)`` pairs sent as they are."""

    events: Sequence[tuple[str, Any]]
    cut_after: int | None = None
    end_after: int | None = None


Answer = Reply | Error | RawSSE | RawHTTP


class _Invalid(Exception):
    pass


class AnthropicFake(FakeServer):
    def __init__(self, api_key: str = "sk-ant-test-fake-key-0001") -> None:
        super().__init__()
        self.api_key = api_key
        self.answers: deque[Answer] = deque()
        self.default: Answer | None = None
        self.signatures: dict[str, str] = {}  # signature -> thinking text it signs
        self.redacted: set[str] = set()
        self.tool_inputs: dict[str, tuple[str, str | None]] = {}  # id -> (name, input JSON)
        # tool_use id -> the thinking / redacted blocks that came before it in its answer
        self.thinking_before: dict[str, list[dict[str, Any]]] = {}
        self.rejections: list[dict[str, Any]] = []
        self._ids = itertools.count(1)

    @property
    def base_url(self) -> str:
        return self.origin

    def add(self, *answers: Answer) -> AnthropicFake:
        self.answers.extend(answers)
        return self

    @property
    def message_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path.rstrip("/").endswith("/v1/messages")]

    # --- request handling ----------------------------------------------------------------

    def handle(self, request: RecordedRequest) -> JSONAnswer | SSEAnswer | RawHTTP:
        if request.method != "POST" or not request.path.rstrip("/").endswith("/v1/messages"):
            return JSONAnswer(404, Error(404, "not_found_error", "Not found").body())
        # ``x-api-key`` (classic SDKs) or ``Authorization: Bearer`` (newer SDKs, OAuth)
        given = request.headers.get("x-api-key") or request.headers.get(
            "authorization", ""
        ).removeprefix("Bearer ")
        if given != self.api_key:
            return self._reject(Error(401, "authentication_error", "invalid x-api-key"))
        if not request.headers.get("anthropic-version"):
            return self._reject(
                Error(400, "invalid_request_error", "anthropic-version: header is required")
            )
        try:
            self.validate(request.body)
        except _Invalid as exc:
            return self._reject(Error(400, "invalid_request_error", str(exc)))
        if self.answers:
            answer = self.answers.popleft()
        elif self.default is not None:
            answer = self.default
        else:
            return self._reject(
                Error(
                    400, "invalid_request_error", "fake: no scripted answer left for this request"
                )
            )
        return self._render(answer, request.json)

    def _reject(self, error: Error) -> JSONAnswer:
        self.rejections.append(error.body())
        return JSONAnswer(error.status, error.body(), error.headers)

    # --- validation ------------------------------------------------------------------------

    def validate(self, body: Any) -> None:
        """Raise _Invalid with the real API's message for the first rule ``body`` breaks."""
        if not isinstance(body, dict):
            raise _Invalid("Invalid JSON body")
        for name in ("model", "max_tokens", "messages"):
            if name not in body:
                raise _Invalid(f"{name}: Field required")
        if not isinstance(body["max_tokens"], int) or body["max_tokens"] < 1:
            raise _Invalid("max_tokens: Input should be a valid integer greater than 0")
        thinking = body.get("thinking")
        enabled = isinstance(thinking, dict) and thinking.get("type") == "enabled"
        if isinstance(thinking, dict) and enabled:
            budget = thinking.get("budget_tokens")
            if not isinstance(budget, int) or budget < 1024:
                raise _Invalid(
                    "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"
                )
            if body["max_tokens"] <= budget:
                raise _Invalid(
                    "`max_tokens` must be greater than `thinking.budget_tokens`. "
                    "Please consult our documentation at https://docs.claude.com/en/"
                    "docs/build-with-claude/extended-thinking#max-tokens-and-context-"
                    "window-size"
                )
        if "output_format" in body:  # the beta's name; the Messages API takes output_config
            raise _Invalid("output_format: Extra inputs are not permitted")
        if "output_config" in body:
            self._check_output_config(body["output_config"])
        temperature = body.get("temperature")
        if temperature is not None and not (
            isinstance(temperature, int | float) and 0 <= temperature <= 1
        ):
            raise _Invalid("temperature: Input should be less than or equal to 1")
        system = body.get("system")
        if system is not None and not isinstance(system, str):
            if not isinstance(system, list):
                raise _Invalid("system: Input should be a valid list")
            for k, block in enumerate(system):
                self._check_text(block, f"system.{k}")
        for k, tool in enumerate(body.get("tools") or ()):
            if not isinstance(tool, dict) or not re.match(
                r"^[a-zA-Z0-9_-]{1,128}$", str(tool.get("name", ""))
            ):
                raise _Invalid(
                    f"tools.{k}.custom.name: String should match pattern '^[a-zA-Z0-9_-]{{1,128}}$'"
                )
            if not isinstance(tool.get("input_schema"), dict):
                raise _Invalid(f"tools.{k}.custom.input_schema: Field required")
        messages = body["messages"]
        if not isinstance(messages, list) or not messages:
            raise _Invalid("messages: at least one message is required")
        previous_tool_uses: list[str] = []
        for i, m in enumerate(messages):
            role = m.get("role") if isinstance(m, dict) else None
            if role not in ("user", "assistant"):
                raise _Invalid(f"messages.{i}.role: Input should be 'user' or 'assistant'")
            if i == 0 and role != "user":
                raise _Invalid('messages: first message must use the "user" role')
            if i > 0 and messages[i - 1].get("role") == role:
                raise _Invalid(
                    'messages: roles must alternate between "user" and "assistant", '
                    f'but found multiple "{role}" roles in a row'
                )
            content = m.get("content")
            if isinstance(content, str):
                if not content.strip() and not (role == "assistant" and i == len(messages) - 1):
                    raise _Invalid(
                        f"messages.{i}: all messages must have non-empty content "
                        "except for the optional final assistant message"
                    )
                blocks: list[dict[str, Any]] = [{"type": "text", "text": content}]
            elif isinstance(content, list):
                blocks = content
                if not blocks and not (role == "assistant" and i == len(messages) - 1):
                    raise _Invalid(
                        f"messages.{i}: all messages must have non-empty content "
                        "except for the optional final assistant message"
                    )
            else:
                raise _Invalid(f"messages.{i}.content: Input should be a valid list")
            if role == "user":
                self._check_user(blocks, i, previous_tool_uses)
                previous_tool_uses = []
            else:
                if previous_tool_uses:
                    raise self._missing_results(i - 1, previous_tool_uses)
                previous_tool_uses = self._check_assistant(blocks, i, enabled)
        if previous_tool_uses:
            raise self._missing_results(len(messages) - 1, previous_tool_uses)
        if enabled:
            self._check_last_assistant(messages)

    @staticmethod
    def _check_output_config(config: Any) -> None:
        """``output_config``: ``effort`` and ``format`` only; a format is ``{"type":
        "json_schema", "schema": {...}}`` and nothing else (no ``name``, no ``strict``)."""
        if not isinstance(config, dict):
            raise _Invalid("output_config: Input should be a valid dictionary")
        for key in set(config) - {"effort", "format"}:
            raise _Invalid(f"output_config.{key}: Extra inputs are not permitted")
        found = config.get("format")
        if found is None:
            return
        if not isinstance(found, dict) or found.get("type") != "json_schema":
            raise _Invalid("output_config.format.type: Input should be 'json_schema'")
        for key in set(found) - {"type", "schema"}:
            raise _Invalid(f"output_config.format.{key}: Extra inputs are not permitted")
        if not isinstance(found.get("schema"), dict):
            raise _Invalid("output_config.format.schema: Field required")

    @staticmethod
    def _missing_results(i: int, ids: list[str]) -> _Invalid:
        return _Invalid(
            f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately "
            f"after: {', '.join(ids)}. Each `tool_use` block must have a corresponding "
            "`tool_result` block in the next message."
        )

    @staticmethod
    def _check_text(block: Any, where: str) -> None:
        if not isinstance(block, dict) or block.get("type") != "text":
            raise _Invalid(f"{where}.type: Input should be 'text'")
        text = block.get("text")
        if not isinstance(text, str):
            raise _Invalid(f"{where}.text: Field required")
        if not text:
            raise _Invalid("messages: text content blocks must be non-empty")
        if not text.strip():
            raise _Invalid("messages: text content blocks must contain non-whitespace text")

    def _check_image(self, block: dict[str, Any], where: str) -> None:
        source = block.get("source")
        if not isinstance(source, dict):
            raise _Invalid(f"{where}.source: Field required")
        if source.get("type") == "base64":
            if source.get("media_type") not in _MEDIA_TYPES:
                raise _Invalid(
                    f"{where}.source.base64.media_type: Input should be "
                    "'image/jpeg', 'image/png', 'image/gif' or 'image/webp'"
                )
            try:
                base64.b64decode(str(source.get("data")), validate=True)
            except (binascii.Error, ValueError):
                raise _Invalid(f"{where}.source.base64.data: Invalid base64 data") from None
        elif source.get("type") == "url":
            if not str(source.get("url", "")).startswith(("https://", "http://")):
                raise _Invalid(f"{where}.source.url.url: Invalid URL")
        else:
            raise _Invalid(
                f"{where}.source.type: Input tag '{source.get('type')}' found using "
                "'type' does not match any of the expected tags: 'base64', 'url'"
            )

    def _check_user(self, blocks: list[Any], i: int, tool_uses: list[str]) -> None:
        answered: list[str] = []
        for k, block in enumerate(blocks):
            where = f"messages.{i}.content.{k}"
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                self._check_text(block, where)
            elif kind == "image":
                self._check_image(block, where)
            elif kind == "tool_result":
                tool_use_id = block.get("tool_use_id")
                if tool_use_id not in tool_uses:
                    raise _Invalid(
                        f"{where}: unexpected `tool_use_id` found in `tool_result` blocks: "
                        f"{tool_use_id}. Each `tool_result` block must have a corresponding "
                        "`tool_use` block in the previous message."
                    )
                answered.append(tool_use_id)
                content = block.get("content")
                if isinstance(content, list):
                    for n, part in enumerate(content):
                        if isinstance(part, dict) and part.get("type") == "image":
                            self._check_image(part, f"{where}.content.{n}")
                        else:
                            self._check_text(part, f"{where}.content.{n}")
                elif content is not None and not isinstance(content, str):
                    raise _Invalid(f"{where}.content: Input should be a valid list")
                if "is_error" in block and not isinstance(block["is_error"], bool):
                    raise _Invalid(f"{where}.is_error: Input should be a valid boolean")
            else:
                raise _Invalid(
                    f"{where}.type: Input tag '{kind}' found using 'type' does not "
                    "match any of the expected tags"
                )
        missing = [t for t in tool_uses if t not in answered]
        if missing:
            raise self._missing_results(i - 1, missing)

    def _check_assistant(self, blocks: list[Any], i: int, enabled: bool) -> list[str]:
        tool_uses: list[str] = []
        thinking_so_far: list[dict[str, Any]] = []
        for k, block in enumerate(blocks):
            where = f"messages.{i}.content.{k}"
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                self._check_text(block, where)
            elif kind == "thinking":
                for name in ("thinking", "signature"):
                    if not isinstance(block.get(name), str):
                        raise _Invalid(f"{where}.thinking.{name}: Field required")
                if self.signatures.get(block["signature"]) != block["thinking"]:
                    raise _Invalid(f"{where}: Invalid `signature` in `thinking` block")
                thinking_so_far.append(block)
            elif kind == "redacted_thinking":
                if not isinstance(block.get("data"), str):
                    raise _Invalid(f"{where}.redacted_thinking.data: Field required")
                if block["data"] not in self.redacted:
                    raise _Invalid(f"{where}: Invalid `data` in `redacted_thinking` block")
                thinking_so_far.append(block)
            elif kind == "tool_use":
                tool_id = block.get("id")
                if not isinstance(tool_id, str) or not _ID_PATTERN.match(tool_id):
                    raise _Invalid(
                        f"{where}.tool_use.id: String should match pattern '^[a-zA-Z0-9_-]+$'"
                    )
                if not isinstance(block.get("name"), str) or not block["name"]:
                    raise _Invalid(f"{where}.tool_use.name: Field required")
                if not isinstance(block.get("input"), dict):
                    raise _Invalid(f"{where}.tool_use.input: Input should be a valid dictionary")
                if tool_id in tool_uses:
                    raise _Invalid(f"{where}: `tool_use` ids must be unique")
                issued = self.tool_inputs.get(tool_id)
                if issued is not None:
                    name, raw = issued
                    if block["name"] != name or (
                        raw is not None and json.dumps(block["input"]) != raw
                    ):
                        raise _Invalid(
                            f"fake: {where} does not replay tool_use {tool_id} as "
                            f"issued: sent {block['name']}({json.dumps(block['input'])})"
                            f", issued {name}({raw})"
                        )
                expected = self.thinking_before.get(tool_id)
                if enabled and expected and thinking_so_far[-len(expected) :] != expected:
                    raise _Invalid(
                        f"{where}.type: Expected `thinking` or `redacted_thinking`, but found "
                        "`tool_use`. When `thinking` is enabled, a final `assistant` message "
                        "must start with a thinking block (preceeding the lastmost set of "
                        "`tool_use` and `tool_result` blocks). We recommend you include "
                        "thinking blocks from previous turns. To avoid this requirement, "
                        "disable `thinking`. Please consult our documentation at "
                        "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
                    )
                tool_uses.append(tool_id)
            else:
                raise _Invalid(
                    f"{where}.type: Input tag '{kind}' found using 'type' does not "
                    "match any of the expected tags"
                )
        return tool_uses

    @staticmethod
    def _check_last_assistant(messages: list[dict[str, Any]]) -> None:
        """With thinking on, the assistant turn answered by the last tool results must start
        with a thinking block (the real API's rule)."""
        last = messages[-1]
        content = last.get("content")
        if last.get("role") != "user" or not isinstance(content, list) or len(messages) < 2:
            return
        if not any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
            return
        blocks = messages[-2].get("content")
        first = blocks[0] if isinstance(blocks, list) and blocks else {"type": "text"}
        if first.get("type") not in ("thinking", "redacted_thinking"):
            raise _Invalid(
                f"messages.{len(messages) - 2}.content.0.type: Expected `thinking` or "
                f"`redacted_thinking`, but found `{first.get('type')}`. When `thinking` is "
                "enabled, a final `assistant` message must start with a thinking block "
                "(preceeding the lastmost set of `tool_use` and `tool_result` blocks)."
            )

    # --- answers ---------------------------------------------------------------------------

    def _blocks(self, answer: Reply) -> list[tuple[dict[str, Any], str | None, Block]]:
        """(final content block, raw partial_json for tool_use, scripted block); records what
        was issued."""
        out: list[tuple[dict[str, Any], str | None, Block]] = []
        thinking_here: list[dict[str, Any]] = []
        for block in answer.blocks:
            if isinstance(block, Text):
                final: dict[str, Any] = {"type": "text", "text": block.text}
                out.append((final, None, block))
            elif isinstance(block, Thinking):
                signature = block.signature if block.signature is not None else sign(block.thinking)
                self.signatures[signature] = block.thinking
                final = {"type": "thinking", "thinking": block.thinking, "signature": signature}
                thinking_here.append(final)
                out.append((final, None, block))
            elif isinstance(block, Redacted):
                data = (
                    block.data
                    or base64.b64encode(f"redacted-{next(self._ids)}".encode() * 3).decode()
                )
                self.redacted.add(data)
                final = {"type": "redacted_thinking", "data": data}
                thinking_here.append(final)
                out.append((final, None, block))
            else:
                tool_id = block.id or f"toolu_{next(self._ids):04d}{'x' * 20}"
                raw = (
                    block.partial_json
                    if block.partial_json is not None
                    else json.dumps(dict(block.input or {}))
                )
                try:
                    parsed = json.loads(raw) if raw else {}
                except ValueError:
                    parsed = None  # cut at max_tokens: the real API can end like this
                self.tool_inputs[tool_id] = (
                    block.name,
                    json.dumps(parsed) if isinstance(parsed, dict) else None,
                )
                self.thinking_before[tool_id] = list(thinking_here)
                final = {
                    "type": "tool_use",
                    "id": tool_id,
                    "name": block.name,
                    "input": parsed if isinstance(parsed, dict) else {},
                }
                out.append((final, raw, block))
        return out

    def _render(self, answer: Answer, body: dict[str, Any]) -> JSONAnswer | SSEAnswer | RawHTTP:
        if isinstance(answer, RawHTTP):
            return answer
        if isinstance(answer, Error):
            return JSONAnswer(answer.status, answer.body(), answer.headers)
        if isinstance(answer, RawSSE):
            return SSEAnswer(
                [sse(data, event) for event, data in answer.events],
                cut_after=answer.cut_after,
                end_after=answer.end_after,
            )
        blocks = self._blocks(answer)
        has_tools = any(isinstance(b, ToolUse) for _, _, b in blocks)
        stop_reason = answer.stop_reason or ("tool_use" if has_tools else "end_turn")
        message_id = answer.id or f"msg_fake{next(self._ids):06d}"
        model = answer.model or body["model"]
        usage = {
            "input_tokens": answer.input_tokens,
            "cache_creation_input_tokens": answer.cache_creation_input_tokens,
            "cache_read_input_tokens": answer.cache_read_input_tokens,
            "output_tokens": answer.output_tokens,
        }
        if not body.get("stream"):
            return JSONAnswer(
                200,
                {
                    "id": message_id,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [final for final, _, _ in blocks],
                    "stop_reason": stop_reason,
                    "stop_sequence": None,
                    "usage": usage,
                },
                answer.headers,
            )

        events: list[bytes] = [
            sse(
                {
                    "type": "message_start",
                    "message": {
                        "id": message_id,
                        "type": "message",
                        "role": "assistant",
                        "model": model,
                        "content": [],
                        "stop_reason": None,
                        "stop_sequence": None,
                        "usage": {**usage, "output_tokens": 1},
                    },
                },
                "message_start",
            )
        ]
        if answer.ping:
            events.append(sse({"type": "ping"}, "ping"))

        def delta(index: int, payload: dict[str, Any]) -> bytes:
            return sse(
                {"type": "content_block_delta", "index": index, "delta": payload},
                "content_block_delta",
            )

        for index, (final, raw, scripted) in enumerate(blocks):
            kind = final["type"]
            if kind == "text":
                start: dict[str, Any] = {"type": "text", "text": ""}
            elif kind == "thinking":
                start = {"type": "thinking", "thinking": "", "signature": ""}
            elif kind == "redacted_thinking":
                start = final
            else:
                start = {"type": "tool_use", "id": final["id"], "name": final["name"], "input": {}}
            events.append(
                sse(
                    {"type": "content_block_start", "index": index, "content_block": start},
                    "content_block_start",
                )
            )
            if kind == "text":
                for piece in _pieces(final["text"], answer.chunk_size):
                    events.append(delta(index, {"type": "text_delta", "text": piece}))
            elif kind == "thinking":
                for piece in _pieces(final["thinking"], answer.chunk_size):
                    events.append(delta(index, {"type": "thinking_delta", "thinking": piece}))
                assert isinstance(scripted, Thinking)
                if scripted.stream_signature:
                    events.append(
                        delta(index, {"type": "signature_delta", "signature": final["signature"]})
                    )
            elif kind == "tool_use":
                for piece in list(_pieces(raw or "", answer.chunk_size)) or [""]:
                    events.append(delta(index, {"type": "input_json_delta", "partial_json": piece}))
            events.append(sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
            if answer.unknown_event and index == 0:
                events.append(
                    sse({"type": "future_event", "index": 0, "what": "ever"}, "future_event")
                )
        if answer.error_event is not None:
            error_type, message = answer.error_event
            position = len(events) if answer.error_after is None else answer.error_after
            events.insert(
                position,
                sse({"type": "error", "error": {"type": error_type, "message": message}}, "error"),
            )
            events = events[: position + 1]  # the real API ends the stream after an error
        else:
            events.append(
                sse(
                    {
                        "type": "message_delta",
                        "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                        "usage": usage,
                    },
                    "message_delta",
                )
            )
            events.append(sse({"type": "message_stop"}, "message_stop"))
        return SSEAnswer(
            events,
            headers=answer.headers,
            cut_after=answer.cut_after,
            end_after=answer.end_after,
            delay=answer.delay,
            malformed_at=answer.malformed_at,
        )


@pytest.fixture
def anthropic_fake() -> Iterator[AnthropicFake]:
    """A started :class:`AnthropicFake`; script it with ``anthropic_fake.add(...)``."""
    with AnthropicFake() as fake:
        yield fake
