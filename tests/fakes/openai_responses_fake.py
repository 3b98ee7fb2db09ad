"""A fake OpenAI Responses API server (``POST /v1/responses``): real HTTP on 127.0.0.1,
scripted answers, stateless like a ``store: false`` deployment.

Usage::

    with ResponsesFake() as fake:                    # or the ``responses_fake`` fixture
        fake.add(Reply([Reasoning("Plan."), Text("hi")]))
        fake.add(Reply([Reasoning(""), Call("get", '{"q": 1}')]))
        fake.add(Error.rate_limit(retry_after="2"))                  # openai_fake's errors
        fake.add(Reply([Text("so far")], failed=("server_error", "The server had an error")))
        fake.add(Reply([Text("a long answer")], malformed_at=5))     # event 5: cut JSON
        fake.add(RawSSE([{"type": "response.created", ...}]))       # any events, any order
        provider = OpenAIResponsesProvider(api_key=fake.api_key, base_url=fake.base_url, ...)
        fake.response_requests[-1].json["input"]     # what the provider sent

Each request is validated the way the real API does it (:meth:`ResponsesFake.validate`); a
request that breaks a rule gets the real 400 error shape and does NOT consume a scripted
answer. The rules a stateless client meets:

- ``store`` must be ``false`` (this fake keeps nothing: an item it would have to look up by id
  is an error), and a request that sends ``reasoning`` items must ``include``
  ``reasoning.encrypted_content``;
- unknown fields are refused, at the top level, in tools (flat ``{"type": "function", "name",
  "parameters", "strict"}``, not Chat Completions' nested shape), in ``text.format`` and in
  every input item;
- a ``reasoning`` item must be one this fake issued, replayed exactly: its ``id``, ``summary``
  and ``encrypted_content`` byte for byte (every one it issued is remembered), followed by
  another output item of the same answer, never last;
- every ``function_call`` is answered by a ``function_call_output`` with its ``call_id``, and
  every output answers a call before it; a call it issued comes back with its name and raw
  ``arguments`` byte for byte.

A valid request takes the next scripted answer, sent as SSE events in the real order when the
request has ``"stream": true`` (every event with its ``sequence_number``) and as one response
object otherwise. With the queue empty the fake answers ``default`` if set, else a 400.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import json
import re
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from ._server import FakeServer, JSONAnswer, RawHTTP, RecordedRequest, SSEAnswer, html_page
from ._server import pieces as _pieces
from .openai_fake import Error

__all__ = [
    "Call",
    "Error",
    "RawHTTP",
    "RawSSE",
    "Reasoning",
    "Refusal",
    "Reply",
    "ResponsesFake",
    "Text",
    "html_page",
    "overflow",
    "responses_fake",
]

_SECRET = b"fake-openai-reasoning-key"
_TOP_LEVEL = frozenset(
    {
        "model",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "store",
        "include",
        "stream",
        "max_output_tokens",
        "temperature",
        "top_p",
        "text",
        "reasoning",
        "metadata",
        "truncation",
        "user",
        "prompt_cache_key",
        "service_tier",
    }
)
_INCLUDABLE = frozenset(
    {
        "reasoning.encrypted_content",
        "message.output_text.logprobs",
        "web_search_call.action.sources",
        "code_interpreter_call.outputs",
        "file_search_call.results",
        "message.input_image.image_url",
        "computer_call_output.output.image_url",
    }
)
#: the fields each input item may have (beyond ``type``)
_ITEM_FIELDS = {
    "message": {"role", "content", "id", "status", "phase"},
    "reasoning": {"id", "summary", "encrypted_content", "content", "status"},
    "function_call": {"call_id", "name", "arguments", "id", "status"},
    "function_call_output": {"call_id", "output", "id", "status"},
}
_ASSISTANT_SIDE = ("reasoning", "function_call")


def encrypt(item_id: str, summary: str) -> str:
    """The fake's ``encrypted_content`` of a reasoning item (opaque, like the real one)."""
    digest = hmac.new(_SECRET, f"{item_id}\x00{summary}".encode(), hashlib.sha256).digest()
    return "gAAAAB" + base64.urlsafe_b64encode(digest * 4).decode()


@dataclass
class Text:
    text: str


