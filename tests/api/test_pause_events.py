"""The order of a paused run's events (docs/runs.md "Events and resume", docs/tools.md): a run
that pauses says ``run.requires_action`` right before ``run.finished`` only once the pause is
stored. A pause whose save ends ``conflicted`` asked nothing of the client: neither the POST's
stream nor the stored events say it, and their numbers have no gap. Both engines; the run is
held in flight with :class:`GatedProvider` while the context is replaced (nothing is timed)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from ..fakes.gated import GatedProvider, gated_pool
from ..helpers import user
from .conftest import AppClient, SettingsFactory

LOOKUP = {
    "name": "lookup",
    "description": "Look a word up in the application's dictionary",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
}
BODY = {"prompts": ['/tool lookup {"word": "x"}'], "tools": [LOOKUP], "stream": True}

Event = tuple[int, str, Any]


@pytest.fixture
def gate() -> GatedProvider:
    """Holds the runs whose prompt is a ``/tool`` directive (they call the client tool)."""
    return GatedProvider(hold=lambda prompt: prompt.startswith("/tool"))


@pytest.fixture
async def client(
    app_factory: Callable[..., Any], make_settings: SettingsFactory, gate: GatedProvider
) -> AsyncIterator[AppClient]:
    async with app_factory(agents=gated_pool(make_settings(), gate)) as http:
        try:
            assert (await http.post("/conversations", json={"id": "conv"})).status_code == 201
            yield http
        finally:
            gate.open()


def parse_sse(text: str) -> list[Event]:
    events = []
    for chunk in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in chunk.splitlines())
        events.append((int(fields["id"]), fields["event"], json.loads(fields["data"])))
    return events


async def streamed(client: AppClient) -> list[Event]:
    async with client.stream("POST", "/conversations/conv/runs", json=BODY) as answer:
        assert answer.status_code == 201
        return parse_sse("".join([chunk async for chunk in answer.aiter_text()]))


async def stored_events(client: AppClient, run_id: str) -> list[Event]:
    answer = await client.get(f"/conversations/conv/runs/{run_id}/events")
    assert answer.status_code == 200, answer.text
    return parse_sse(answer.text)


def names(events: list[Event]) -> list[str]:
    return [name for _, name, _ in events]


def numbered_from_one(events: list[Event]) -> bool:
    return [seq for seq, _, _ in events] == list(range(1, len(events) + 1))


async def test_a_pause_whose_save_conflicts_never_says_requires_action(
    client: AppClient, gate: GatedProvider
) -> None:
    running = asyncio.create_task(streamed(client))
    await gate.arrival()  # the run is in flight; its answer will call the client tool
    etag = (await client.get("/conversations/conv/context")).headers["etag"]
    replacement = {"system_prompt": "", "summary": "", "messages": [user("a new beginning")]}
    put = await client.put(
        "/conversations/conv/context", json=replacement, headers={"If-Match": etag}
    )
    assert put.status_code == 200, put.text
    gate.release_all()

    events = await running
    assert "run.requires_action" not in names(events)
    assert names(events)[-1] == "run.finished"
    finished = events[-1][2]
    assert finished["status"] == "conflicted" and finished["required_action"] is None
    assert numbered_from_one(events)
    stored = await stored_events(client, finished["run_id"])
    assert names(stored) == names(events) and numbered_from_one(stored)
    assert (await client.get("/conversations/conv")).json()["pending_tool_calls"] == []


async def test_a_stored_pause_says_requires_action_right_before_the_end(
    client: AppClient, gate: GatedProvider
) -> None:
    gate.open()
    events = await streamed(client)
    assert names(events)[-2:] == ["run.requires_action", "run.finished"]
    finished = events[-1][2]
    assert finished["status"] == "requires_action"
    assert events[-2][2] == finished["required_action"]
    assert numbered_from_one(events)
    stored = await stored_events(client, finished["run_id"])
    assert names(stored) == names(events) and numbered_from_one(stored)
    assert stored[-2][2] == finished["required_action"]
