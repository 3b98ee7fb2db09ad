"""Processes that die, stop or are paused in the middle of runs (contract §4: a run whose process
died is found by its expired lease and marked ``interrupted``; the conversation is usable again
as soon as that lease has expired; its stored context is never partial)."""

from __future__ import annotations

import signal
from datetime import datetime
from typing import Any

import httpx

from ..fakes.gated_http import PROFILE, GatedOpenAI
from ..helpers import HANG_GUARD_SECONDS, user_texts
from .harness import (
    LEASE_SECONDS,
    Servers,
    active_run,
    all_runs,
    all_transcript,
    background_run,
    client,
    create_conversation,
    eventually,
    run_ends,
    started_run,
    stored_context,
)


async def test_sigkill_mid_run_interrupts_frees_and_keeps_what_completed(
    postgres_url: str, servers: Servers, gate: GatedOpenAI
) -> None:
    a, b = await servers.start(postgres_url, 2, **gate.settings())
    async with client(b) as http:
        convs = [(await create_conversation(http))[0] for _ in range(3)]
        other, _ = await create_conversation(http)
    completed: dict[str, list[str]] = {conv: [] for conv in convs}

    # each conversation has a run that completed on the server that is about to die
    async with client(a) as http_a:
        for conv in convs:
            done = await http_a.post(f"/conversations/{conv}/runs", json={"prompts": ["before"]})
            assert done.status_code == 201 and done.json()["status"] == "completed"
            completed[conv].append(done.json()["run_id"])

    # then runs in flight on it (one with an Idempotency-Key), and one on the server that lives;
    # the model holds every one of them until the test lets it answer
    key = {"Idempotency-Key": "killed-run-key"}
    doomed = [background_run(a, convs[0], "killed", headers=key, agent=PROFILE)]
    doomed += [background_run(a, conv, "killed", agent=PROFILE) for conv in convs[1:]]
    survivor = background_run(b, other, "survives", agent=PROFILE)
    async with client(b) as http:
        killed = {conv: await started_run(http, conv) for conv in convs}
        await gate.arrival("killed", count=len(convs))
        await gate.arrival("survives")

        a.kill()
        (await gate.arrival("survives")).release()  # the live server's run goes on
        for task in doomed:  # their clients lose the connection, no answer
            try:
                answer = await task
            except httpx.TransportError:
                continue
            raise AssertionError(f"a run of the killed server answered: {answer.text}")
        answer = await survivor
        assert answer.status_code == 201 and answer.json()["status"] == "completed"

        # the conversation is usable again as soon as the lease expired: take it over at once
        async def takeover() -> dict[str, Any] | None:
            tried = await http.post(
                f"/conversations/{convs[1]}/runs", json={"prompts": ["after the crash"]}
            )
            if tried.status_code == 409:
                assert tried.json()["active_run_id"] == killed[convs[1]]
                return None
            assert tried.status_code == 201, tried.text
            body: dict[str, Any] = tried.json()
            return body

        after = await eventually(
            takeover, within=HANG_GUARD_SECONDS, interval=0.1, what="the conversation to be free"
        )
        assert after["status"] == "completed" and after["stored"]
        completed[convs[1]].append(after["run_id"])

        # the others are found by the keeper of the live server and marked interrupted
        for conv, run_id in killed.items():
            record = await run_ends(http, conv, run_id, within=HANG_GUARD_SECONDS)
            assert record["status"] == "interrupted"
            assert record["stored"] is False and record["etag"] is None
            assert record["error"]["type"].endswith("/run-interrupted")
            assert record["finished_at"] is not None
            # marked only once its lease, renewed until the kill, had expired
            lived = datetime.fromisoformat(record["finished_at"]) - datetime.fromisoformat(
                record["created_at"]
            )
            assert lived.total_seconds() >= LEASE_SECONDS, record
            assert record["new_messages"] == [] and record["final"] is None
            assert user_texts(record["prompts"]) == ["killed"]

        # the key of the idempotent request that died is released: sending it again runs it
        resent = background_run(b, convs[0], "killed", headers=key, agent=PROFILE)
        (await gate.arrival("killed", count=len(convs) + 1)).release()
        again = await resent
        assert again.status_code == 201, again.text
        assert "idempotent-replayed" not in again.headers
        assert again.json()["status"] == "completed"
        completed[convs[0]].append(again.json()["run_id"])

    # the killed server starts again on the same database and serves
    await servers.restart(a)
    async with client(a) as http_a:
        for conv in convs:
            done = await http_a.post(f"/conversations/{conv}/runs", json={"prompts": ["restart"]})
            assert done.status_code == 201 and done.json()["status"] == "completed", done.text
            completed[conv].append(done.json()["run_id"])

        for conv in convs:
            runs = {r["run_id"]: r for r in await all_runs(http_a, conv)}
            assert runs[killed[conv]]["status"] == "interrupted"
            ok = [r for r in runs.values() if r["status"] == "completed"]
            assert sorted(r["run_id"] for r in ok) == sorted(completed[conv])
            # every completed run's prompts are stored exactly once, nothing of the killed run
            context, etag = await stored_context(http_a, conv)
            expected = [
                text
                for r in sorted(ok, key=lambda r: r["created_at"])
                for text in user_texts(r["prompts"])
            ]
            assert user_texts(context["messages"]) == expected
            assert etag == max(ok, key=lambda r: r["created_at"])["etag"]
            entries = await all_transcript(http_a, conv)
            assert killed[conv] not in {e["run_id"] for e in entries}
            assert [
                e["body"]["content"][0]["text"] for e in entries if e["kind"] == "prompt"
            ] == expected


