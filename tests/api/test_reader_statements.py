"""What reading a run costs the database, counted: a client polling a run, following its
events or fetching it as a /v1 response reads the run's rows with statements built once, each
straight on the driver, and the events of a run that ended read the run once. Counts, never
timings (docs/performance.md, "Reads")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.sqlite_driver import OneHopConnection

from .test_run_statements import _COUNTED, API_KEY, MINIMAL, _counted_paths, put, statements

#: an ended run's record: its row (with its prompts' texts), then its audit records
RECORD = ["SELECT runs", "SELECT run_new_messages", "SELECT run_finals", "SELECT run_compactions"]


async def test_reading_an_ended_run_and_its_events(
    app_factory: Callable[..., Any], monkeypatch: Any
) -> None:
    async with app_factory(api_keys=f"acme:{API_KEY}") as client:
        client.headers["Authorization"] = f"Bearer {API_KEY}"
        engine: AsyncEngine = client.app.state.services.engine
        await put(client, "read", 10)
        ran = await client.post(
            "/conversations/read/runs", json={"prompts": ["hi"]}, headers=MINIMAL
        )
        assert ran.status_code == 201
        run = f"/conversations/read/runs/{ran.json()['run_id']}"
        for path in (run, f"{run}/events"):  # warm: each statement compiled once
            assert (await client.get(path)).status_code == 200

        if engine.dialect.name == "sqlite":
            # every statement goes straight to the driver, as a run's own do (on PostgreSQL a
            # statement read outside a transaction takes SQLAlchemy's path). Counted first:
            # an event listener, once added, keeps the engine on SQLAlchemy's path.
            direct, through_sqlalchemy = _counted_paths(monkeypatch, OneHopConnection)
            token = _COUNTED.set(True)
            try:
                assert (await client.get(run)).json()["status"] == "completed"
                assert (await client.get(f"{run}/events")).status_code == 200
            finally:
                _COUNTED.reset(token)
            assert through_sqlalchemy == [], through_sqlalchemy
            assert direct[:4] == RECORD and direct[4:8] == RECORD and len(direct) == 11, direct

        # the events of a run that had ended when they were asked for: the run's record is
        # read once (its run.finished event carries it), then the events' bounds and rows,
        # and the texts of the run's new messages (its events, written with its outcome, are
        # one row naming the texts of its message events)
        with statements(engine) as seen:
            events = await client.get(f"{run}/events")
        assert events.status_code == 200 and events.text.count("event: ") == 5
        assert "event: run.finished" in events.text and '"status":"completed"' in events.text
        read = [s for s in seen if s not in ("BEGIN", "COMMIT")]
        assert read[:4] == RECORD and len(read) == 7, read
        assert read[-1].startswith("SELECT message_texts"), read
        assert read.count("SELECT runs") == 1

        # a /v1 response, found by its id alone: its row is read once too
        made = await client.post("/v1/responses", json={"model": "default", "input": "hi"})
        assert made.status_code == 200
        with statements(engine) as seen:
            got = await client.get(f"/v1/responses/{made.json()['id']}")
        assert got.status_code == 200 and got.json()["status"] == "completed"
        assert [s for s in seen if s not in ("BEGIN", "COMMIT")] == RECORD
