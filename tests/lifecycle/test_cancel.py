"""Cancelling runs: from another process (contract §4 ``POST …/cancel`` "from any replica") and by a
client that goes away (``on_disconnect``), streaming or not."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from ..fakes.gated_http import PROFILE, GatedOpenAI, HeldRequest
from ..helpers import HANG_GUARD_SECONDS, user_texts
from .harness import (
    Servers,
    background_run,
    client,
    create_conversation,
    run_ends,
    sse_events,
    started_run,
    stored_context,
)


@pytest.mark.parametrize("on_failure", ["keep", "discard"])
async def test_cancel_on_another_server(
    on_failure: str, postgres_url: str, servers: Servers, gate: GatedOpenAI
) -> None:
    a, b = await servers.start(postgres_url, 2, **gate.settings())
    async with client(b) as http:
        conv, created = await create_conversation(http)
        running = background_run(a, conv, "cancel me", on_failure=on_failure, agent=PROFILE)
        held = await gate.arrival("cancel me")  # the model is answering on server a
        run_id = await started_run(http, conv)

        asked = await http.post(f"/conversations/{conv}/runs/{run_id}/cancel")
        assert asked.status_code == 202, asked.text
        assert asked.json()["run_id"] == run_id

        answer = await asyncio.wait_for(running, HANG_GUARD_SECONDS)
        # the model's request was never released: the cancel, not an answer, ended the run
        assert not held.released.is_set()
        assert answer.status_code == 201, answer.text
        body = answer.json()
        assert body["run_id"] == run_id and body["status"] == "cancelled"
        assert body["error"]["type"].endswith("/run-cancelled")
        record = await run_ends(http, conv, run_id)
        assert record["status"] == "cancelled" and record["stored"] == body["stored"]

        context, etag = await stored_context(http, conv)
        assert etag == body["etag"]
        if on_failure == "keep":  # §3.2: after admission the prompt is in the context
            assert body["stored"] is True
            assert user_texts(context["messages"]) == ["cancel me"]
        else:  # the stored state stays as before the run
            assert body["stored"] is False
            assert context["messages"] == [] and etag == created
        # the attempt that was cut off is in the run record either way
        assert [m["stop_reason"] for m in record["new_messages"] if m["type"] == "assistant"] == [
            "aborted"
        ]

        again = await http.post(f"/conversations/{conv}/runs/{run_id}/cancel")
        assert again.status_code == 409 and again.json()["type"].endswith("/run-not-active")
        # the conversation is free again
        after = await http.post(f"/conversations/{conv}/runs", json={"prompts": ["next"]})
        assert after.status_code == 201 and after.json()["status"] == "completed"


async def test_cancel_during_a_tool_batch_on_another_server(
    postgres_url: str, servers: Servers
) -> None:
    """A streamed run cancelled from another server while its tool runs: the stream ends with
    ``run.finished`` saying ``cancelled``; on_failure keep stores the call with an
    ``interrupted`` result (the run closes it, docs/tools.md), and the next run goes on."""
    a, b = await servers.start(postgres_url, 2)
    async with client(b) as http:
        conv, _ = await create_conversation(http)
        events: list[str] = []
        async with (
            client(a) as http_a,
            http_a.stream(
                "POST",
                f"/conversations/{conv}/runs",
                headers={"Accept": "text/event-stream"},
                json={"prompts": ['/tool wait {"seconds": 60}']},
            ) as response,
        ):
            async for event, data in sse_events(response):
                events.append(event)
                if event == "run.started":
                    run_id = data["run_id"]
                elif event == "tool.started":
                    asked = await http.post(f"/conversations/{conv}/runs/{run_id}/cancel")
                    assert asked.status_code == 202
                elif event == "run.finished":
                    finished = data
        assert events[-1] == "run.finished" and "tool.finished" not in events
        assert finished["status"] == "cancelled" and finished["stored"] is True
        context, etag = await stored_context(http, conv)
        assert etag == finished["etag"]
        # the cancelled run closed its unfinished call itself (docs/tools.md)
        assert [m["type"] for m in context["messages"]] == ["user", "assistant", "tool_result"]

        nxt = await http.post(f"/conversations/{conv}/runs", json={"prompts": ["go on"]})
        assert nxt.status_code == 201 and nxt.json()["status"] == "completed"
        context, _ = await stored_context(http, conv)
        assert [m["type"] for m in context["messages"]] == [
            "user",
            "assistant",
            "tool_result",
            "user",
            "assistant",
        ]
        assert context["messages"][2]["is_error"] is True


async def _disconnect_json(
    server: Any, gate: GatedOpenAI, conv: str, prompt: str, on_disconnect: str
) -> str:
    """Start a non-streaming run, then close the connection while its model request is held;
    its run id."""
    running = background_run(server, conv, prompt, on_disconnect=on_disconnect, agent=PROFILE)
    await gate.arrival(prompt)
    async with client(server) as http:
        run_id = await started_run(http, conv)
    running.cancel()  # closes the connection mid-request
    with pytest.raises(asyncio.CancelledError):
        await running
    return run_id


async def _disconnect_stream(
    server: Any, gate: GatedOpenAI, conv: str, prompt: str, on_disconnect: str
) -> str:
    """Start a streaming run, read ``run.started``, then close the connection while its model
    request is held; its run id."""
    async with (
        client(server) as http,
        http.stream(
            "POST",
            f"/conversations/{conv}/runs",
            headers={"Accept": "text/event-stream"},
            json={"prompts": [prompt], "on_disconnect": on_disconnect, "agent": PROFILE},
        ) as response,
    ):
        assert response.status_code == 201
        async for event, data in sse_events(response):
            assert event == "run.started"
            await gate.arrival(prompt)
            return str(data["run_id"])
    raise AssertionError("no run.started event")


@pytest.mark.parametrize("how", ["json", "stream"])
async def test_a_client_that_goes_away_cancels_only_when_asked(
    how: str, postgres_url: str, servers: Servers, gate: GatedOpenAI
) -> None:
    [server] = await servers.start(postgres_url, **gate.settings())
    disconnect = _disconnect_json if how == "json" else _disconnect_stream
    async with client(server) as http:
        conv, created = await create_conversation(http)

        # on_disconnect: cancel — the run stops when the client goes away
        run_id = await disconnect(server, gate, conv, "gone", "cancel")
        record = await run_ends(http, conv, run_id, within=HANG_GUARD_SECONDS)
        assert record["status"] == "cancelled"
        assert not (await gate.arrival("gone")).released.is_set()  # no answer ended it
        context, _ = await stored_context(http, conv)
        assert user_texts(context["messages"]) == ["gone"]  # on_failure keep

        # on_disconnect: continue (the default) — the run completes and is stored
        run_id = await disconnect(server, gate, conv, "stay", "continue")
        (await gate.arrival("stay")).release()  # the model answers after the client left
        record = await run_ends(http, conv, run_id, within=HANG_GUARD_SECONDS)
        assert record["status"] == "completed" and record["stored"] is True
        context, etag = await stored_context(http, conv)
        assert user_texts(context["messages"]) == ["gone", "stay"]
        assert etag == record["etag"] != created


async def test_cancels_racing_the_end_of_a_run_leave_its_answer_whole(
    postgres_url: str, servers: Servers, gate: GatedOpenAI
) -> None:
    """Many cancels racing the end of a run (its model answers as they are sent): its answer
    is a run record, never a 500."""
    [server] = await servers.start(postgres_url, **gate.settings())
    async with client(server) as http:
        conv, _ = await create_conversation(http)
        for n in range(5):
            running = background_run(server, conv, "race", agent=PROFILE)
            held = await gate.arrival("race", count=n + 1)
            run_id = await started_run(http, conv)

            async def cancel(run_id: str = run_id) -> httpx.Response:
                return await http.post(f"/conversations/{conv}/runs/{run_id}/cancel")

            async def answer_now(held: HeldRequest = held) -> None:
                held.release()

            *cancels, _ = await asyncio.gather(*(cancel() for _ in range(10)), answer_now())
            answer = await running
            assert answer.status_code == 201, answer.text
            assert answer.json()["status"] in ("cancelled", "completed")
            assert {c.status_code for c in cancels} <= {202, 409}
