"""``409 run-in-progress`` says when to try again from what is known (docs/faults.md): the
median duration of the conversation's last finished runs, clamped to ``[1, lease_seconds]``
(30 here), or 1 s when none finished yet. Durations come from the injected clock: each held
run lasts exactly what the test advances the clock by, then is cancelled."""

from __future__ import annotations

import pytest

from app.errors import CarryoverError
from app.service.runs import ActiveRun

from .conftest import TENANT, Services
from .test_runs import request


async def _run_lasting(services: Services, conv: str, seconds: float) -> None:
    active = await services.runs.start(TENANT, conv, request("/sleep 60 held"), if_match=None)
    assert isinstance(active, ActiveRun)
    services.clock.advance(seconds)
    await services.runs.cancel(TENANT, conv, active.run_id)
    finished = await services.runs.wait(active, on_disconnect="continue", disconnected=None)
    assert finished.outcome.status == "cancelled"


async def _retry_after(services: Services, conv: str) -> str:
    active = await services.runs.start(TENANT, conv, request("/sleep 60 holder"), if_match=None)
    assert isinstance(active, ActiveRun)
    try:
        with pytest.raises(CarryoverError) as info:
            await services.runs.start(TENANT, conv, request("me too"), if_match=None)
        assert info.value.slug == "run-in-progress"
        return info.value.headers["Retry-After"]
    finally:
        await services.runs.cancel(TENANT, conv, active.run_id)
        await services.runs.wait(active, on_disconnect="continue", disconnected=None)


async def test_retry_after_is_the_median_of_recent_run_durations_clamped(
    services: Services,
) -> None:
    await services.conversations.create(TENANT, "c1")
    assert await _retry_after(services, "c1") == "1"  # nothing finished but instant runs

    await services.conversations.create(TENANT, "c2")
    for seconds in (3.0, 4.0, 200.0):
        await _run_lasting(services, "c2", seconds)
    assert await _retry_after(services, "c2") == "4"  # the median, not the 200 s outlier

    await services.conversations.create(TENANT, "c3")
    for seconds in (100.0, 100.0):
        await _run_lasting(services, "c3", seconds)
    assert await _retry_after(services, "c3") == "30"  # never more than one lease

    await services.conversations.create(TENANT, "c4")
    await _run_lasting(services, "c4", 0.2)
    assert await _retry_after(services, "c4") == "1"  # at least 1 s
