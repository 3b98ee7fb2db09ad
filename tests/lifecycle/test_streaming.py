"""The run as server-sent events (contract §4): ``run.started`` first, each message as it is
completed (the prompt first), deltas before the message they build, ``tool.started`` before
``tool.finished``, compactions, and ``run.finished`` last with the same body as the JSON answer
and the new ETag."""

from __future__ import annotations

from typing import Any

import httpx

from .harness import Server, Servers, client, create_conversation, sse_events, stored_context


async def _stream(
    http: httpx.AsyncClient, conv: str, prompt: str, **headers: str
) -> tuple[httpx.Response, list[tuple[str, Any]]]:
    async with http.stream(
        "POST",
        f"/conversations/{conv}/runs",
        json={"prompts": [prompt]},
        headers={"Accept": "text/event-stream", **headers},
    ) as response:
        events = [item async for item in sse_events(response)]
    return response, events


def _check_order(events: list[tuple[str, Any]], base_etag: str) -> dict[str, Any]:
    """The ordering rules; returns the run.finished body."""
    names = [name for name, _ in events]
    assert names[0] == "run.started" and names[-1] == "run.finished"
    assert names.count("run.started") == names.count("run.finished") == 1
    started = events[0][1]
    assert started["base_etag"] == base_etag
    finished: dict[str, Any] = events[-1][1]
    assert finished["run_id"] == started["run_id"]

    # the prompt is the first message, before any delta
    assert names[1] == "message" and events[1][1]["type"] == "user"

    # each assistant message is preceded by the deltas that built it: its text, in order
    texts: list[str] = []
    open_calls: list[str] = []
    for name, data in events[2:-1]:
        if name == "delta":
            if data["kind"] == "text":
                texts.append(data["text"])
        elif name == "message" and data["type"] == "assistant":
            text = "".join(b["text"] for b in data["content"] if b["type"] == "text")
            calls = [b for b in data["content"] if b["type"] == "tool_call"]
            assert "".join(texts) == text
            # something was streamed before it, unless it failed before any content came
            assert text or calls or data["stop_reason"] in ("error", "aborted")
            texts = []
        elif name == "tool.started":
            open_calls.append(data["id"])
        elif name == "tool.finished":
            assert data["tool_call_id"] in open_calls  # started before it finished
            open_calls.remove(data["tool_call_id"])
    assert not open_calls and not texts

    # the messages streamed are the run's new messages (its prompt first), in order
    assert [data for name, data in events if name == "message"] == finished["new_messages"]
    return finished


async def test_sse_order_and_last_event_equals_the_json_answer(
    postgres_url: str, servers: Servers
) -> None:
    [server] = await servers.start(postgres_url)
    async with client(server) as http:
        conv, created = await create_conversation(http)
        key = {"Idempotency-Key": "stream-1"}
        response, events = await _stream(http, conv, '/tool wait {"seconds": 0.2}', **key)
        assert response.status_code == 201
        assert response.headers["content-type"].startswith("text/event-stream")
        finished = _check_order(events, created)
        names = [name for name, _ in events]
        # call → tool.started → tool.finished → its result → the answer quoting it
        assert names.index("tool.started") < names.index("tool.finished")
        kinds = [d["type"] for n, d in events if n == "message"]
        assert kinds == ["user", "assistant", "tool_result", "assistant"]
        assert finished["status"] == "completed" and finished["stored"] is True

        # the last event carries the new ETag...
        context, etag = await stored_context(http, conv)
        assert finished["etag"] == etag != created
        assert finished["context"] == context
        assert response.headers["location"] == f"/conversations/{conv}/runs/{finished['run_id']}"
        # ...and the same body as the JSON answer: the same request as JSON replays that answer
        replay = await http.post(
            f"/conversations/{conv}/runs",
            headers=key,
            json={"prompts": ['/tool wait {"seconds": 0.2}']},
        )
        assert replay.status_code == 201 and replay.headers["idempotent-replayed"] == "true"
        assert replay.json() == finished
        assert replay.headers["etag"] == etag
        # and the run record agrees (records leave the context out)
        record = (await http.get(f"/conversations/{conv}/runs/{finished['run_id']}")).json()
        assert record == {k: v for k, v in finished.items() if k != "context"}


async def test_sse_with_compaction_and_failure(postgres_url: str, servers: Servers) -> None:
    [server] = await servers.start(postgres_url)
    server_: Server = server
    async with client(server_) as http:
        conv, _ = await create_conversation(http)
        first = await http.post(f"/conversations/{conv}/runs", json={"prompts": ["hello"]})
        etag = first.headers["etag"]

        # an overflow: the attempt fails, the agent compacts and retries
        _, events = await _stream(http, conv, "/overflow")
        finished = _check_order(events, etag)
        names = [name for name, _ in events]
        assert "compaction" in names
        failed_attempt = next(
            i
            for i, (n, d) in enumerate(events)
            if n == "message" and d.get("stop_reason") == "error"
        )
        assert failed_attempt < names.index("compaction") < len(names) - 2
        assert finished["status"] == "completed" and len(finished["compactions"]) == 1
        assert finished["compactions"][0] == events[names.index("compaction")][1]

        # a failing provider: the stream still ends with run.finished
        _, events = await _stream(http, conv, "/fail")
        finished = _check_order(events, finished["etag"])
        assert finished["status"] == "failed"
        assert finished["error"]["type"].endswith("/run-provider-error")
