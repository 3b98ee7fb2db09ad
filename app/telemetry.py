"""OpenTelemetry tracing, after the GenAI semantic conventions (docs/operations.md "Traces").

Configured only by the standard ``OTEL_*`` variables, and off when none asks for it:
``OTEL_TRACES_EXPORTER`` (``otlp`` or ``console``; ``none`` is off) or an
``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` turns it on; the SDK
reads the rest itself (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, the OTLP headers,
``OTEL_TRACES_SAMPLER``…). ``OTEL_SDK_DISABLED=true`` keeps it off.

Off, every helper here is a no-op on OpenTelemetry's non-recording spans: nothing is exported,
no attribute is built. On, the app has a span per HTTP request (FastAPI instrumentation) and
per database statement made inside a request or run (SQLAlchemy instrumentation; background
pollers start no traces), and the run path adds, nested under the request span:
``invoke_agent {agent}`` (the run), ``chat {model}`` (each provider request),
``execute_tool {name}`` (each tool call) and ``compact {reason}`` (each compaction).

Message content goes into spans only with
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``, and then only what a request adds
(its new input messages and its output), so a span costs O(what changed), never O(history).
No key or other secret is ever an attribute.

A base module (docs/architecture.md): it imports nothing of ``app``; the agent calls it
through :func:`span`, :func:`chat_span`, :func:`tool_span` and :func:`record_response`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from fastapi.telemetry import TelemetryConfig
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider

TRACER_NAME = "carryover"
CAPTURE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
#: paths whose requests get no span (probes, scrapes)
EXCLUDED_URLS = "healthz,readyz,metrics"

_provider: TracerProvider | None = None
_configured = False


def enabled_by(environ: Mapping[str, str]) -> bool:
    """Whether the ``OTEL_*`` variables ask for traces."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def configure(environ: Mapping[str, str] | None = None) -> TracerProvider | None:
    """The process's tracer provider from the ``OTEL_*`` variables (built once), or ``None``
    when tracing is off."""
    global _configured, _provider
    if _configured:
        return _provider
    _configured = True
    environ = os.environ if environ is None else environ
    if not enabled_by(environ):
        return None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

    names = [
        n.strip().lower()
        for n in (environ.get("OTEL_TRACES_EXPORTER") or "otlp").split(",")
        if n.strip()
    ]
    exporters: list[SpanExporter] = []
    for name in names:
        if name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            exporters.append(ConsoleSpanExporter())
        elif name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporters.append(OTLPSpanExporter())
        elif name != "none":
            raise ValueError(f"OTEL_TRACES_EXPORTER={name!r}: choose 'otlp', 'console' or 'none'")
    # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
    resource = Resource.create({"service.name": environ.get("OTEL_SERVICE_NAME") or "carryover"})
    provider = SdkTracerProvider(resource=resource)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    _provider = provider
    trace.set_tracer_provider(provider)
    return provider


def use(provider: TracerProvider | None) -> None:
    """Trace with ``provider`` from now on (tests: an SDK provider with an in-memory
    exporter); ``None`` turns tracing off again."""
    global _configured, _provider
    _provider, _configured = provider, True


def provider() -> TracerProvider | None:
    """The tracer provider in use, or ``None`` when tracing is off."""
    return _provider


def _tracer() -> trace.Tracer:
    return (_provider or trace.NoOpTracerProvider()).get_tracer(TRACER_NAME)


def capture_content() -> bool:
    return os.environ.get(CAPTURE_CONTENT, "").strip().lower() == "true"


def current_trace_id() -> str | None:
    """The current trace's id (32 hex digits), or ``None`` outside a trace."""
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None


