"""Helpers shared by the HTTP providers (OpenAI-compatible and Anthropic).

Error classification lives here so both providers agree on what ``retryable`` means: rate
limits, overload, 5xx, request timeouts, dropped connections and malformed stream data are
retried by the agent (honouring ``retry_after``); authentication, permission, not-found and
invalid requests, a well-formed stream that breaks the protocol's event order, and a 200 that
is not an event stream at all (an HTML page) are ``fatal``. Messages never carry the API key:
everything a server says is passed through :func:`scrub` first (OpenAI echoes a masked key in
its 401 message). Bodies that are not the API's JSON (an HTML error page of a proxy) are cut
down to their ``<title>`` and a short excerpt by :func:`summarize_body`.
"""

from __future__ import annotations

import email.utils
import html
import importlib
import json
import re
import time
from collections.abc import Mapping
from typing import Any, Protocol

from .base import ErrorClass, ProviderError

# Phrases servers use for "the prompt does not fit the context window" (OpenAI, Anthropic,
# vLLM, llama.cpp server, LM Studio, Ollama, Mistral, Groq...). Matched case-insensitively.
_OVERFLOW_PATTERNS = re.compile(
    r"context[_ ]length[_ ]exceeded|maximum context length|context window|"
    r"prompt is too long|exceeds? (?:the )?(?:model'?s? )?(?:context|max(?:imum)? context)|"
    r"exceed context limit|too many tokens|input is too long|context size|"
    r"longer than the model'?s? context",
    re.IGNORECASE,
)

# Anything that looks like an API key, including the masked forms servers echo back
# (``sk-proj-abc***wxyz``), and any masked secret whatever its prefix (``gsk_****wxyz``,
# ``tea******wxyz``): a run of asterisks with the visible ends of a key around it.
_KEY_LIKE = re.compile(r"\bsk-[A-Za-z0-9_\-*.]{4,}|[A-Za-z0-9_\-.]*\*{3,}[A-Za-z0-9_\-.]*")

# What an error status means for the person reading the run's error.
_STATUS_MEANING = {
    401: "authentication failed (check the API key)",
    403: "permission denied (check the API key's permissions)",
}


def is_overflow_text(text: str) -> bool:
    return bool(_OVERFLOW_PATTERNS.search(text))


def scrub(text: str, api_key: str | None) -> str:
    """``text`` with the API key (whole, or masked the way servers echo it) removed."""
    if api_key:
        text = text.replace(api_key, "[redacted]")
    return _KEY_LIKE.sub("[redacted]", text)


def parse_retry_after(
    headers: Mapping[str, str] | None, *, now: float | None = None
) -> float | None:
    """Seconds to wait, from ``retry-after-ms`` (preferred) or ``retry-after``.

    ``retry-after`` may be a number of seconds or an HTTP date (RFC 9110 §10.2.3). Unparseable
    or negative values give ``None`` (the agent then uses its own backoff).
    """
    if not headers:
        return None
    lowered = {k.lower(): v for k, v in headers.items()}
    raw_ms = lowered.get("retry-after-ms")
    if raw_ms is not None:
        try:
            ms = float(raw_ms)
        except ValueError:
            ms = -1.0
        if ms >= 0 and ms == ms:  # not NaN
            return ms / 1000.0
    raw = lowered.get("retry-after")
    if raw is None:
        return None
    raw = raw.strip()
    try:
        seconds = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
        return max(0.0, seconds)
    if seconds != seconds or seconds < 0:  # NaN or negative
        return None
    return seconds


def transport_classes(*names: str) -> tuple[type[BaseException], ...]:
    """Exception classes of httpx and httpx2 (whichever the SDKs use) by name.

    The SDKs wrap most transport errors in ``APIConnectionError``, but not every stream reader
    does (a connection dropped half-way through an SSE body can surface as the raw
    ``RemoteProtocolError``, a stalled read as the raw ``ReadTimeout``), so the providers catch
    these as well.
    """
    found: list[type[BaseException]] = []
    for module_name in ("httpx", "httpx2"):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for attr in names:
            cls = getattr(module, attr, None)
            if isinstance(cls, type) and issubclass(cls, BaseException):
                found.append(cls)
    return tuple(found)


TRANSPORT_ERRORS = transport_classes("TransportError", "StreamError", "DecodingError")


# Error codes the providers give to the stream faults they detect themselves.
MALFORMED = "malformed_stream"
PROTOCOL = "protocol_error"
NOT_A_STREAM = "not_an_event_stream"