@dataclass
class Refusal:
    refusal: str


@dataclass
class Reasoning:
    """A reasoning item; ``summary`` parts are separate ``summary_text`` entries."""

    summary: str | Sequence[str] = ()
    encrypted: bool = True  # False: an item without encrypted_content even when asked for it

    @property
    def parts(self) -> list[str]:
        if isinstance(self.summary, str):
            return [self.summary] if self.summary else []
        return list(self.summary)


@dataclass
class Call:
    name: str
    arguments: str  # raw, sent exactly like this (may be invalid JSON)
    call_id: str | None = None  # default: a fresh ``call_...`` id


Item = Text | Refusal | Reasoning | Call


@dataclass
class Reply:
    """One scripted model answer (rendered as SSE or JSON, as the request asks)."""

    items: Sequence[Item] = ()
    input_tokens: int = 40
    output_tokens: int = 9
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    incomplete: str | None = None  # incomplete_details.reason: "max_output_tokens", ...
    failed: tuple[str, str] | None = None  # (code, message): response.failed instead of the end
    error_event: tuple[str, str] | None = None  # (code, message): an ``error`` event instead
    model: str | None = None  # default: the requested model
    id: str | None = None
    # --- stream shape
    chunk_size: int = 4  # characters per text / summary / argument fragment
    whole_items: bool = False  # no deltas: every item only in its output_item.done
    cut_after: int | None = None  # drop the connection after N SSE events
    end_after: int | None = None  # end the body cleanly after N events (no response.completed)
    malformed_at: int | None = None  # event N goes out with its JSON cut in the middle
    delay: float = 0.0


@dataclass
class RawSSE:
    """Arbitrary events, each sent as ``event: TYPE`` with the object as its data."""

    events: Sequence[Any]
    cut_after: int | None = None
    end_after: int | None = None


Answer = Reply | Error | RawSSE | RawHTTP


def overflow() -> Error:
    """The Responses API's answer to an input longer than the model's window."""
    return Error(
        400,
        "Your input exceeds the context window of this model. Please adjust your input and "
        "try again.",
        code="context_length_exceeded",
        param="input",
    )


def _event(data: Any) -> bytes:
    kind = data.get("type") if isinstance(data, dict) else None
    head = f"event: {kind}\n" if isinstance(kind, str) else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


