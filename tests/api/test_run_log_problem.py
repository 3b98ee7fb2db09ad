"""Through the app, a run's end line names the problem type its record carries."""

from __future__ import annotations

import logging

import pytest

from .conftest import AppClient


async def test_the_end_line_names_the_records_problem_slug(
    client: AppClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="carryover.runs")
    assert (await client.post("/conversations", json={"id": "c"})).status_code == 201
    ran = await client.post("/conversations/c/runs", json={"prompts": ["/fail"]})
    body = ran.json()
    [line] = [r for r in caplog.records if getattr(r, "event", "") == "run.ended"]
    assert line.run_id == body["run_id"]  # type: ignore[attr-defined]
    assert body["error"]["type"].endswith("/" + line.problem)  # type: ignore[attr-defined]
    assert line.problem == "run-provider-error"  # type: ignore[attr-defined]