# Exceptions raised while the SDK decodes the provider's bytes (``json.JSONDecodeError`` and
# ``UnicodeDecodeError`` are ``ValueError``s), or while a translator reads a chunk whose shape
# is not the documented one. Only provider data is being processed where these are caught.
DECODE_ERRORS: tuple[type[BaseException], ...] = (ValueError, TypeError, AttributeError, KeyError)
# Around a whole request (which also builds it), only what decoding a body raises.
BODY_DECODE_ERRORS: tuple[type[BaseException], ...] = (json.JSONDecodeError, UnicodeDecodeError)

_MAX_SUMMARY = 200
_MAX_BODY = 64 * 1024  # of a body that is not the API's, read and summarized at most
_TITLE = re.compile(r"<title[^>]*>(.*?)</title\s*>", re.IGNORECASE | re.DOTALL)
_TAGS = re.compile(r"<(script|style)\b.*?</\1\s*>|<[^>]*>", re.IGNORECASE | re.DOTALL)
_SPACES = re.compile(r"\s+")


def looks_like_html(text: str) -> bool:
    head = text.lstrip()[:512].lower()
    return head.startswith("<!doctype html") or "<html" in head or head.startswith("<head")


def summarize_body(text: str) -> str:
    """A short, readable stand-in for a body that is not the API's JSON.

    An HTML page becomes ``HTML page "<title>": <first words of its text>``; anything else is
    its first characters. Never longer than about 250 characters; only the first 64 KiB of
    ``text`` are looked at.
    """
    text = text[:_MAX_BODY]
    if looks_like_html(text):
        match = _TITLE.search(text)
        title = _SPACES.sub(" ", html.unescape(match.group(1))).strip() if match else ""
        body = text[match.end() :] if match else text
        words = _SPACES.sub(" ", html.unescape(_TAGS.sub(" ", body))).strip()
        if title and words.startswith(title):
            words = words[len(title) :].strip()
        out = f'HTML page "{title[:80]}"' if title else "HTML page"
        return f"{out}: {_clip(words)}" if words else out
    return _clip(_SPACES.sub(" ", text).strip())


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_SUMMARY else text[:_MAX_SUMMARY].rstrip() + "…"


def malformed_error(provider: str, exc: BaseException, api_key: str | None) -> ProviderError:
    """Stream data that cannot be decoded (a chunk cut in the middle of its JSON, bytes that
    are not UTF-8, a chunk of the wrong shape): what a truncated or corrupted transfer looks
    like, so retryable."""
    detail = scrub(str(exc) or type(exc).__name__, api_key)
    return ProviderError(
        "retryable",
        f"{provider}: malformed stream data ({type(exc).__name__}): {_clip(detail)}",
        code=MALFORMED,
    )


def protocol_error(provider: str, what: str) -> ProviderError:
    """Well-formed events in an order the API never sends: a broken server or proxy, which a
    retry would meet again, so fatal."""
    return ProviderError(
        "fatal", f"{provider}: the stream broke the protocol: {what}", code=PROTOCOL
    )


class _Response(Protocol):
    @property
    def status_code(self) -> int: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    def aiter_bytes(self) -> Any: ...


_SSE_TYPES = frozenset({"", "text/event-stream", "text/plain", "application/octet-stream"})
_HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})


def media_type(response: _Response) -> str:
    """The response's media type, lower case, without parameters (``""`` when absent)."""
    raw_type = response.headers.get("content-type") or ""
    return raw_type.split(";")[0].strip().lower()


async def check_event_stream(provider: str, response: _Response, api_key: str | None) -> str:
    """Before a stream is read: raise a fatal :class:`ProviderError` when the body is an HTML
    page (behind a 200: a captive portal, a ``base_url`` that points at a website — a retry
    reaches the same page), with the page's title in the message. Returns the media type.

    Only HTML is refused up front: an HTML page is never an event stream, while a server
    that labels its SSE oddly (``application/json``, ``text/plain``, nothing) may still send
    one, so any other type is read as SSE and judged by :func:`no_events_error` afterwards.
    """
    media = media_type(response)
    if media not in _HTML_TYPES:
        return media
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size >= _MAX_BODY:
            break
    text = b"".join(chunks)[:_MAX_BODY].decode("utf-8", "replace")
    status = response.status_code
    raise ProviderError(
        "fatal",
        f"{provider}: HTTP {status} answered {media} instead of an event stream: "
        f"{scrub(summarize_body(text), api_key) or 'empty body'}",
        status=status,
        code=NOT_A_STREAM,
    )


