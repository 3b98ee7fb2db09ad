"""PostgreSQL stopped with runs in flight (docs/faults.md, issue 11).

Two servers on one database, each run held at the gated model until the database is down:

- server A retries an outcome write for 60 s (``outcome_retry_seconds``): its runs finish
  once the database is back — 201 ``completed``, stored exactly once, a stream ends with
  ``run.finished``; their leases expired during the outage, yet no process marks them
  interrupted (the sweep waits for live processes to renew first);
- server B gives up after 5 s: its clients get ``503 database-unavailable`` with
  ``stored: false`` (a stream ends with an ``error`` event carrying that problem, then the end
  of the body), nothing of the runs is stored, and once the database is back their records
  end ``interrupted`` with a reason naming the outage, and their conversations are free;
- a request waiting for a busy conversation (``if_busy: wait``) gets a 503, not a 500.

The outage lasts until B's clients have their answers (so longer than B's 5 s bound and than
two leases, 2 s each): about 6 s rather than 20 — what matters is that it outlasts the leases
and B's bound while staying within A's; a longer outage only waits longer.

And a keep-alive client (one ``httpx.Client``) sending requests one after the other while the
database is down sees only 503 problems with ``Retry-After``, never a transport error — on the
API-key check (``api_key_cache_seconds=0``: every request asks the database) and on the routes.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx

from ..fakes.gated_http import PROFILE, GatedOpenAI
from ..helpers import HANG_GUARD_SECONDS, assert_problem, user_texts
from ..lifecycle.harness import (
    Server,
    Servers,
    all_transcript,
    background_run,
    client,
    create_conversation,
    eventually,
    run_record,
    sse_events,
    stored_context,
)
from ..pgcluster import PgCluster

A_RUNS, B_RUNS = 3, 2


async def _stream(server: Server, conv: str, prompt: str) -> list[tuple[str, Any]]:
    """A streamed run's events, read to the end of the body (a cut body raises)."""
    async with client(server) as http:
        async with http.stream(
            "POST",
            f"/conversations/{conv}/runs",
            json={"prompts": [prompt], "agent": PROFILE, "stream": True},
        ) as response:
            assert response.status_code == 201
            return [event async for event in sse_events(response)]


async def test_runs_in_flight_survive_an_outage_or_are_answered_not_stored(
    servers: Servers, pg_cluster: PgCluster, pg_url: str, gate: GatedOpenAI
) -> None:
    a = (await servers.start(pg_url, outcome_retry_seconds=60, **gate.settings()))[0]
    b = (await servers.start(pg_url, outcome_retry_seconds=5, **gate.settings()))[0]
    async with client(a) as http:
        a_convs = [(await create_conversation(http))[0] for _ in range(A_RUNS + 1)]
        b_convs = [(await create_conversation(http))[0] for _ in range(B_RUNS + 1)]
    a_json = [background_run(a, c, f"a{i}", agent=PROFILE) for i, c in enumerate(a_convs[1:])]
    b_json = [background_run(b, c, f"b{i}", agent=PROFILE) for i, c in enumerate(b_convs[1:])]
    a_stream = asyncio.create_task(_stream(a, a_convs[0], "a-stream"))
    b_stream = asyncio.create_task(_stream(b, b_convs[0], "b-stream"))
    prompts = [f"a{i}" for i in range(A_RUNS)] + [f"b{i}" for i in range(B_RUNS)]
    held = [await gate.arrival(p) for p in [*prompts, "a-stream", "b-stream"]]
    # one more request waits (polling) for a conversation A holds
    waiter = background_run(b, a_convs[1], "waiter", agent=PROFILE, if_busy="wait")

    began = time.monotonic()
    await asyncio.to_thread(pg_cluster.stop, "fast")
    for h in held:
        h.release()
    b_answers = await asyncio.wait_for(asyncio.gather(*b_json), HANG_GUARD_SECONDS)
    b_events = await asyncio.wait_for(b_stream, HANG_GUARD_SECONDS)
    waited = await asyncio.wait_for(waiter, HANG_GUARD_SECONDS)
    answered_b = time.monotonic() - began
    assert not any(t.done() for t in a_json), "A answered while the database was down"
    await asyncio.to_thread(pg_cluster.start)
    back = time.monotonic()
    a_answers = await asyncio.wait_for(asyncio.gather(*a_json), HANG_GUARD_SECONDS)
    a_events = await asyncio.wait_for(a_stream, HANG_GUARD_SECONDS)
    a_finished = time.monotonic() - back

    # A: finished, stored exactly once
    for answer in a_answers:
        assert answer.status_code == 201, answer.text
        assert answer.json()["status"] == "completed", answer.text
    a_names = [e for e, _ in a_events]
    assert a_names[0] == "run.started" and a_names[-1] == "run.finished", a_names
    assert a_events[-1][1]["status"] == "completed"
    async with client(a) as http:
        for conv, prompt in [(a_convs[0], "a-stream"), *zip(a_convs[1:], prompts, strict=False)]:
            context, _ = await stored_context(http, conv)
            assert user_texts(context["messages"]) == [prompt]
            entries = await all_transcript(http, conv)
            assert [e["body"]["content"][0]["text"] for e in entries if e["kind"] == "prompt"] == [
                prompt
            ]

    # B: 503 not stored, then recorded interrupted naming the outage
    b_problems = []
    for answer in b_answers:
        body = assert_problem(answer, 503, "database-unavailable")
        assert answer.headers["retry-after"]
        assert body["stored"] is False and body["run_id"], body
        b_problems.append(body)
    names = [e for e, _ in b_events]
    assert names[0] == "run.started" and names[-1] == "error", names
    assert "run.finished" not in names
    error = b_events[-1][1]
    assert error["type"].endswith("/database-unavailable") and error["stored"] is False, error
    b_problems.append(error)
    assert_problem(waited, 503, "database-unavailable")
    assert waited.headers["retry-after"]

    async with client(b) as http:
        for conv, body in zip([*b_convs[1:], b_convs[0]], b_problems, strict=True):

            async def ended(conv: str = conv, run_id: str = body["run_id"]) -> Any:
                record = await run_record(http, conv, run_id)
                return None if record["status"] == "running" else record

            record = await eventually(ended, within=HANG_GUARD_SECONDS, what="B's record")
            assert record["status"] == "interrupted", record
            assert "could not be stored" in record["error"]["detail"], record
            assert "database" in record["error"]["detail"], record
            assert record["error"]["code"] == "database_unavailable", record
            context, _ = await stored_context(http, conv)
            assert context["messages"] == []
            # the conversation is free: the next run works
            again = await http.post(f"/conversations/{conv}/runs", json={"prompts": ["again"]})
            assert again.status_code == 201 and again.json()["status"] == "completed"
    marked_after = time.monotonic() - back

    print(
        "\nPostgreSQL stopped with runs in flight:",
        {
            "database down (s)": round(back - began, 2),
            "B's 503 'not stored' answers after the stop (s)": round(answered_b, 2),
            "A's runs (3 JSON + 1 stream) answered 201 completed after the return (s)": round(
                a_finished, 2
            ),
            "B's records interrupted and conversations free after the return (s), at most": round(
                marked_after, 2
            ),
            "A": [a.status_code for a in a_answers],
            "B": [a.status_code for a in b_answers],
        },
    )
    for server in (a, b):
        assert "Traceback" not in server.log(), server.log()


