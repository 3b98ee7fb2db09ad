"""OpenTelemetry traces (docs/operations.md "Traces") with an in-memory exporter: one run with a
tool call yields the request span, the run span, a span per provider request and per tool call,
database spans and compaction spans, all in the incoming traceparent's trace; message text only
when opted in; no key anywhere."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from app import telemetry

from .conftest import AppClient, SettingsFactory, start_client

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"
API_KEY = "sk-carryover-very-secret-1"
WORDS = "pineapple-umbrella-words"


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    found = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(found))
    telemetry.use(provider)
    try:
        yield found
    finally:
        telemetry.use(None)
        provider.shutdown()


async def traced_client(make_settings: SettingsFactory) -> tuple[Any, AppClient]:
    app, client = await start_client(make_settings(api_keys=f"acme:{API_KEY}"))
    client.headers["authorization"] = f"Bearer {API_KEY}"
    return app, client


def by_name(spans: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


def ancestors(span: ReadableSpan, spans: tuple[ReadableSpan, ...]) -> list[str]:
    """The names of a span's parents, nearest first."""
    index = {s.context.span_id: s for s in spans if s.context is not None}
    names = []
    parent = span.parent
    while parent is not None and parent.span_id in index:
        found = index[parent.span_id]
        names.append(found.name)
        parent = found.parent
    return names


def every_value(spans: tuple[ReadableSpan, ...]) -> str:
    """Every name, attribute and event of every span, as one text to search."""
    parts = []
    for s in spans:
        parts.append(s.name)
        parts.append(json.dumps({k: str(v) for k, v in (s.attributes or {}).items()}))
        for event in s.events:
            parts.append(json.dumps({k: str(v) for k, v in (event.attributes or {}).items()}))
        parts.append(json.dumps({k: str(v) for k, v in s.resource.attributes.items()}))
    return "\n".join(parts)


async def test_a_run_with_a_tool_call_is_one_trace_of_genai_spans(
    exporter: InMemorySpanExporter, make_settings: SettingsFactory
) -> None:
    app, client = await traced_client(make_settings)
    async with app.router.lifespan_context(app), client:
        assert (await client.post("/conversations", json={"id": "c"})).status_code == 201
        exporter.clear()
        ran = await client.post(
            "/conversations/c/runs",
            json={"prompts": [f'/tool wait {{"seconds": 0}} {WORDS}']},
            headers={"traceparent": TRACEPARENT},
        )
        assert ran.status_code == 201, ran.text
        body = ran.json()
        spans = exporter.get_finished_spans()
        record = (await client.get(f"/conversations/c/runs/{body['run_id']}")).json()

    # the answer and the record name the incoming trace
    assert body["trace_id"] == record["trace_id"] == TRACE_ID
    run_spans = by_name(spans, "invoke_agent default")
    assert len(run_spans) == 1
    run_span = run_spans[0]
    # every span of the request and the run is in the caller's trace; background work that
    # happened meanwhile (the lease keeper's tick, the event writer) traces its own statements
    # in traces of its own, never as a request or GenAI span
    others = [
        s.name
        for s in spans
        if s.context is not None and format(s.context.trace_id, "032x") != TRACE_ID
    ]
    request_like = ("invoke_agent", "chat ", "execute_tool", "compact", "POST ", "GET ")
    assert not [name for name in others if name.startswith(request_like)], others
    assert len(others) < len(spans)

    [request_span] = [
        s for s in spans if s.parent is not None and s.parent.span_id == int(PARENT_SPAN_ID, 16)
    ]
    assert request_span.name == "POST /conversations/{conversation_id}/runs"
    assert ancestors(run_span, spans)[-1] == request_span.name
    assert run_span.attributes is not None
    assert run_span.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert run_span.attributes["gen_ai.agent.name"] == "default"
    assert run_span.attributes["gen_ai.conversation.id"] == "c"
    assert run_span.attributes["carryover.run.id"] == body["run_id"]
    assert run_span.attributes["carryover.run.status"] == "completed"

    chats = by_name(spans, "chat ")
    assert [c.name for c in chats] == ["chat echo", "chat echo"]  # the tool call, the answer
    attempts = [m for m in body["new_messages"] if m["type"] == "assistant"]
    for chat, attempt in zip(chats, attempts, strict=True):
        assert ancestors(chat, spans)[0] == run_span.name
        assert chat.attributes is not None
        assert chat.attributes["gen_ai.operation.name"] == "chat"
        assert chat.attributes["gen_ai.provider.name"] == "echo"
        assert chat.attributes["gen_ai.request.model"] == "echo"
        assert chat.attributes["gen_ai.response.id"] == attempt["response_id"]
        assert list(chat.attributes["gen_ai.response.finish_reasons"]) == [  # type: ignore[arg-type]
            attempt["stop_reason"]
        ]
        assert chat.attributes["gen_ai.usage.input_tokens"] == attempt["usage"]["input_tokens"]
        assert chat.attributes["gen_ai.usage.output_tokens"] == attempt["usage"]["output_tokens"]
    assert [c.attributes["gen_ai.response.finish_reasons"][0] for c in chats] == [  # type: ignore[index]
        "tool_use",
        "end_turn",
    ]

    [tool] = by_name(spans, "execute_tool ")
    assert tool.name == "execute_tool wait"
    assert ancestors(tool, spans)[0] == run_span.name
    assert tool.attributes is not None
    assert tool.attributes["gen_ai.tool.name"] == "wait"
    assert tool.attributes["gen_ai.tool.call.id"] == attempts[0]["content"][0]["id"]

    # database statements: starting the run (under the request), recording it (under the run)
    db = [s for s in spans if {"db.system", "db.system.name"} & set(s.attributes or {})]
    assert db, [s.name for s in spans]
    assert any(
        str((s.attributes or {}).get("db.statement", "")).startswith("INSERT INTO runs") for s in db
    )
    assert any(run_span.name in ancestors(s, spans) for s in db)
    ours = [
        s for s in db if s.context is not None and s.context.trace_id == run_span.context.trace_id
    ]
    assert all(request_span.name in ancestors(s, spans) for s in ours)  # background work aside

    # no message text without the opt-in, no key ever
    text = every_value(spans)
    assert WORDS not in text and "You said" not in text
    assert API_KEY not in text


