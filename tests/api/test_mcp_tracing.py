"""Each MCP call is an ``execute_tool`` span of the run's trace (docs/operations.md "Traces"),
naming its server; a call that failed is marked an error; no header value reaches a span."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from app import telemetry

from ..fakes.mcp_server import FakeMcp
from .conftest import SettingsFactory, start_client
from .test_tracing import ancestors, by_name, every_value

SECRET = "Bearer traced-mcp-secret-91"


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


async def test_an_mcp_call_is_an_execute_tool_span_naming_its_server(
    exporter: InMemorySpanExporter, make_settings: SettingsFactory
) -> None:
    with FakeMcp("traced") as fake:
        servers = [
            {
                "label": "dict",
                "url": fake.url,
                "require_approval": "never",
                "headers": {"Authorization": SECRET},
            }
        ]
        app, client = await start_client(make_settings(mcp_servers=servers))
        async with app.router.lifespan_context(app), client:
            assert (await client.post("/conversations", json={"id": "c"})).status_code == 201
            exporter.clear()
            for prompt in ('/tool lookup {"word": "span"}', '/tool explode {"reason": "x"}'):
                ran = await client.post("/conversations/c/runs", json={"prompts": [prompt]})
                assert ran.status_code == 201, ran.text
            spans = exporter.get_finished_spans()
    looked, exploded = by_name(spans, "execute_tool ")
    assert (looked.name, exploded.name) == ("execute_tool lookup", "execute_tool explode")
    for span in (looked, exploded):
        assert span.attributes is not None
        assert span.attributes["carryover.tool.server"] == "dict"
        assert span.attributes["gen_ai.tool.type"] == "extension"
        assert ancestors(span, spans)[0] == "invoke_agent default"
    assert looked.status.status_code != StatusCode.ERROR
    assert exploded.status.status_code == StatusCode.ERROR
    assert "traced-mcp-secret" not in every_value(spans)