def _keep_alive_requests(base_url: str, conv: str, headers: dict[str, str]) -> list[Any]:
    """Sequential requests on ONE keep-alive client; what each got (or the transport error)."""
    seen: list[Any] = []
    requests: list[tuple[str, str, dict[str, Any]]] = [
        ("GET", f"/conversations/{conv}/context", {}),
        ("GET", f"/conversations/{conv}/transcript", {}),
        ("GET", f"/conversations/{conv}/runs", {}),
        ("GET", "/conversations", {}),
        (
            "PUT",
            f"/conversations/{conv}/context",
            {"json": {"messages": []}, "headers": {"If-Match": '"x"'}},
        ),
        ("POST", f"/conversations/{conv}/runs", {"json": {"prompts": ["hi"]}}),
        ("POST", "/conversations", {"json": {}}),
        ("GET", f"/conversations/{conv}", {}),
    ]
    with httpx.Client(base_url=base_url, timeout=30.0, headers=headers) as http:
        for method, path, kwargs in requests * 2:
            try:
                answer = http.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                seen.append(f"{method} {path}: {type(exc).__name__}")
                continue
            seen.append(
                (
                    method,
                    path,
                    answer.status_code,
                    answer.headers.get("content-type"),
                    json.loads(answer.text).get("type", "") if answer.text else "",
                    answer.headers.get("retry-after"),
                    answer.headers.get("connection"),
                )
            )
    return seen


async def test_a_keep_alive_client_sees_only_503_problems_while_the_database_is_down(
    servers: Servers, pg_cluster: PgCluster, pg_url: str
) -> None:
    # routes: keys from the environment (no database needed to check them)
    routes = (await servers.start(pg_url, api_keys="acme:secret-key-0123456789"))[0]
    # the API-key check: no keys configured, so each request asks the database whether any
    auth = (await servers.start(pg_url, api_key_cache_seconds=0))[0]
    bearer = {"Authorization": "Bearer secret-key-0123456789"}
    async with client(routes, headers=bearer) as http:
        conv, _ = await create_conversation(http)
    await asyncio.to_thread(pg_cluster.stop, "fast")
    try:
        seen = await asyncio.to_thread(_keep_alive_requests, routes.url, conv, bearer)
        seen += await asyncio.to_thread(_keep_alive_requests, auth.url, conv, {})
    finally:
        await asyncio.to_thread(pg_cluster.start)
    transport_errors = [s for s in seen if isinstance(s, str)]
    answers = [s for s in seen if not isinstance(s, str)]
    print(
        "\nkeep-alive client while PostgreSQL is down:",
        {
            "requests": len(seen),
            "503": sum(1 for s in answers if s[2] == 503),
            "other statuses": [s for s in answers if s[2] != 503],
            "transport errors": transport_errors,
        },
    )
    assert not transport_errors, transport_errors
    for method, path, status, media, problem, retry_after, _connection in answers:
        assert status == 503, (method, path, status)
        assert media == "application/problem+json", (method, path)
        assert problem.endswith("/database-unavailable"), (method, path, problem)
        assert retry_after and int(retry_after) >= 1, (method, path)

    # and everything works again once it is back (the same servers, new connections)
    async def ready(server: Server) -> bool | None:
        async with client(server, headers=bearer) as http:
            found = await http.get(f"/conversations/{conv}/context")
            return True if found.status_code == 200 else None

    await eventually(lambda: ready(routes), within=HANG_GUARD_SECONDS, what="recovery")
    for server in (routes, auth):
        assert "Traceback" not in server.log(), server.log()
