"""Prometheus metrics and structured logging.

Metrics live in their own :data:`REGISTRY` (not prometheus-client's global one), so tests and
embedders start clean. Labels stay low-cardinality: statuses, reasons, providers, route
*templates* — never a conversation id, a run id, a tenant or a secret. Each ``observe_*``
helper folds an unexpected label value into ``other``.

With several worker processes, set ``PROMETHEUS_MULTIPROC_DIR`` (``carryover serve`` does it
when ``--workers`` > 1) and :func:`render_metrics` aggregates every worker's figures.

Logging goes to stderr as text or JSON lines; :class:`RedactSecrets` replaces any configured
secret (API keys, provider keys, the database password) that reaches a log record. With JSON
every line is one object — uvicorn's own lines and its access log included (the access log
with ``client``, ``method``, ``path``, ``http_version`` and ``status`` fields) — and no line
carries a terminal colour code; :func:`banner_line` renders ``carryover serve``'s banner the
same way.
"""

from __future__ import annotations

import json
import logging
import logging.config
import os
import re
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import telemetry

REGISTRY = CollectorRegistry(auto_describe=True)

RUN_STATUSES = frozenset(
    {"completed", "failed", "cancelled", "conflicted", "interrupted", "requires_action"}
)
PROVIDERS = frozenset({"echo", "openai", "openai-responses", "anthropic"})
#: ``ok`` or the kind of the attempt's error (app.agent.messages.ErrorKind)
ATTEMPT_OUTCOMES = frozenset({"ok", "overflow", "retryable", "fatal", "aborted", "internal"})
TOOL_OUTCOMES = frozenset({"ok", "error", "timeout", "cancelled", "unknown_tool"})
COMPACTION_REASONS = frozenset({"threshold", "overflow", "manual"})
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
OTHER = "other"
UNMATCHED_ROUTE = "<unmatched>"
MAX_TOOL_LABELS = 64
MAX_AGENT_LABELS = 32
#: the agent of a run another process started and this one found dead (its row is not read)
UNKNOWN_AGENT = "unknown"
TOKEN_KINDS = ("input", "output", "cache_read", "cache_write")
QUOTA_LIMITS = frozenset({"tokens_per_day", "runs_per_minute", "concurrent_runs"})
AUTH_OUTCOMES = frozenset({"unauthorized", "throttled"})