@contextmanager
def span(
    name: str, attributes: Mapping[str, Any] | None = None, kind: SpanKind = SpanKind.INTERNAL
) -> Iterator[Span]:
    """A span, current for the body; an exception escaping it marks it failed
    (``error.type``) and propagates. With tracing off, the span the no-op tracer would make
    (non-recording, in the current trace), without its context switching."""
    if _provider is None:
        yield trace.NonRecordingSpan(trace.get_current_span().get_span_context())
        return
    with _tracer().start_as_current_span(
        name, kind=kind, attributes=_clean(attributes), record_exception=False
    ) as current:
        try:
            yield current
        except BaseException as exc:
            if current.is_recording():
                if "error.type" not in (getattr(current, "attributes", None) or {}):
                    current.set_attribute("error.type", type(exc).__qualname__)
                current.set_status(Status(StatusCode.ERROR))
            raise


def agent_span(agent: str, conversation_id: str, run_id: str) -> Any:
    """The run: ``invoke_agent {agent}``."""
    return span(
        f"invoke_agent {agent}",
        {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": agent,
            "gen_ai.conversation.id": conversation_id,
            "carryover.run.id": run_id,
        },
    )


def record_run(current: Span, status: str, usage: Any) -> None:
    """How a run ended, onto its ``invoke_agent`` span."""
    if current.is_recording():
        current.set_attributes(
            {
                "carryover.run.status": status,
                "gen_ai.usage.input_tokens": usage.input_tokens,
                "gen_ai.usage.output_tokens": usage.output_tokens,
            }
        )
        if status == "failed":
            current.set_attribute("error.type", "run_failed")
            current.set_status(Status(StatusCode.ERROR))


#: ``(provider, outcome, seconds)`` of every provider request, for metrics
RequestListener = Callable[[str, str, float], None]
_request_listeners: list[RequestListener] = []


def on_provider_request(listener: RequestListener) -> None:
    """Call ``listener(provider, outcome, seconds)`` after each provider request ("ok" or the
    attempt's error kind); app.observability registers its histogram so."""
    if listener not in _request_listeners:
        _request_listeners.append(listener)


@dataclass
class Attempt:
    """A provider request in flight: its span, and how it went (set by record_response)."""

    span: Span
    outcome: str = "aborted"


@contextmanager
def chat_span(provider_name: str, model: str, messages: Sequence[Any] = ()) -> Iterator[Attempt]:
    """One provider request: ``chat {model}``, timed for the request listeners. Of
    ``messages`` (the request's), those after the last assistant message — what this request
    adds — are recorded, and only when content capture is on."""
    started = time.perf_counter()
    attempt: Attempt | None = None
    try:
        with _chat_span(provider_name, model, messages) as current:
            attempt = Attempt(current)
            yield attempt
    finally:
        seconds = time.perf_counter() - started
        outcome = attempt.outcome if attempt is not None else "internal"
        for listener in _request_listeners:
            listener(provider_name, outcome, seconds)


def _chat_span(provider_name: str, model: str, messages: Sequence[Any]) -> Any:
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider_name,
        "gen_ai.request.model": model,
    }
    if messages and _provider is not None and capture_content():
        start = len(messages)
        while start > 0 and getattr(messages[start - 1], "type", None) != "assistant":
            start -= 1
        attributes["gen_ai.input.messages"] = _messages_json(messages[start:])
    return span(f"chat {model}".strip(), attributes, kind=SpanKind.CLIENT)


def record_response(attempt: Attempt, message: Any) -> None:
    """What an ``AssistantMessage`` says of its request, onto the ``chat`` span."""
    attempt.outcome = "ok" if message.error is None else str(message.error.kind)
    current = attempt.span
    if not current.is_recording():
        return
    usage = message.usage
    attributes: dict[str, Any] = {
        "gen_ai.response.model": message.model or None,
        "gen_ai.response.id": message.response_id or None,
        "gen_ai.response.finish_reasons": [message.stop_reason],
        "gen_ai.usage.input_tokens": usage.input_tokens,
        "gen_ai.usage.output_tokens": usage.output_tokens,
    }
    if usage.cache_read_tokens:
        attributes["gen_ai.usage.cache_read.input_tokens"] = usage.cache_read_tokens
    if message.error is not None:
        attributes["error.type"] = message.error.kind
        current.set_status(Status(StatusCode.ERROR))
    if capture_content():
        attributes["gen_ai.output.messages"] = _messages_json([message])
    current.set_attributes(_clean(attributes))


