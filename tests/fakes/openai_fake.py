"""A fake OpenAI Chat Completions server: real HTTP on 127.0.0.1, scripted answers.

Usage::

    with OpenAIFake() as fake:                       # or the ``openai_fake`` fixture
        fake.add(Reply(text="hello"))
        fake.add(Reply(tool_calls=[ToolCall("get", '{"q": 1}')]))
        fake.add(Error.rate_limit(retry_after="2"))
        fake.add(Reply(text="partial answer", malformed_at=3))      # event 3: cut JSON
        fake.add(RawSSE(['{"id": "x", "choices": [{"delta": {"content": "bro']))
        fake.add(html_page(200, "Sign in"))                          # RawHTTP: any answer
        provider = OpenAIProvider(api_key=fake.api_key, base_url=fake.base_url, model="gpt-x")
        ...
        fake.requests[-1].json["messages"]           # what the provider sent

Each POST to ``/v1/chat/completions`` is validated the way the real API does it (see
:meth:`OpenAIFake.validate`); a request that breaks a rule gets the real 400 error shape and
does NOT consume a scripted answer. A valid request takes the next scripted answer; it is
sent as SSE when the request has ``"stream": true`` (usage chunk only with
``stream_options.include_usage``) and as one JSON body otherwise. With the queue empty the
fake answers ``default`` if set, else a 400 saying the script ran out.

The fake remembers every tool call it issued (id -> name and raw ``arguments``) and refuses a
replay whose arguments differ byte for byte.
"""

from __future__ import annotations

import itertools
import re
import time
import uuid
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from ._server import FakeServer, JSONAnswer, RawHTTP, RecordedRequest, SSEAnswer, html_page, sse
from ._server import pieces as _pieces

__all__ = [
    "Error",
    "OpenAIFake",
    "RawHTTP",
    "RawSSE",
    "Reply",
    "ToolCall",
    "html_page",
    "openai_fake",
]


@dataclass
class ToolCall:
    name: str
    arguments: str  # raw, sent exactly like this (may be invalid JSON)
    id: str | None = None  # default: a fresh ``call_...`` id


@dataclass
class Reply:
    """One scripted model answer (rendered as SSE or JSON, as the request asks)."""

    text: str = ""
    tool_calls: Sequence[ToolCall] = ()
    reasoning: str = ""  # sent as ``reasoning_content`` (vLLM / DeepSeek style)
    refusal: str = ""  # sent as ``refusal`` (structured outputs: the model declined)
    finish_reason: str | None = None  # default: "tool_calls" if tool calls else "stop"
    prompt_tokens: int = 11
    completion_tokens: int = 7
    cached_tokens: int | None = None  # prompt_tokens_details.cached_tokens when set
    model: str | None = None  # default: the requested model
    id: str | None = None
    # --- stream shape
    chunk_size: int = 3  # characters per text / argument fragment
    omit_index: bool = False  # Ollama style: tool-call deltas without ``index``
    omit_id: bool = False  # tool calls without ``id`` at all
    usage_in_last_choice_chunk: bool = False  # usage on the finish chunk (some servers)
    stream_error: Mapping[str, Any] | None = None  # ``{"error": {...}}`` chunk instead of finish
    cut_after: int | None = None  # drop the connection after N SSE events
    end_after: int | None = None  # end the body cleanly after N events (no finish / [DONE])
    malformed_at: int | None = None  # event N goes out with its JSON cut in the middle
    delay: float = 0.0  # seconds before each SSE event
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass
class Error:
    """A scripted HTTP error answer with the real OpenAI body shape."""

    status: int
    message: str
    type: str = "invalid_request_error"
    code: str | None = None
    param: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    @classmethod
    def overflow(cls) -> Error:
        return cls(
            400,
            "This model's maximum context length is 128000 tokens. However, your messages "
            "resulted in 131072 tokens. Please reduce the length of the messages.",
            code="context_length_exceeded",
            param="messages",
        )

    @classmethod
    def rate_limit(cls, retry_after: str | None = "1", retry_after_ms: str | None = None) -> Error:
        headers = {}
        if retry_after is not None:
            headers["retry-after"] = retry_after
        if retry_after_ms is not None:
            headers["retry-after-ms"] = retry_after_ms
        return cls(
            429,
            "Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): "
            "Limit 30000, Used 30000, Requested 100. Please try again in 200ms.",
            type="tokens",
            code="rate_limit_exceeded",
            headers=headers,
        )

    @classmethod
    def server(cls, status: int = 500) -> Error:
        return cls(
            status,
            "The server had an error while processing your request. Sorry about that!",
            type="server_error",
        )

    @classmethod
    def not_found(cls, model: str = "no-such-model") -> Error:
        return cls(
            404,
            f"The model `{model}` does not exist or you do not have access to it.",
            code="model_not_found",
        )