RUNS = Counter(
    "carryover_runs",
    "Runs that ended, by status and agent.",
    ["status", "agent"],
    registry=REGISTRY,
)
RUN_DURATION = Histogram(
    "carryover_run_duration_seconds",
    "Wall time of a run, from start to its recorded end, by status and agent.",
    ["status", "agent"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800),
    registry=REGISTRY,
)
PROVIDER_REQUEST_DURATION = Histogram(
    "carryover_provider_request_duration_seconds",
    "Time of one provider request (an attempt, until its stream ended), by provider and outcome.",
    ["provider", "outcome"],
    buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600),
    registry=REGISTRY,
)
TOKENS = Counter(
    "carryover_tokens",
    "Tokens of provider requests (compactions' included), by provider and kind "
    "(input counts cached input too; cache_read and cache_write are parts of it).",
    ["provider", "kind"],
    registry=REGISTRY,
)
QUOTA_REFUSALS = Counter(
    "carryover_quota_refusals",
    "Runs refused for a spent tenant quota, by limit.",
    ["limit"],
    registry=REGISTRY,
)
AUTH_FAILURES = Counter(
    "carryover_auth_failures",
    "Requests refused for their credential, by outcome: unauthorized (a wrong or revoked key, "
    "a malformed Authorization header) or throttled (429: the address failed too often).",
    ["outcome"],
    registry=REGISTRY,
)
RUNS_IN_PROGRESS = Gauge(
    "carryover_runs_in_progress",
    "Runs executing in this process (summed over live workers).",
    registry=REGISTRY,
    multiprocess_mode="livesum",
)
QUEUED_RUNS = Gauge(
    "carryover_queued_runs",
    "Runs in status queued, in the database (counted when /metrics is scraped: every replica "
    "says the same), by kind: background (no client waits for it) or waiting (a client holds "
    "its request open).",
    ["kind"],
    registry=REGISTRY,
    multiprocess_mode="mostrecent",
)
PROVIDER_ATTEMPTS = Counter(
    "carryover_provider_attempts",
    "Provider requests (attempts), by provider and outcome.",
    ["provider", "outcome"],
    registry=REGISTRY,
)
TOOL_CALLS = Counter(
    "carryover_tool_calls",
    "Tool calls, by tool and outcome.",
    ["tool", "outcome"],
    registry=REGISTRY,
)
COMPACTIONS = Counter(
    "carryover_compactions", "Compactions, by reason.", ["reason"], registry=REGISTRY
)
HTTP_REQUESTS = Counter(
    "carryover_http_requests",
    "HTTP requests answered, by method, route template and status.",
    ["method", "route", "status"],
    registry=REGISTRY,
)
HTTP_DURATION = Histogram(
    "carryover_http_request_duration_seconds",
    "Time to answer an HTTP request (until the body is sent), by method and route template.",
    ["method", "route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
    registry=REGISTRY,
)

_tool_labels: set[str] = set()
_agent_labels: set[str] = set()


def _bounded(value: str, allowed: frozenset[str]) -> str:
    return value if value in allowed else OTHER


def _tool_label(name: str) -> str:
    # Tool names come from configuration, but a model may call a name that was never
    # registered: the first few distinct names are kept, later ones fold into "other".
    if name in _tool_labels:
        return name
    if len(_tool_labels) < MAX_TOOL_LABELS and re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
        _tool_labels.add(name)
        return name
    return OTHER


def _agent_label(name: str) -> str:
    # Profile names come from configuration: the first few are kept, later ones fold.
    if name in _agent_labels or name == UNKNOWN_AGENT:
        return name
    if len(_agent_labels) < MAX_AGENT_LABELS and re.fullmatch(r"[A-Za-z0-9._-]{1,64}", name):
        _agent_labels.add(name)
        return name
    return OTHER


_children: dict[tuple[int, tuple[str, ...]], Any] = {}


def _child(metric: Any, *values: str) -> Any:
    """``metric.labels(*values)``, remembered: every label here has a bounded set of values,
    and a labelled child, once made, is the same object for the life of the process
    (prometheus_client's ``labels`` takes a lock and checks the values on every call)."""
    key = (id(metric), values)
    child = _children.get(key)
    if child is None:
        child = _children[key] = metric.labels(*values)
    return child


def observe_run(status: str, seconds: float, agent: str = "default") -> None:
    status, agent = _bounded(status, RUN_STATUSES), _agent_label(agent)
    _child(RUNS, status, agent).inc()
    _child(RUN_DURATION, status, agent).observe(max(0.0, seconds))


def observe_interrupted(count: int = 1) -> None:
    """Runs of a dead process found and marked interrupted (their agent is not read)."""
    RUNS.labels(status="interrupted", agent=UNKNOWN_AGENT).inc(count)


def observe_provider_request(provider: str, outcome: str, seconds: float) -> None:
    _child(
        PROVIDER_REQUEST_DURATION,
        _bounded(provider, PROVIDERS),
        _bounded(outcome, ATTEMPT_OUTCOMES),
    ).observe(max(0.0, seconds))


telemetry.on_provider_request(observe_provider_request)


def observe_tokens(
    provider: str, input: int = 0, output: int = 0, cache_read: int = 0, cache_write: int = 0
) -> None:
    provider = _bounded(provider, PROVIDERS)
    for kind, count in zip(TOKEN_KINDS, (input, output, cache_read, cache_write), strict=True):
        if count > 0:
            _child(TOKENS, provider, kind).inc(count)


def observe_quota_refusal(limit: str) -> None:
    QUOTA_REFUSALS.labels(limit=_bounded(limit, QUOTA_LIMITS)).inc()


def observe_auth_failure(outcome: str) -> None:
    AUTH_FAILURES.labels(outcome=_bounded(outcome, AUTH_OUTCOMES)).inc()


def observe_queued(background: int, waiting: int) -> None:
    """The database's queued runs, as counted now (:data:`QUEUED_RUNS`)."""
    QUEUED_RUNS.labels(kind="background").set(background)
    QUEUED_RUNS.labels(kind="waiting").set(waiting)


def observe_provider_attempt(provider: str, outcome: str) -> None:
    _child(
        PROVIDER_ATTEMPTS, _bounded(provider, PROVIDERS), _bounded(outcome, ATTEMPT_OUTCOMES)
    ).inc()


def observe_tool_call(tool: str, outcome: str) -> None:
    TOOL_CALLS.labels(tool=_tool_label(tool), outcome=_bounded(outcome, TOOL_OUTCOMES)).inc()


def observe_compaction(reason: str) -> None:
    COMPACTIONS.labels(reason=_bounded(reason, COMPACTION_REASONS)).inc()


def observe_http(method: str, route: str, status: int, seconds: float) -> None:
    method = _bounded(method.upper(), HTTP_METHODS)
    _child(HTTP_REQUESTS, method, route, str(status)).inc()
    _child(HTTP_DURATION, method, route).observe(max(0.0, seconds))


def render_metrics() -> tuple[bytes, str]:
    """The Prometheus text exposition of every metric, and its content type."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


#: the scope key a mounted app sets to the path it is mounted at (``/v1``): its routes'
#: templates are counted under it (``/v1/conversations/{conversation_id}``)
ROUTE_PREFIX_KEY = "carryover.route_prefix"


class MetricsMiddleware:
    """ASGI middleware counting requests by route *template* (``/conversations/{id}``).

    A request that matched no route is counted as ``<unmatched>``, so probing random paths
    cannot grow the label set. An exception that escapes the app counts as a 500.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_and_watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_and_watch)
        finally:
            route = getattr(scope.get("route"), "path", None)
            route = scope.get(ROUTE_PREFIX_KEY, "") + route if route else UNMATCHED_ROUTE
            observe_http(scope["method"], route, status, time.perf_counter() - started)