class ResponsesFake(FakeServer):
    def __init__(self, api_key: str = "sk-test-fake-responses-0001") -> None:
        super().__init__()
        self.api_key = api_key
        self.answers: deque[Answer] = deque()
        self.default: Answer | None = None
        self.reasoning: dict[str, dict[str, Any]] = {}  # id -> the reasoning item as issued
        self.calls: dict[str, tuple[str, str]] = {}  # call_id -> (name, raw arguments)
        self.rejections: list[dict[str, Any]] = []
        self._ids = itertools.count(1)

    @property
    def base_url(self) -> str:
        return f"{self.origin}/v1"

    def add(self, *answers: Answer) -> ResponsesFake:
        self.answers.extend(answers)
        return self

    @property
    def response_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path.rstrip("/").endswith("/responses")]

    # --- request handling ----------------------------------------------------------------

    def handle(self, request: RecordedRequest) -> JSONAnswer | SSEAnswer | RawHTTP:
        if request.method != "POST" or not request.path.rstrip("/").endswith("/responses"):
            error = Error(404, f"Invalid URL ({request.method} {request.path})", code=None)
            return JSONAnswer(404, error.body())
        auth = request.headers.get("authorization", "")
        if auth != f"Bearer {self.api_key}":
            given = auth.removeprefix("Bearer ")
            masked = f"{given[:3]}{'*' * 6}{given[-4:]}" if len(given) > 8 else "***"
            return self._reject(
                Error(401, f"Incorrect API key provided: {masked}.", code="invalid_api_key")
            )
        problem = self.validate(request.body)
        if problem is not None:
            return self._reject(problem)
        if self.answers:
            answer = self.answers.popleft()
        elif self.default is not None:
            answer = self.default
        else:
            return self._reject(Error(400, "fake: no scripted answer left for this request"))
        return self._render(answer, request.json)

    def _reject(self, error: Error) -> JSONAnswer:
        self.rejections.append(error.body())
        return JSONAnswer(error.status, error.body(), error.headers)

    def validate(self, body: Any) -> Error | None:
        """The first rule of the real API (for a stateless client) the request breaks."""

        def bad(message: str, param: str | None = None, code: str | None = None) -> Error:
            return Error(400, message, param=param, code=code)

        if not isinstance(body, dict):
            return bad("We could not parse the JSON body of your request.")
        unknown = sorted(set(body) - _TOP_LEVEL)
        if unknown:
            return bad(f"Unknown parameter: '{unknown[0]}'.", unknown[0], "unknown_parameter")
        if not isinstance(body.get("model"), str) or not body["model"]:
            return bad(
                "Missing required parameter: 'model'.", "model", "missing_required_parameter"
            )
        if body.get("store") is not False:
            return bad(
                "fake: this server keeps nothing; send 'store': false and the whole context.",
                "store",
            )
        include = body.get("include", [])
        if not isinstance(include, list) or any(i not in _INCLUDABLE for i in include):
            return bad("Invalid value for 'include'.", "include", "invalid_value")
        for name, kind in (("instructions", str), ("stream", bool)):
            if name in body and not isinstance(body[name], kind):
                return bad(f"Invalid type for '{name}'.", name, "invalid_type")
        temperature = body.get("temperature")
        if temperature is not None and not (
            isinstance(temperature, int | float) and 0 <= temperature <= 2
        ):
            return bad("Invalid 'temperature': expected a number in [0, 2].", "temperature")
        limit = body.get("max_output_tokens")
        if limit is not None and not (isinstance(limit, int) and limit >= 16):
            return bad(
                f"Invalid 'max_output_tokens': integer below minimum value. Expected a value "
                f">= 16, but got {limit} instead.",
                "max_output_tokens",
                "integer_below_min_value",
            )
        for i, tool in enumerate(body.get("tools") or ()):
            problem = _tool_problem(tool)
            if problem is not None:
                return bad(problem, f"tools[{i}]")
        if "text" in body:
            problem = _text_problem(body["text"])
            if problem is not None:
                return bad(problem, "text.format")
        items = body.get("input")
        if isinstance(items, str):
            return None
        if not isinstance(items, list):
            return bad(
                "Missing required parameter: 'input'.", "input", "missing_required_parameter"
            )
        return self._check_items(items, "reasoning.encrypted_content" in include)

    def _check_items(self, items: list[Any], encrypted: bool) -> Error | None:
        calls: dict[str, int] = {}  # call_id -> where, waiting for its output
        for i, item in enumerate(items):
            where = f"input[{i}]"
            if not isinstance(item, dict):
                return Error(400, f"Invalid type for '{where}'.", param=where)
            kind = item.get("type", "message" if "role" in item else None)
            if kind not in _ITEM_FIELDS:
                return Error(400, f"Invalid value: '{kind}'.", param=f"{where}.type")
            unknown = sorted(set(item) - _ITEM_FIELDS[kind] - {"type"})
            if unknown:
                return Error(
                    400,
                    f"Unknown parameter: '{where}.{unknown[0]}'.",
                    param=f"{where}.{unknown[0]}",
                    code="unknown_parameter",
                )
            if kind == "message":
                problem = _message_problem(item, where)
            elif kind == "reasoning":
                problem = self._reasoning_problem(item, where, encrypted)
                following = items[i + 1] if i + 1 < len(items) else None
                if problem is None and not _assistant_side(following):
                    problem = (
                        f"Item '{item.get('id')}' of type 'reasoning' was provided without its "
                        "required following item."
                    )
            elif kind == "function_call":
                problem = self._call_problem(item, where)
                if problem is None:
                    calls[item["call_id"]] = i
            else:
                call_id = item.get("call_id")
                if call_id not in calls:
                    problem = f"No tool call found for function call output with call_id {call_id}."
                else:
                    del calls[call_id]
                    problem = _output_problem(item.get("output"), where)
            if problem is not None:
                return Error(400, problem, param=where)
        if calls:
            call_id, at = next(iter(calls.items()))
            return Error(
                400, f"No tool output found for function call {call_id}.", param=f"input[{at}]"
            )
        return None

    def _reasoning_problem(self, item: dict[str, Any], where: str, encrypted: bool) -> str | None:
        if not encrypted:
            return (
                "fake: reasoning items sent statelessly need include "
                "['reasoning.encrypted_content']."
            )
        issued = self.reasoning.get(item.get("id"))  # type: ignore[arg-type]
        if issued is None or not item.get("encrypted_content"):
            return (
                f"Item with id '{item.get('id')}' not found. Items are not persisted when "
                "`store` is set to false. Try again with `store` set to true, or remove this "
                "item from your input."
            )
        if item != issued:
            return (
                f"fake: '{where}' does not replay reasoning item {item.get('id')} as issued "
                "(the encrypted content could not be verified)."
            )
        return None

    def _call_problem(self, item: dict[str, Any], where: str) -> str | None:
        call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
        if not (isinstance(call_id, str) and call_id and isinstance(name, str) and name):
            return f"Missing required parameter: '{where}.call_id' or '{where}.name'."
        if not isinstance(arguments, str):
            return f"Invalid type for '{where}.arguments': expected a string."
        issued = self.calls.get(call_id)
        if issued is not None and issued != (name, arguments):
            return (
                f"fake: '{where}' does not replay the call as issued: sent {name}({arguments!r}), "
                f"issued {issued[0]}({issued[1]!r})"
            )
        return None

    # --- answers ---------------------------------------------------------------------------

    def _render(self, answer: Answer, body: dict[str, Any]) -> JSONAnswer | SSEAnswer | RawHTTP:
        if isinstance(answer, RawHTTP):
            return answer
        if isinstance(answer, Error):
            return JSONAnswer(answer.status, answer.body(), answer.headers)
        if isinstance(answer, RawSSE):
            return SSEAnswer(
                [_event(e) for e in answer.events],
                cut_after=answer.cut_after,
                end_after=answer.end_after,
            )
        encrypted = "reasoning.encrypted_content" in body.get("include", [])
        output = [self._issue(item, encrypted) for item in answer.items]
        response = self._response(answer, body, output)
        if not body.get("stream"):
            if answer.failed is not None:
                response["status"] = "failed"
                response["error"] = {"code": answer.failed[0], "message": answer.failed[1]}
            return JSONAnswer(200, response)
        return SSEAnswer(
            self._events(answer, response, output),
            cut_after=answer.cut_after,
            end_after=answer.end_after,
            delay=answer.delay,
            malformed_at=answer.malformed_at,
        )

    def _issue(self, item: Item, encrypted: bool) -> dict[str, Any]:
        """The complete output item for ``item``; reasoning items and calls are remembered."""
        n = next(self._ids)
        if isinstance(item, Reasoning):
            item_id = f"rs_{n:04d}{'f' * 44}"
            out: dict[str, Any] = {
                "id": item_id,
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": t} for t in item.parts],
            }
            if encrypted and item.encrypted:
                out["encrypted_content"] = encrypt(item_id, "".join(item.parts))
            self.reasoning[item_id] = out
            return out
        if isinstance(item, Call):
            call_id = item.call_id or f"call_{n:04d}{'c' * 20}"
            self.calls[call_id] = (item.name, item.arguments)
            return {
                "id": f"fc_{n:04d}",
                "type": "function_call",
                "status": "completed",
                "arguments": item.arguments,
                "call_id": call_id,
                "name": item.name,
            }
        part: dict[str, Any] = (
            {"type": "output_text", "annotations": [], "logprobs": [], "text": item.text}
            if isinstance(item, Text)
            else {"type": "refusal", "refusal": item.refusal}
        )
        return {
            "id": f"msg_{n:04d}",
            "type": "message",
            "status": "completed",
            "content": [part],
            "role": "assistant",
        }

    def _response(
        self, answer: Reply, body: dict[str, Any], output: list[dict[str, Any]]
    ) -> dict[str, Any]:
        return {
            "id": answer.id or f"resp_{next(self._ids):06d}",
            "object": "response",
            "created_at": int(time.time()),
            "status": "incomplete" if answer.incomplete else "completed",
            "error": None,
            "incomplete_details": {"reason": answer.incomplete} if answer.incomplete else None,
            "instructions": body.get("instructions"),
            "model": answer.model or body["model"],
            "output": output,
            "store": False,
            "usage": {
                "input_tokens": answer.input_tokens,
                "input_tokens_details": {"cached_tokens": answer.cached_tokens},
                "output_tokens": answer.output_tokens,
                "output_tokens_details": {"reasoning_tokens": answer.reasoning_tokens},
                "total_tokens": answer.input_tokens + answer.output_tokens,
            },
        }

    def _events(
        self, answer: Reply, response: dict[str, Any], output: list[dict[str, Any]]
    ) -> list[bytes]:
        seq = itertools.count()
        events: list[bytes] = []

        def emit(kind: str, **fields: Any) -> None:
            events.append(_event({"type": kind, "sequence_number": next(seq), **fields}))

        opening = {**response, "status": "in_progress", "output": [], "usage": None}
        emit("response.created", response=opening)
        emit("response.in_progress", response=opening)
        for at, item in enumerate(output):
            emit("response.output_item.added", output_index=at, item=_opened(item))
            if not answer.whole_items:
                _deltas(emit, at, item, answer.chunk_size)
            emit("response.output_item.done", output_index=at, item=item)
        if answer.error_event is not None:
            code, message = answer.error_event
            emit("error", code=code, message=message, param=None)
        elif answer.failed is not None:
            code, message = answer.failed
            failed = {**response, "status": "failed", "error": {"code": code, "message": message}}
            emit("response.failed", response=failed)
        else:
            kind = "response.incomplete" if answer.incomplete else "response.completed"
            emit(kind, response=response)
        return events


