"""The run service's log lines (docs/operations.md "Log lines"): one per run end with its fields,
and one per cancel, takeover and refusal; in the text and the JSON format."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

from app.agent.messages import UserMessage
from app.errors import CarryoverError
from app.observability import JsonFormatter
from app.service.runs import ActiveRun, FinishedRun, RunRequest

from .conftest import TENANT, Services

LOGGER = "carryover.runs"


def request(*prompts: str, **options: Any) -> RunRequest:
    return RunRequest(prompts=tuple(UserMessage.text(p) for p in prompts), **options)


async def run(services: Services, conv: str, req: RunRequest) -> FinishedRun:
    active = await services.runs.start(TENANT, conv, req, if_match=None)
    assert isinstance(active, ActiveRun)
    return await asyncio.wait_for(
        services.runs.wait(active, on_disconnect="continue", disconnected=None), 20
    )


def lines(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and getattr(r, "event", "") == event]


def as_json(record: logging.LogRecord) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(JsonFormatter().format(record))
    return parsed


async def test_a_run_end_is_one_line_with_its_fields(
    services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    await services.conversations.create(TENANT, "c1")
    finished = await run(services, "c1", request('/tool wait {"seconds": 0}'))
    [line] = lines(caplog, "run.ended")
    assert line.levelno == logging.INFO
    entry = as_json(line)
    usage = finished.result.usage
    assert {k: entry[k] for k in entry if k not in ("time", "message", "duration_seconds")} == {
        "level": "INFO",
        "logger": LOGGER,
        "event": "run.ended",
        "run_id": finished.run.run_id,
        "conversation_id": "c1",
        "tenant": TENANT,
        "agent": "default",
        "status": "completed",
        "attempts": 2,  # the tool call, then the answer
        "compactions": 0,
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cache_read_tokens": usage.cache_read_tokens,
        "problem": None,
        "trace_id": None,
    }
    assert usage.input_tokens > 0 and usage.output_tokens > 0
    expected = (finished.outcome.finished_at - finished.run.created_at).total_seconds()  # type: ignore[operator]
    assert entry["duration_seconds"] == round(expected, 3)
    # the text format shows the message alone: it carries every field too
    text = logging.Formatter("%(message)s").format(line)
    assert text.startswith("run.ended run_id=" + finished.run.run_id)
    for part in ("tenant=acme", "status=completed", "attempts=2", "problem=-"):
        assert part in text


async def test_a_failed_run_is_a_warning_naming_its_problem(
    services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    await services.conversations.create(TENANT, "c1")
    finished = await run(services, "c1", request("/fail"))
    assert finished.outcome.status == "failed"
    [line] = lines(caplog, "run.ended")
    assert line.levelno == logging.WARNING
    assert (line.status, line.attempts) == ("failed", 1)  # type: ignore[attr-defined]
    # without the API's registry the service names the status; the app names the slug
    assert line.problem is not None  # type: ignore[attr-defined]


async def test_refusals_are_logged_with_their_problem(
    services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    await services.conversations.create(TENANT, "c1")
    with pytest.raises(CarryoverError):
        await services.runs.start(TENANT, "c1", request("x", agent="ghost"), if_match=None)
    with pytest.raises(CarryoverError):
        await services.runs.start(TENANT, "nope", request("x"), if_match=None)
    first, second = lines(caplog, "run.refused")
    assert (first.problem, first.http_status, first.agent) == (  # type: ignore[attr-defined]
        "validation-error",
        422,
        "ghost",
    )
    assert (second.problem, second.conversation_id) == ("not-found", "nope")  # type: ignore[attr-defined]
    assert as_json(second)["tenant"] == TENANT
    assert not lines(caplog, "run.ended")


async def test_a_takeover_is_logged(services: Services, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    await services.conversations.create(TENANT, "c1")
    await services.repo.start_run(
        TENANT,
        "c1",
        run_id="dead",
        if_match=None,
        prompts=(),
        agent="default",
        on_failure="keep",
        owner="a process that died",
        lease_seconds=30,
    )
    services.clock.advance(31)
    finished = await run(services, "c1", request("hello"))
    [line] = lines(caplog, "run.taken_over")
    entry = as_json(line)
    assert entry["level"] == "WARNING"
    assert (entry["interrupted_run_id"], entry["run_id"]) == ("dead", finished.run.run_id)
    assert entry["conversation_id"] == "c1" and entry["tenant"] == TENANT


async def test_a_cancel_is_logged_then_the_cancelled_end(
    services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    await services.conversations.create(TENANT, "c1")
    active = await services.runs.start(
        TENANT, "c1", request('/tool wait {"seconds": 60}'), if_match=None
    )
    assert isinstance(active, ActiveRun)
    await services.runs.cancel(TENANT, "c1", active.run_id)
    finished = await asyncio.wait_for(
        services.runs.wait(active, on_disconnect="continue", disconnected=None), 20
    )
    assert finished.outcome.status == "cancelled"
    [cancel] = lines(caplog, "run.cancel_requested")
    assert (cancel.run_id, cancel.here) == (active.run_id, True)  # type: ignore[attr-defined]
    [end] = lines(caplog, "run.ended")
    assert (end.status, end.run_id) == ("cancelled", active.run_id)  # type: ignore[attr-defined]
