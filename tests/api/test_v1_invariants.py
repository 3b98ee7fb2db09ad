"""Every conversation written through ``/v1`` keeps the native invariants (contract §1, §4):
random programs of OpenAI-shaped requests — responses carried over a conversation, streamed
ones, function calls and their outputs, items added without a response, unstored responses
and forks by ``previous_response_id`` — and after each program, read natively:

- the stored context is replayable (every call answered, or an open batch that
  ``required_action`` lists);
- lossless: the stored messages, the transcript's message entries, the run records' new
  messages (in the chain of their ETags) and the ``/v1`` items all say the same, byte for
  byte where they hold the same JSON;
- a refused request (new input while a call is unanswered) and an unstored response change
  nothing: the ETag, the runs and the transcript stay as they were.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.agent.codec import dump_message, dumps_message, load_context, load_message
from app.agent.replay import validate_context
from app.api.app import create_app
from app.api.v1.items import messages_of
from app.config import Settings

from .conftest import AppClient

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
#: text as a client sends it: any printable character, quotes and backslashes included
TEXT = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=40
)
STEP = st.one_of(
    st.tuples(st.just("say"), TEXT),
    st.tuples(st.just("stream"), TEXT),
    st.tuples(st.just("call"), TEXT),
    st.tuples(st.just("answer"), TEXT),
    st.tuples(st.just("items"), TEXT),
    st.tuples(st.just("unstored"), TEXT),
    st.tuples(st.just("fork"), TEXT),
)


@asynccontextmanager
async def started(database_url: str) -> AsyncIterator[AppClient]:
    app = create_app(Settings(database_url=database_url, lease_seconds=5.0))
    client = AppClient(transport=httpx.ASGITransport(app=app), base_url="http://carryover.test")
    client.app = app
    async with app.router.lifespan_context(app), client:
        yield client


async def respond(client: AppClient, **body: Any) -> tuple[int, dict[str, Any]]:
    answer = await client.post("/v1/responses", json={"model": "default", **body})
    return answer.status_code, answer.json()


async def streamed(client: AppClient, **body: Any) -> dict[str, Any]:
    """A streamed response, read to its last event: the response it completed with."""
    final: dict[str, Any] | None = None
    async with client.stream(
        "POST", "/v1/responses", json={"model": "default", "stream": True, **body}
    ) as answer:
        assert answer.status_code == 200
        async for line in answer.aiter_lines():
            if line.startswith("data: "):
                event = json.loads(line[len("data: ") :])
                if event["type"] == "response.completed":
                    final = event["response"]
    assert final is not None, "the stream ended without response.completed"
    return final


async def state(client: AppClient, conv: str) -> tuple[str, int, int]:
    """What a refused or unstored request must leave as it was: ETag, runs, transcript."""
    etag = (await client.get(f"/conversations/{conv}/context")).headers["etag"]
    runs = await paged(client, f"/conversations/{conv}/runs")
    entries = await paged(client, f"/conversations/{conv}/transcript")
    return etag, len(runs), len(entries)


async def paged(client: AppClient, path: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params = {"limit": 100, **({"cursor": cursor} if cursor else {})}
        page = await client.get(path, params=params)
        assert page.status_code == 200, page.text
        out += page.json()["items"]
        cursor = page.json()["next_cursor"]
        if cursor is None:
            return out


async def items(client: AppClient, conv: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    after: str | None = None
    while True:
        params: dict[str, Any] = {
            "order": "asc",
            "limit": 100,
            **({"after": after} if after else {}),
        }
        page = await client.get(f"/v1/conversations/{conv}/items", params=params)
        assert page.status_code == 200, page.text
        out += page.json()["data"]
        if not page.json()["has_more"]:
            return out
        after = page.json()["last_id"]


def canonical(message: dict[str, Any]) -> str:
    return dumps_message(load_message(message))


def content_of(message: dict[str, Any]) -> str:
    """What an item carries of a message (docs/openai.md, "Items and messages"): its kind and
    its blocks — an assistant's provider metadata stays on the stored message."""
    loaded = load_message(message).model_dump(mode="json")
    kept = {"type", "content", "tool_call_id"}
    return json.dumps({k: v for k, v in loaded.items() if k in kept}, sort_keys=True)