@dataclass
class RawSSE:
    """Arbitrary SSE event bodies (``data:`` payloads), sent as they are."""

    payloads: Sequence[Any]
    cut_after: int | None = None
    end_after: int | None = None


Answer = Reply | Error | RawSSE | RawHTTP


class OpenAIFake(FakeServer):
    def __init__(self, api_key: str = "sk-test-fake-key-0001", model: str = "gpt-fake") -> None:
        super().__init__()
        self.api_key = api_key
        self.model = model
        self.answers: deque[Answer] = deque()
        self.default: Answer | None = None
        self.issued: dict[str, tuple[str, str]] = {}  # call id -> (name, raw arguments)
        self.rejections: list[dict[str, Any]] = []  # the 4xx bodies the validator sent
        self._ids = itertools.count(1)

    @property
    def base_url(self) -> str:
        return f"{self.origin}/v1"

    def add(self, *answers: Answer) -> OpenAIFake:
        self.answers.extend(answers)
        return self

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    # --- request handling ----------------------------------------------------------------

    def handle(self, request: RecordedRequest) -> JSONAnswer | SSEAnswer | RawHTTP:
        if request.method != "POST" or not request.path.rstrip("/").endswith("/chat/completions"):
            return JSONAnswer(
                404,
                Error(
                    404, f"Invalid URL ({request.method} {request.path})", code="unknown_url"
                ).body(),
            )
        auth = request.headers.get("authorization", "")
        if auth != f"Bearer {self.api_key}":
            given = auth.removeprefix("Bearer ")
            masked = f"{given[:3]}{'*' * 6}{given[-4:]}" if len(given) > 8 else "***"
            return self._reject(
                401,
                Error(
                    401,
                    f"Incorrect API key provided: {masked}. You can find your API key at "
                    "https://platform.openai.com/account/api-keys.",
                    code="invalid_api_key",
                ),
            )
        problem = self.validate(request.body)
        if problem is not None:
            return self._reject(400, problem)
        if self.answers:
            answer = self.answers.popleft()
        elif self.default is not None:
            answer = self.default
        else:
            return self._reject(400, Error(400, "fake: no scripted answer left for this request"))
        return self._render(answer, request.json)

    def _reject(self, status: int, error: Error) -> JSONAnswer:
        self.rejections.append(error.body())
        return JSONAnswer(status, error.body(), error.headers)

    def validate(self, body: Any) -> Error | None:
        """The first rule of the real API the request breaks, as its 400 error."""

        def bad(message: str, param: str | None = None, code: str | None = None) -> Error:
            return Error(400, message, param=param, code=code)

        if not isinstance(body, dict):
            return bad("We could not parse the JSON body of your request.")
        if not isinstance(body.get("model"), str) or not body["model"]:
            return bad("you must provide a model parameter")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return bad("[] is too short - 'messages'", "messages", "empty_array")
        if "stream_options" in body and not body.get("stream"):
            return bad(
                "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                "stream_options",
            )
        if "response_format" in body:
            problem = self._check_response_format(body["response_format"])
            if problem is not None:
                return bad(problem, "response_format")
        temperature = body.get("temperature")
        if temperature is not None and not (
            isinstance(temperature, int | float) and 0 <= temperature <= 2
        ):
            return bad("Invalid 'temperature': expected a number in [0, 2].", "temperature")
        for i, tool in enumerate(body.get("tools") or ()):
            fn = tool.get("function") if isinstance(tool, dict) else None
            if tool.get("type") != "function" or not isinstance(fn, dict) or not fn.get("name"):
                return bad(f"Invalid 'tools[{i}]'.", f"tools[{i}]")
        pending: dict[str, str] = {}  # tool_call_id -> name, waiting for its tool message
        owner = -1
        for i, m in enumerate(messages):
            role = m.get("role") if isinstance(m, dict) else None
            if role not in ("system", "developer", "user", "assistant", "tool"):
                return bad(
                    f"Invalid value: '{role}'. Supported values are: 'system', "
                    "'assistant', 'user', 'tool', and 'developer'.",
                    f"messages[{i}].role",
                    "invalid_value",
                )
            if role != "tool" and pending:
                return bad(
                    "An assistant message with 'tool_calls' must be followed by tool messages "
                    "responding to each 'tool_call_id'. The following tool_call_ids did not "
                    f"have response messages: {', '.join(pending)}",
                    f"messages.[{owner}].role",
                )
            if role == "tool":
                call_id = m.get("tool_call_id")
                if call_id not in pending:
                    return bad(
                        "Invalid parameter: messages with role 'tool' must be a response "
                        "to a preceeding message with 'tool_calls'.",
                        f"messages.[{i}].role",
                    )
                del pending[call_id]
                problem = self._check_content(m.get("content"), i, images=False)
            elif role == "assistant":
                problem = self._check_assistant(m, i)
                for call in m.get("tool_calls") or ():
                    pending[call["id"]] = call["function"]["name"]
                owner = i
            else:
                problem = self._check_content(m.get("content"), i, images=role == "user")
            if problem is not None:
                return problem
        if pending:
            return bad(
                "An assistant message with 'tool_calls' must be followed by tool messages "
                "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                f"response messages: {', '.join(pending)}",
                f"messages.[{owner}].role",
            )
        return None

    @staticmethod
    def _check_response_format(value: Any) -> str | None:
        """Chat Completions' ``response_format``: text, json_object, or json_schema with a
        ``json_schema`` object holding a ``name`` (``^[a-zA-Z0-9_-]{1,64}$``), a ``schema``
        object and an optional boolean ``strict``; nothing else."""
        if not isinstance(value, dict) or value.get("type") not in (
            "text",
            "json_object",
            "json_schema",
        ):
            return "Invalid 'response_format.type'."
        if value["type"] != "json_schema":
            return None if set(value) == {"type"} else "Unknown parameter in 'response_format'."
        spec = value.get("json_schema")
        if set(value) != {"type", "json_schema"} or not isinstance(spec, dict):
            return "Missing required parameter: 'response_format.json_schema'."
        unknown = set(spec) - {"name", "schema", "strict", "description"}
        if unknown:
            return f"Unknown parameter: 'response_format.json_schema.{sorted(unknown)[0]}'."
        if not isinstance(spec.get("name"), str) or not re.fullmatch(
            r"[a-zA-Z0-9_-]{1,64}", spec["name"]
        ):
            return "Invalid 'response_format.json_schema.name'."
        if not isinstance(spec.get("schema"), dict):
            return "Invalid type for 'response_format.json_schema.schema': expected an object."
        if "strict" in spec and not isinstance(spec["strict"], bool):
            return "Invalid type for 'response_format.json_schema.strict': expected a boolean."
        return None

    def _check_content(self, content: Any, i: int, *, images: bool) -> Error | None:
        if isinstance(content, str):
            return None
        if not isinstance(content, list):
            return Error(
                400,
                f"Invalid type for 'messages[{i}].content': expected one of a "
                "string or array of objects, but got null instead.",
                param=f"messages[{i}].content",
                code="invalid_type",
            )
        for k, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            where = f"messages[{i}].content[{k}]"
            if kind == "text" and isinstance(part.get("text"), str):
                continue
            if kind == "image_url" and images:
                url = (part.get("image_url") or {}).get("url")
                if isinstance(url, str) and (
                    url.startswith("https://")
                    or url.startswith("http://")
                    or (url.startswith("data:image/") and ";base64," in url)
                ):
                    continue
                return Error(
                    400,
                    f"Invalid '{where}.image_url.url'. Expected a valid URL or a "
                    "base64-encoded data URL with an image MIME type.",
                    param=f"{where}.image_url.url",
                    code="invalid_value",
                )
            if kind == "image_url":
                return Error(
                    400,
                    f"Invalid '{where}': Image URLs are only allowed for messages "
                    "with role 'user'.",
                    param=where,
                    code="invalid_value",
                )
            return Error(
                400,
                f"Invalid value: '{kind}'. Supported values are: 'text', "
                "'image_url', 'input_audio', 'refusal', 'audio', and 'file'.",
                param=f"{where}.type",
                code="invalid_value",
            )
        return None

    def _check_assistant(self, m: dict[str, Any], i: int) -> Error | None:
        calls = m.get("tool_calls")
        content = m.get("content")
        if content is None and not calls:
            return Error(
                400,
                f"Invalid value for 'messages[{i}].content': expected a string, got null.",
                param=f"messages.[{i}].content",
                code="invalid_value",
            )
        if content is not None and not isinstance(content, str):
            problem = self._check_content(content, i, images=False)
            if problem is not None:
                return problem
        for k, call in enumerate(calls or ()):
            where = f"messages[{i}].tool_calls[{k}]"
            fn = call.get("function") if isinstance(call, dict) else None
            if (
                not isinstance(call.get("id"), str)
                or call.get("type") != "function"
                or not isinstance(fn, dict)
                or not isinstance(fn.get("name"), str)
                or not isinstance(fn.get("arguments"), str)
            ):
                return Error(
                    400,
                    f"Missing required parameter: '{where}'.",
                    param=where,
                    code="missing_required_parameter",
                )
            issued = self.issued.get(call["id"])
            if issued is not None and issued != (fn["name"], fn["arguments"]):
                return Error(
                    400,
                    f"fake: '{where}' does not replay the tool call as issued: "
                    f"sent {fn['name']}({fn['arguments']!r}), issued "
                    f"{issued[0]}({issued[1]!r})",
                    param=f"{where}.function.arguments",
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
                [sse(p) for p in answer.payloads],
                cut_after=answer.cut_after,
                end_after=answer.end_after,
            )
        calls = [(c, c.id or f"call_{uuid.uuid4().hex[:20]}") for c in answer.tool_calls]
        for call, call_id in calls:
            if not answer.omit_id:
                self.issued[call_id] = (call.name, call.arguments)
        finish = answer.finish_reason or ("tool_calls" if calls else "stop")
        usage: dict[str, Any] = {
            "prompt_tokens": answer.prompt_tokens,
            "completion_tokens": answer.completion_tokens,
            "total_tokens": answer.prompt_tokens + answer.completion_tokens,
        }
        if answer.cached_tokens is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": answer.cached_tokens}
        response_id = answer.id or f"chatcmpl-{next(self._ids)}"
        model = answer.model or body["model"]
        created = int(time.time())
        if not body.get("stream"):
            message: dict[str, Any] = {
                "role": "assistant",
                "content": answer.text or None,
                "refusal": answer.refusal or None,
            }
            if answer.reasoning:
                message["reasoning_content"] = answer.reasoning
            if calls:
                message["tool_calls"] = [
                    {
                        **({} if answer.omit_id else {"id": call_id}),
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments},
                    }
                    for c, call_id in calls
                ]
            return JSONAnswer(
                200,
                {
                    "id": response_id,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "system_fingerprint": "fp_fake",
                    "choices": [
                        {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
                    ],
                    "usage": usage,
                },
                answer.headers,
            )

        def chunk(
            delta: dict[str, Any], finish_reason: str | None = None, with_usage: bool = False
        ) -> bytes:
            payload: dict[str, Any] = {
                "id": response_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "system_fingerprint": "fp_fake",
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
                ],
            }
            if with_usage:
                payload["usage"] = usage
            return sse(payload)

        events = [chunk({"role": "assistant", "content": "", "refusal": None})]
        for piece in _pieces(answer.reasoning, answer.chunk_size):
            events.append(chunk({"reasoning_content": piece}))
        for piece in _pieces(answer.text, answer.chunk_size):
            events.append(chunk({"content": piece}))
        for piece in _pieces(answer.refusal, answer.chunk_size):
            events.append(chunk({"refusal": piece}))
        for n, (call, call_id) in enumerate(calls):
            pieces = list(_pieces(call.arguments, answer.chunk_size)) or [""]
            for k, piece in enumerate(pieces):
                delta: dict[str, Any] = {} if answer.omit_index else {"index": n}
                if k == 0:
                    if not answer.omit_id:
                        delta["id"] = call_id
                    delta["type"] = "function"
                    delta["function"] = {"name": call.name, "arguments": piece}
                else:
                    delta["function"] = {"arguments": piece}
                events.append(chunk({"tool_calls": [delta]}))
        if answer.stream_error is not None:
            events.append(sse(dict(answer.stream_error)))
        else:
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            events.append(
                chunk({}, finish, with_usage=include_usage and answer.usage_in_last_choice_chunk)
            )
            if include_usage and not answer.usage_in_last_choice_chunk:
                events.append(
                    sse(
                        {
                            "id": response_id,
                            "object": "chat.completion.chunk",
                            "created": created,
                            "model": model,
                            "system_fingerprint": "fp_fake",
                            "choices": [],
                            "usage": usage,
                        }
                    )
                )
            events.append(sse("[DONE]"))
        return SSEAnswer(
            events,
            headers=answer.headers,
            cut_after=answer.cut_after,
            end_after=answer.end_after,
            delay=answer.delay,
            malformed_at=answer.malformed_at,
        )


@pytest.fixture
def openai_fake() -> Iterator[OpenAIFake]:
    """A started :class:`OpenAIFake`; script it with ``openai_fake.add(...)``."""
    with OpenAIFake() as fake:
        yield fake