def _opened(item: dict[str, Any]) -> dict[str, Any]:
    """An item as ``response.output_item.added`` shows it: nothing of its content yet."""
    kind = item["type"]
    if kind == "reasoning":
        return {"id": item["id"], "type": "reasoning", "summary": []}
    if kind == "function_call":
        return {**item, "status": "in_progress", "arguments": ""}
    return {**item, "status": "in_progress", "content": []}


def _deltas(emit: Any, at: int, item: dict[str, Any], size: int) -> None:
    kind, item_id = item["type"], item["id"]
    if kind == "reasoning":
        for k, part in enumerate(item["summary"]):
            emit(
                "response.reasoning_summary_part.added",
                item_id=item_id,
                output_index=at,
                summary_index=k,
                part={"type": "summary_text", "text": ""},
            )
            for piece in _pieces(part["text"], size):
                emit(
                    "response.reasoning_summary_text.delta",
                    item_id=item_id,
                    output_index=at,
                    summary_index=k,
                    delta=piece,
                )
            emit(
                "response.reasoning_summary_text.done",
                item_id=item_id,
                output_index=at,
                summary_index=k,
                text=part["text"],
            )
            emit(
                "response.reasoning_summary_part.done",
                item_id=item_id,
                output_index=at,
                summary_index=k,
                part=part,
            )
    elif kind == "function_call":
        for piece in _pieces(item["arguments"], size):
            emit(
                "response.function_call_arguments.delta",
                item_id=item_id,
                output_index=at,
                delta=piece,
            )
        emit(
            "response.function_call_arguments.done",
            item_id=item_id,
            output_index=at,
            arguments=item["arguments"],
        )
    else:
        part = item["content"][0]
        refusal = part["type"] == "refusal"
        text = part["refusal"] if refusal else part["text"]
        empty = {"type": "refusal", "refusal": ""} if refusal else {**part, "text": ""}
        where = {"item_id": item_id, "output_index": at, "content_index": 0}
        emit("response.content_part.added", **where, part=empty)
        delta = "response.refusal.delta" if refusal else "response.output_text.delta"
        for piece in _pieces(text, size):
            emit(delta, **where, delta=piece)
        emit(
            "response.refusal.done" if refusal else "response.output_text.done",
            **where,
            **({"refusal": text} if refusal else {"text": text}),
        )
        emit("response.content_part.done", **where, part=part)