def no_events_error(provider: str, status: int, media: str) -> ProviderError | None:
    """After a stream ended without a single event: fatal when its type was not an event
    stream either (a JSON completion from a server that ignored ``stream: true``, a body of
    another kind); ``None`` for an SSE body that was just empty (a cut stream: retryable)."""
    if media in _SSE_TYPES:
        return None
    hint = " (a profile with stream = false does not ask for one)" if media.endswith("json") else ""
    return ProviderError(
        "fatal",
        f"{provider}: HTTP {status} answered {media}, not an event stream, and no event "
        f"arrived{hint}",
        status=status,
        code=NOT_A_STREAM,
    )


def not_a_response(provider: str, body: str, api_key: str | None) -> ProviderError:
    """A non-streaming request answered 200 with something that is not the API's JSON (the
    SDK then hands over the text): fatal, as an HTML page in :func:`check_event_stream`."""
    return ProviderError(
        "fatal",
        f"{provider}: HTTP 200 answered something that is not the API's JSON: "
        f"{scrub(summarize_body(body), api_key) or 'empty body'}",
        status=200,
        code=NOT_A_STREAM,
    )


def _url_of(exc: BaseException) -> str | None:
    """``scheme://host:port/path`` of the request an httpx or SDK error carries (no user
    info, no query: they may hold credentials), or ``None``."""
    try:
        url = getattr(getattr(exc, "request", None), "url", None)
    except RuntimeError:  # httpx: an error raised without its request
        return None
    scheme, host = getattr(url, "scheme", ""), getattr(url, "host", "")
    if not scheme or not host:
        return None
    port = getattr(url, "port", None)
    return f"{scheme}://{host}{f':{port}' if port else ''}{getattr(url, 'path', '')}"


def connection_error(provider: str, exc: BaseException, api_key: str | None) -> ProviderError:
    """A dropped connection, timeout or broken stream: always retryable. The message names
    the URL the request went to (httpx's errors carry it), so a wrong ``base_url`` shows."""
    detail = scrub(str(exc) or type(exc).__name__, api_key)
    url = _url_of(exc)
    where = f" ({scrub(url, api_key)})" if url else ""
    return ProviderError(
        "retryable", f"{provider}: connection failed{where} ({type(exc).__name__}): {detail}"
    )


def classify_status(
    status: int, *, code: str | None, error_type: str | None, message: str
) -> ErrorClass:
    """The error class of an HTTP error answer (both providers' conventions)."""
    if code == "context_length_exceeded" or (
        status in (400, 413, 422) and is_overflow_text(message)
    ):
        return "overflow"
    if status == 429:
        # OpenAI answers 429 for an exhausted quota too; waiting will not fix that.
        if code == "insufficient_quota" or error_type == "insufficient_quota":
            return "fatal"
        return "retryable"
    if status in (408, 409, 425) or status >= 500:
        return "retryable"
    return "fatal"


def status_error(
    provider: str,
    status: int,
    *,
    code: str | None,
    error_type: str | None,
    message: str,
    headers: Mapping[str, str] | None,
    api_key: str | None,
) -> ProviderError:
    kind = classify_status(status, code=code, error_type=error_type, message=message)
    label = " ".join(x for x in (error_type, code if code != error_type else None) if x)
    if looks_like_html(message) or (
        code is None and error_type is None and len(message) > 4 * _MAX_SUMMARY
    ):
        message = summarize_body(message)  # not the API's error shape: a proxy's page
    text = scrub(message, api_key) or "no message"
    if status in _STATUS_MEANING:
        text = f"{_STATUS_MEANING[status]}: {text}"
    return ProviderError(
        kind,
        f"{provider}: HTTP {status}{' ' + label if label else ''}: {text}",
        status=status,
        code=code or error_type,
        retry_after=parse_retry_after(headers) if kind == "retryable" else None,
    )


def error_fields(body: Any) -> tuple[str | None, str | None, str | None]:
    """``(code, type, message)`` of an error body in either provider's shape.

    OpenAI: ``{"error": {"message", "type", "param", "code"}}`` (the SDK may hand over just the
    inner object); Anthropic: ``{"type": "error", "error": {"type", "message"}}``.
    """
    if isinstance(body, Mapping):
        inner = body.get("error")
        if isinstance(inner, Mapping):
            body = inner
        elif isinstance(inner, str):
            return None, None, inner
        code = body.get("code")
        error_type = body.get("type")
        message = body.get("message")
        return (
            str(code) if code is not None else None,
            error_type if isinstance(error_type, str) else None,
            message if isinstance(message, str) else None,
        )
    if isinstance(body, str):
        return None, None, body
    return None, None, None