async def check_invariants(client: AppClient, conv: str) -> None:
    body = (await client.get(f"/conversations/{conv}/context")).json()
    validate_context(load_context(body), allow_open_batch=True)
    stored = [canonical(m) for m in body["messages"]]

    # A fork by previous_response_id starts with a copy of its source's first messages, which
    # its transcript's first entry (``forked``) counts; the rest was added here.
    entries = await paged(client, f"/conversations/{conv}/transcript")
    copied = entries[0]["body"]["messages"] if entries and entries[0]["kind"] == "forked" else 0
    assert all(e["kind"] != "forked" for e in entries[1:])

    # the transcript's message entries, outside failed attempts, are the messages added
    message_kinds = {"prompt", "attempt", "tool_result", "client_result"}
    said = [canonical(e["body"]) for e in entries if e["kind"] in message_kinds and not e["failed"]]
    assert said == stored[copied:]

    # the stored runs, in the chain of their ETags, added exactly those messages
    runs = [r for r in await paged(client, f"/conversations/{conv}/runs") if r["stored"]]
    by_base = {r["base_etag"]: r for r in runs}
    assert len(by_base) == len(runs), "two stored runs continued the same version"
    # the chain starts at the version the conversation was created with
    starts = {r["base_etag"] for r in runs} - {r["etag"] for r in runs}
    assert len(starts) <= 1, starts
    start = next(iter(starts), None)
    chain: list[dict[str, Any]] = []
    while start in by_base:
        chain.append(by_base[start])
        start = by_base[start]["etag"]
    assert len(chain) == len(runs), "the stored runs are not one chain of versions"
    added = [canonical(m) for r in chain for m in r["new_messages"]]
    assert added == stored[copied:]
    if chain:
        current = (await client.get(f"/conversations/{conv}/context")).headers["etag"]
        assert chain[-1]["etag"] == current

    # the items say the same, and come back to the same messages (a fork's items start at the
    # fork: docs/openai.md, "Differences from OpenAI")
    listed = await items(client, conv)
    again = messages_of(listed, lambda call_id: None, where="items").messages
    assert [content_of(dump_message(m)) for m in again] == [
        content_of(m) for m in body["messages"][copied:]
    ]
    assert len({i["id"] for i in listed}) == len(listed), "two items share an id"
    assert listed == await items(client, conv), "ids or items changed between two reads"


async def play(client: AppClient, program: list[tuple[str, str]]) -> None:
    conv = (await client.post("/v1/conversations", json={})).json()["id"]
    forks: list[str] = []
    pending: list[str] = []
    responses: list[str] = []
    for op, text in program:
        before = await state(client, conv)
        if pending and op in ("say", "stream", "call", "items"):
            # new input while a call is unanswered: refused, and nothing changes
            if op == "items":
                refused = await client.post(
                    f"/v1/conversations/{conv}/items",
                    json={"items": [{"type": "message", "role": "user", "content": text}]},
                )
                status = refused.status_code
            else:
                status, _ = await respond(client, input=text, conversation=conv, tools=[WEATHER])
            assert status == 400
            assert await state(client, conv) == before
            continue
        if op == "say":
            status, answer = await respond(client, input=text, conversation=conv)
            assert status == 200, answer
            responses.append(answer["id"])
        elif op == "stream":
            answer = await streamed(client, input=text, conversation=conv)
            assert answer["status"] == "completed"
            responses.append(answer["id"])
        elif op == "call":
            city = json.dumps({"city": text})
            status, answer = await respond(
                client, input=f"/tool get_weather {city}", conversation=conv, tools=[WEATHER]
            )
            assert status == 200, answer
            calls = [o for o in answer["output"] if o["type"] == "function_call"]
            assert [json.loads(c["arguments"]) for c in calls] == [{"city": text}]
            pending = [c["call_id"] for c in calls]
            responses.append(answer["id"])
        elif op == "answer" and pending:
            outputs = [
                {"type": "function_call_output", "call_id": call, "output": text}
                for call in pending
            ]
            status, answer = await respond(
                client, input=outputs, conversation=conv, tools=[WEATHER]
            )
            assert status == 200, answer
            pending = []
            responses.append(answer["id"])
        elif op == "items":
            added = await client.post(
                f"/v1/conversations/{conv}/items",
                json={"items": [{"type": "message", "role": "user", "content": text}]},
            )
            assert added.status_code == 200, added.text
        elif op == "unstored" and responses and not pending:
            status, answer = await respond(
                client, input=text, previous_response_id=responses[-1], store=False
            )
            assert status == 200, answer
            assert (await client.get(f"/v1/responses/{answer['id']}")).status_code == 404
            assert await state(client, conv) == before
        elif op == "fork" and len(responses) > 1 and not pending:
            status, answer = await respond(client, input=text, previous_response_id=responses[0])
            if status == 200:
                forks.append(answer["conversation"]["id"])
                assert await state(client, conv) == before, "a fork wrote to its source"
            else:  # a response a later compaction or pending call made unforkable, said plainly
                assert status == 400, answer
        await check_invariants(client, conv)
    for fork in forks:
        await check_invariants(client, fork)


@settings(
    max_examples=12,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(STEP, min_size=1, max_size=7))
def test_conversations_written_through_v1_keep_the_native_invariants(
    database_url: str, program: list[tuple[str, str]]
) -> None:
    # One database for the examples; each plays on conversations of its own.
    async def main() -> None:
        async with started(database_url) as client:
            await play(client, program)

    asyncio.run(main())