async def test_a_paused_process_that_lost_its_lease_stores_nothing(
    postgres_url: str, servers: Servers, gate: GatedOpenAI
) -> None:
    """SIGSTOP a server mid-run until its lease expires and another server takes the
    conversation over; after SIGCONT the old run must not store (the lease fences it), and the
    run that holds the lease now completes."""
    a, b = await servers.start(postgres_url, 2, **gate.settings())
    async with client(b) as http:
        conv, _ = await create_conversation(http)
        zombie = background_run(a, conv, "zombie", agent=PROFILE)
        zombie_id = await started_run(http, conv)
        zombie_call = await gate.arrival("zombie")  # its model request is in flight
        a.signal(signal.SIGSTOP)
        try:
            record = await run_ends(http, conv, zombie_id, within=HANG_GUARD_SECONDS)
            assert record["status"] == "interrupted"
            # the run that holds the conversation now, while the paused process wakes up
            holder = background_run(b, conv, "holder", agent=PROFILE)
            holder_id = await eventually(
                lambda: _other_active(http, conv, zombie_id), what="the new run to start"
            )
            holder_call = await gate.arrival("holder")
            zombie_call.release()  # the paused run's answer waits for it to wake
        finally:
            a.signal(signal.SIGCONT)

        late = await zombie  # it tried to store while the holder still runs
        assert not holder.done()
        assert late.status_code == 201, late.text
        assert late.json()["stored"] is False
        assert late.json()["status"] == "interrupted"
        holder_call.release()
        answer = await holder
        assert answer.status_code == 201
        assert answer.json()["run_id"] == holder_id
        assert answer.json()["status"] == "completed" and answer.json()["stored"] is True

        record = await run_ends(http, conv, zombie_id)
        assert record["status"] == "interrupted"  # the record does not change afterwards
        context, etag = await stored_context(http, conv)
        assert user_texts(context["messages"]) == ["holder"]
        assert etag == answer.json()["etag"]


async def _other_active(http: httpx.AsyncClient, conv: str, not_this: str) -> str | None:
    active = await active_run(http, conv)
    return active if active not in (None, not_this) else None


async def test_sigterm_cancels_runs_in_flight_and_records_them(
    postgres_url: str, servers: Servers, gate: GatedOpenAI
) -> None:
    """A graceful stop with runs in flight: the runs are cancelled, recorded ``cancelled``,
    their clients get that answer, the conversations are free at once, and the server exits
    without waiting for the runs."""
    a, b = await servers.start(postgres_url, 2, **gate.settings())
    async with client(b) as http:
        convs = [(await create_conversation(http))[0] for _ in range(2)]
        json_run = background_run(a, convs[0], "slow", agent=PROFILE)
        tool_run = background_run(a, convs[1], '/tool wait {"seconds": 60}', on_failure="discard")
        ids = [await started_run(http, conv) for conv in convs]
        slow_call = await gate.arrival("slow")

        # uvicorn stops gracefully, then re-raises the signal it caught: -SIGTERM
        status = await a.terminate(within=20)
        assert status in (0, -signal.SIGTERM), a.log()
        assert "Traceback" not in a.log(), a.log()

        answers = [await json_run, await tool_run]
        assert not slow_call.released.is_set()  # the stop, not an answer, ended it
        for answer, run_id in zip(answers, ids, strict=True):
            assert answer.status_code == 201, answer.text
            assert answer.json()["run_id"] == run_id
            assert answer.json()["status"] == "cancelled"
        for conv, run_id in zip(convs, ids, strict=True):
            record = await run_ends(http, conv, run_id, within=5)
            assert record["status"] == "cancelled"
            assert await active_run(http, conv) is None  # free now, not after the lease
        # on_failure keep: the prompt is stored; discard: nothing is
        first, _ = await stored_context(http, convs[0])
        assert user_texts(first["messages"]) == ["slow"]
        second, _ = await stored_context(http, convs[1])
        assert second["messages"] == []
