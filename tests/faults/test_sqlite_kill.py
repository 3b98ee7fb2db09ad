"""SIGKILL of a SQLite server in the middle of a burst (docs/faults.md, issue 11): no
acknowledged prompt is lost, each is stored exactly once, the context is valid after the
restart, the runs the kill cut end ``interrupted`` once their lease expires, and the next run
on every conversation works. The kill is triggered by progress (a count of 201s)."""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx

from ..helpers import HANG_GUARD_SECONDS, until, user_texts
from ..lifecycle.harness import (
    Servers,
    active_run,
    all_runs,
    all_transcript,
    client,
    create_conversation,
    eventually,
    stored_context,
)
from .burst import BurstClient, Tally

CLIENTS = 10
#: 201s before the kill
PROGRESS = 80
AT_MOST = 400


async def test_sigkill_mid_burst_loses_no_acknowledged_prompt(
    servers: Servers, sqlite_url: str
) -> None:
    [server] = await servers.start(sqlite_url)
    tally = Tally()
    async with client(server) as http:
        convs = [(await create_conversation(http))[0] for _ in range(CLIENTS)]
    clients = [BurstClient(i, conv, [server], tally) for i, conv in enumerate(convs)]
    stop = asyncio.Event()

    async def killer() -> None:
        async def enough() -> bool | None:
            return True if tally.statuses[201] >= PROGRESS else None

        try:
            await until(enough, within=HANG_GUARD_SECONDS, interval=0.01, what="the burst")
            server.kill()  # SIGKILL, runs in flight
        finally:
            stop.set()

    try:
        await asyncio.wait_for(
            asyncio.gather(killer(), *(c.run(stop, at_most=AT_MOST) for c in clients)),
            timeout=2 * HANG_GUARD_SECONDS,
        )
    finally:
        for c in clients:
            await c.aclose()
    acknowledged_before_kill = tally.statuses[201]
    cut = {e.split(":", 1)[0] for e in tally.transport_errors}  # in flight at the kill

    await servers.restart(server)
    async with client(server) as http:
        for conv in convs:
            await eventually(
                lambda conv=conv: _free(http, conv), within=HANG_GUARD_SECONDS, what="free"
            )
        stored_unacknowledged = []
        interrupted = 0
        for conv in convs:
            acknowledged = tally.acknowledged.get(conv, [])
            context, _ = await stored_context(http, conv)  # valid, replayable
            stored = user_texts(context["messages"])
            counts = Counter(stored)
            assert all(counts[p] == 1 for p in acknowledged), (conv, stored, acknowledged)
            assert all(n == 1 for n in counts.values()), counts
            # nothing stored but what was acknowledged, or cut by the kill (a run that
            # committed before its answer could be sent)
            extra = [p for p in stored if p not in acknowledged]
            assert set(extra) <= cut, (extra, cut)
            stored_unacknowledged += extra
            entries = await all_transcript(http, conv)
            prompts = [e["body"]["content"][0]["text"] for e in entries if e["kind"] == "prompt"]
            assert prompts == stored, conv
            runs = await all_runs(http, conv)
            interrupted += sum(1 for r in runs if r["status"] == "interrupted")
            again = await http.post(f"/conversations/{conv}/runs", json={"prompts": ["after"]})
            assert again.status_code == 201 and again.json()["status"] == "completed"

    print(
        "\nSIGKILL of a SQLite server mid-burst:",
        {
            **tally.figures(),
            "201 before the kill": acknowledged_before_kill,
            "cut by the kill (transport errors)": len(cut),
            "stored though cut (committed before the answer)": len(stored_unacknowledged),
            "runs interrupted after the restart": interrupted,
        },
    )
    assert tally.statuses[500] == 0 and not tally.others, tally.others
    assert set(tally.run_statuses) == {"completed"}, tally.run_statuses


async def _free(http: httpx.AsyncClient, conv: str) -> bool | None:
    return True if await active_run(http, conv) is None else None