def _assistant_side(item: Any) -> bool:
    """May this item follow a reasoning item (another item of the model's output)?"""
    if not isinstance(item, dict):
        return False
    kind = item.get("type", "message" if "role" in item else None)
    return kind in _ASSISTANT_SIDE or (kind == "message" and item.get("role") == "assistant")


def _tool_problem(tool: Any) -> str | None:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        return "Invalid value for 'type': only function tools are supported by this fake."
    if "function" in tool:
        return "Unknown parameter: 'function' (the Responses API's function tools are flat)."
    unknown = sorted(set(tool) - {"type", "name", "description", "parameters", "strict"})
    if unknown:
        return f"Unknown parameter: '{unknown[0]}'."
    if not isinstance(tool.get("name"), str) or not re.fullmatch(
        r"[a-zA-Z0-9_-]{1,64}", tool["name"]
    ):
        return "Invalid 'name': expected a string matching '^[a-zA-Z0-9_-]+$'."
    if not isinstance(tool.get("parameters"), dict):
        return "Missing required parameter: 'parameters'."
    if "strict" in tool and not isinstance(tool["strict"], bool):
        return "Invalid type for 'strict': expected a boolean."
    return None


def _text_problem(text: Any) -> str | None:
    """``text``: ``{"format": text | json_object | json_schema}``; json_schema with a ``name``
    (``^[a-zA-Z0-9_-]{1,64}$``), a ``schema`` object, optional ``strict`` and ``description``."""
    if not isinstance(text, dict) or set(text) - {"format", "verbosity"}:
        return "Invalid 'text': expected an object with 'format'."
    spec = text.get("format")
    if not isinstance(spec, dict) or spec.get("type") not in ("text", "json_object", "json_schema"):
        return "Invalid 'text.format.type'."
    if spec["type"] != "json_schema":
        return None if set(spec) == {"type"} else "Unknown parameter in 'text.format'."
    unknown = sorted(set(spec) - {"type", "name", "schema", "strict", "description"})
    if unknown:
        return f"Unknown parameter: 'text.format.{unknown[0]}'."
    if not isinstance(spec.get("name"), str) or not re.fullmatch(
        r"[a-zA-Z0-9_-]{1,64}", spec["name"]
    ):
        return "Invalid 'text.format.name'."
    if not isinstance(spec.get("schema"), dict):
        return "Invalid type for 'text.format.schema': expected an object."
    if "strict" in spec and not isinstance(spec["strict"], bool):
        return "Invalid type for 'text.format.strict': expected a boolean."
    return None