def tool_span(name: str, call_id: str, server: str | None = None) -> Any:
    """One tool call: ``execute_tool {name}``; ``server``: the label of the server that runs
    it (``carryover`` for the agent's own tools, an MCP server's label for a remote one)."""
    return span(
        f"execute_tool {name}",
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": call_id,
            "gen_ai.tool.type": "function" if server in (None, "carryover") else "extension",
            "carryover.tool.server": server,
        },
    )


def record_tool_result(current: Span, is_error: bool) -> None:
    if is_error and current.is_recording():
        current.set_attribute("error.type", "tool_error")
        current.set_status(Status(StatusCode.ERROR))


def compaction_span(reason: str) -> Any:
    """One compaction: ``compact {reason}`` (its summary request is a ``chat`` span in it)."""
    return span(f"compact {reason}", {"carryover.compaction.reason": reason})


def record_compaction(current: Span, record: Any) -> None:
    """What a ``Compaction`` record says, onto its span."""
    if current.is_recording():
        current.set_attributes(
            {
                "carryover.compaction.folded_messages": len(record.folded),
                "carryover.compaction.tokens_before": record.tokens_before,
                "carryover.compaction.tokens_after": record.tokens_after,
            }
        )


def _messages_json(messages: Sequence[Any]) -> str:
    out = []
    for message in messages:
        dump = getattr(message, "model_dump", None)
        out.append(dump(mode="json", exclude={"provider_data"}) if dump else str(message))
    return json.dumps(out, ensure_ascii=False, default=str)


def _clean(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (attributes or {}).items() if v is not None}


# --- the app's instrumentation ---------------------------------------------------------------


#: what FastAPI's own OpenTelemetry support is asked to do: nothing. Requests are traced by
#: :func:`instrument_app` when tracing is configured (docs/operations.md); FastAPI's built-in
#: telemetry would look up the global OpenTelemetry providers on every request, and start a
#: second server span once Carryover has set one.
FASTAPI_TELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}


def instrument_app(app: Any) -> None:
    """A span per HTTP request (an incoming ``traceparent`` continues its trace)."""
    if _provider is None:
        return
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    FastAPIInstrumentor.instrument_app(app, tracer_provider=_provider, excluded_urls=EXCLUDED_URLS)


class _ChildrenOnly(trace.Tracer):
    """A tracer that starts spans only inside a current span: a statement of a request or a
    run is traced under it, one of background work (the lease, queue, webhook, event and
    retention pollers, a few a second while idle) starts no trace of its own."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer

    @staticmethod
    def _has_parent(context: Any) -> bool:
        return bool(trace.get_current_span(context).get_span_context().is_valid)

    def start_span(self, name: str, context: Any = None, *args: Any, **kwargs: Any) -> Span:
        if not self._has_parent(context):
            return trace.INVALID_SPAN
        return self._tracer.start_span(name, context, *args, **kwargs)

    @contextmanager
    def start_as_current_span(  # type: ignore[override]
        self, name: str, context: Any = None, *args: Any, **kwargs: Any
    ) -> Iterator[Span]:
        if not self._has_parent(context):
            yield trace.INVALID_SPAN
            return
        with self._tracer.start_as_current_span(name, context, *args, **kwargs) as current:
            yield current


def instrument_engine(engine: Any) -> None:
    """A span per database statement of this (async) engine, under the request or run span it
    runs in (background work's statements are not traced: :class:`_ChildrenOnly`). Only this
    engine is instrumented (``SQLAlchemyInstrumentor().instrument()`` would patch
    ``create_engine`` for the whole process, once)."""
    if _provider is None:
        return
    from opentelemetry.instrumentation.sqlalchemy.engine import EngineTracer
    from opentelemetry.metrics import NoOpMeter

    EngineTracer(  # type: ignore[no-untyped-call]
        _ChildrenOnly(_provider.get_tracer("opentelemetry.instrumentation.sqlalchemy")),
        getattr(engine, "sync_engine", engine),
        NoOpMeter(TRACER_NAME).create_up_down_counter("db.client.connections.usage"),
    )
