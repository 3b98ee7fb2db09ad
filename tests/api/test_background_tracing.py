"""Background work starts no traces: a database statement is traced only under a request or
run span, so the pollers (leases, queue, webhooks, events, retention) of an idle replica
export nothing, while a request's statements stay in its trace."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import text

from app import telemetry
from app.store.db import make_engine

from .conftest import SettingsFactory, start_client


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


async def test_a_statement_outside_any_span_is_not_traced(
    exporter: InMemorySpanExporter, tmp_path: Path
) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    telemetry.instrument_engine(engine)
    try:
        async with engine.connect() as conn:  # as a poller does: no span around it
            await conn.execute(text("SELECT 1"))
        assert exporter.get_finished_spans() == ()
        with telemetry.span("a request"):
            async with engine.connect() as conn:
                await conn.execute(text("SELECT 2"))
    finally:
        await engine.dispose()
    spans = exporter.get_finished_spans()
    [root] = [s for s in spans if s.parent is None]
    assert root.name == "a request"
    assert len(spans) > 1 and all(s.context.trace_id == root.context.trace_id for s in spans)


async def test_an_app_that_starts_and_stops_exports_no_parentless_database_spans(
    exporter: InMemorySpanExporter, make_settings: SettingsFactory
) -> None:
    app, client = await start_client(make_settings())
    async with app.router.lifespan_context(app), client:
        assert (await client.post("/conversations", json={"id": "c"})).status_code == 201
        assert (await client.post("/conversations/c/runs", json={"prompts": ["hi"]})).is_success
    spans = exporter.get_finished_spans()
    roots = [s for s in spans if s.parent is None]
    assert roots, "the requests are traced"
    assert all(s.kind.name == "SERVER" for s in roots), sorted(s.name for s in roots)