def _parts_problem(content: Any, where: str, allowed: tuple[str, ...]) -> str | None:
    if isinstance(content, str):
        return None
    if not isinstance(content, list):
        return f"Invalid type for '{where}': expected a string or an array."
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        at = f"{where}[{k}]"
        if kind not in allowed:
            return f"Invalid value: '{kind}'. Supported values are: {', '.join(allowed)}. ({at})"
        if kind in ("input_text", "output_text") and not isinstance(part.get("text"), str):
            return f"Missing required parameter: '{at}.text'."
        if kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str) or not (
                url.startswith(("https://", "http://"))
                or (url.startswith("data:image/") and ";base64," in url)
            ):
                return f"Invalid '{at}.image_url'. Expected a valid URL or a base64 data URL."
            if part.get("detail") not in ("auto", "low", "high"):
                return f"Invalid value for '{at}.detail'."
        extra = set(part) - {
            "type",
            "text",
            "refusal",
            "image_url",
            "detail",
            "annotations",
            "logprobs",
        }
        if extra:
            return f"Unknown parameter: '{at}.{sorted(extra)[0]}'."
    return None


def _message_problem(item: dict[str, Any], where: str) -> str | None:
    role = item.get("role")
    if role in ("user", "system", "developer"):
        return _parts_problem(
            item.get("content"), f"{where}.content", ("input_text", "input_image")
        )
    if role == "assistant":
        return _parts_problem(item.get("content"), f"{where}.content", ("output_text", "refusal"))
    return (
        f"Invalid value: '{role}'. Supported values are: 'user', 'assistant', 'system', and "
        "'developer'."
    )


def _output_problem(output: Any, where: str) -> str | None:
    return _parts_problem(output, f"{where}.output", ("input_text", "input_image"))


@pytest.fixture
def responses_fake() -> Iterator[ResponsesFake]:
    """A started :class:`ResponsesFake`; script it with ``responses_fake.add(...)``."""
    with ResponsesFake() as fake:
        yield fake