async def test_message_content_only_when_opted_in(
    exporter: InMemorySpanExporter,
    make_settings: SettingsFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(telemetry.CAPTURE_CONTENT, "true")
    app, client = await traced_client(make_settings)
    async with app.router.lifespan_context(app), client:
        await client.post("/conversations", json={"id": "c"})
        await client.post("/conversations/c/runs", json={"prompts": ["first turn"]})
        exporter.clear()
        ran = await client.post("/conversations/c/runs", json={"prompts": [WORDS]})
        assert ran.status_code == 201
    spans = exporter.get_finished_spans()
    [chat] = by_name(spans, "chat ")
    assert chat.attributes is not None
    sent = json.loads(str(chat.attributes["gen_ai.input.messages"]))
    # what this request adds (the new prompt), not the history before it
    assert [m["type"] for m in sent] == ["user"]
    assert WORDS in json.dumps(sent) and "first turn" not in json.dumps(sent)
    assert WORDS in str(chat.attributes["gen_ai.output.messages"])
    assert API_KEY not in every_value(spans)


async def test_compaction_is_a_span_with_its_summary_request(
    exporter: InMemorySpanExporter, make_settings: SettingsFactory
) -> None:
    app, client = await traced_client(make_settings)
    async with app.router.lifespan_context(app), client:
        await client.post("/conversations", json={"id": "c"})
        for prompt in ("one", "two", "three"):
            await client.post("/conversations/c/runs", json={"prompts": [prompt]})
        exporter.clear()
        compacted = await client.post("/conversations/c/compact")
        assert compacted.status_code in (200, 201), compacted.text
        assert compacted.json()["compactions"], compacted.json()
    spans = exporter.get_finished_spans()
    [compaction] = by_name(spans, "compact manual")
    assert compaction.attributes is not None
    assert compaction.attributes["carryover.compaction.reason"] == "manual"
    assert compaction.attributes["carryover.compaction.folded_messages"] > 0  # type: ignore[operator]
    assert "invoke_agent default" in ancestors(compaction, spans)
    [summary] = by_name(spans, "chat ")
    assert ancestors(summary, spans)[0] == "compact manual"


async def test_tracing_is_off_without_otel_variables(
    client: AppClient, make_settings: SettingsFactory
) -> None:
    assert telemetry.provider() is None
    assert not telemetry.enabled_by({})
    assert not telemetry.enabled_by({"OTEL_SERVICE_NAME": "x"})
    assert telemetry.enabled_by({"OTEL_TRACES_EXPORTER": "console"})
    assert telemetry.enabled_by({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert not telemetry.enabled_by({"OTEL_TRACES_EXPORTER": "none"})
    assert not telemetry.enabled_by({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"})
    await client.post("/conversations", json={"id": "c"})
    ran = await client.post(
        "/conversations/c/runs", json={"prompts": ["hi"]}, headers={"traceparent": TRACEPARENT}
    )
    assert ran.json()["trace_id"] is None