# --- logging ---------------------------------------------------------------------------------

_REDACTED = "[REDACTED]"
#: shorter values are not redacted: they would blank out ordinary words
MIN_SECRET_LENGTH = 4
_STANDARD_RECORD_ATTRS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class RedactSecrets(logging.Filter):
    """Replace known secret values wherever they appear in a record: message, arguments,
    exception text, stack, and ``extra=`` fields. Installed on the handler, so it sees every
    record, whichever logger emitted it."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        values = sorted({s for s in secrets if len(s) >= MIN_SECRET_LENGTH}, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, values))) if values else None

    def redact(self, text: str) -> str:
        return self._pattern.sub(_REDACTED, text) if self._pattern else text

    def filter(self, record: logging.LogRecord) -> bool:
        if self._pattern is None:
            return True
        record.msg, record.args = self.redact(record.getMessage()), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        if record.stack_info:
            record.stack_info = self.redact(record.stack_info)
        for name, value in list(vars(record).items()):
            if name not in _STANDARD_RECORD_ATTRS and isinstance(value, str):
                setattr(record, name, self.redact(value))
        return True


#: record attributes that are formatting hints, never fields: uvicorn's ``color_message``
#: holds ANSI colour codes
_HINT_ATTRS = frozenset({"color_message"})
ACCESS_FIELDS = ("client", "method", "path", "http_version", "status")


class AccessFields(logging.Filter):
    """Give uvicorn's access records their parts as fields (``client``, ``method``, ``path``,
    ``http_version``, ``status``), read from the record's arguments. Installed before
    :class:`RedactSecrets`, which folds the arguments into the message."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if record.name == "uvicorn.access" and isinstance(args, tuple) and len(args) == 5:
            for name, value in zip(ACCESS_FIELDS, args, strict=True):
                setattr(record, name, value)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, ``extra=`` fields, exception."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in vars(record).items():
            if (
                name not in _STANDARD_RECORD_ATTRS
                and name not in _HINT_ATTRS
                and not name.startswith("_")
            ):
                entry[name] = value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = record.stack_info
        return json.dumps(entry, default=str, ensure_ascii=False)


def banner_line(
    text: str,
    fmt: str = "text",
    logger: str = "carryover",
    level: int = logging.INFO,
    **fields: Any,
) -> str:
    """A message printed outside logging (``carryover serve``'s banner, a command's error) in
    the configured format: ``text`` as is, or one JSON line shaped like a log record, with
    ``fields`` beside the message."""
    if fmt != "json":
        return text
    record = logging.makeLogRecord(
        {
            "name": logger,
            "levelno": level,
            "levelname": logging.getLevelName(level),
            "msg": text,
            **fields,
        }
    )
    return JsonFormatter().format(record)


def logging_config(
    level: str = "INFO", fmt: str = "text", secrets: Iterable[str] = ()
) -> dict[str, Any]:
    """A :func:`logging.config.dictConfig` document: one stderr handler on the root logger
    with secret redaction; uvicorn's loggers propagate to it. Also handed to uvicorn, which
    applies it in every worker process."""
    formatter: dict[str, Any] = (
        {"()": f"{__name__}.JsonFormatter"}
        if fmt == "json"
        else {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}
    )
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {
            "access": {"()": f"{__name__}.AccessFields"},
            "redact": {"()": f"{__name__}.RedactSecrets", "secrets": list(secrets)},
        },
        "formatters": {"carryover": formatter},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
                "formatter": "carryover",
                "filters": ["access", "redact"],
            }
        },
        "root": {"level": level.upper(), "handlers": ["stderr"]},
        "loggers": {
            **{
                name: {"handlers": [], "propagate": True, "level": level.upper()}
                for name in ("uvicorn", "uvicorn.error", "uvicorn.access")
            },
            # one line per Alembic plugin at every start says nothing useful
            "alembic.runtime.plugins": {"level": "WARNING"},
        },
    }


def configure_logging(level: str = "INFO", fmt: str = "text", secrets: Iterable[str] = ()) -> None:
    """Send every log record to stderr (text or JSON lines), with ``secrets`` redacted."""
    logging.config.dictConfig(logging_config(level, fmt, secrets))
