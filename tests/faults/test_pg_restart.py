"""PostgreSQL restarted twice (``pg_ctl restart -m fast``) during a 20-client burst on two
server processes (docs/faults.md, issue 11):

- every acknowledged prompt (its 201 said ``stored: true``) is stored exactly once (contexts and
  transcripts), no refused one;
- zero 500s, zero transport errors: every failure is a 503 problem with ``Retry-After``;
- no finished run is lost: every 201 is ``completed`` and stored;
- no conversation stays held: every run ends, and the ones interrupted (a start whose commit
  was cut) are freed within about a lease of the database's return.

The restarts are triggered by progress (gates on the count of 201s), not by time; the burst is
bounded in requests and guarded against hangs.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime

from ..helpers import HANG_GUARD_SECONDS, until
from ..lifecycle.harness import LEASE_SECONDS, Servers, all_runs, client, create_conversation
from ..pgcluster import PgCluster
from .burst import BurstClient, Tally, check_stored_exactly_once

CLIENTS = 20
#: 201s between the start of the burst and the first restart, and after each restart
PROGRESS = 100
#: the most requests a client sends (a bound on the burst)
AT_MOST = 400


async def test_two_fast_restarts_during_a_burst_lose_nothing(
    servers: Servers, pg_cluster: PgCluster, pg_url: str
) -> None:
    a, b = await servers.start(pg_url, 2, outcome_retry_seconds=30)
    tally = Tally()
    convs = []
    async with client(a) as http:
        for _ in range(CLIENTS):
            conv, _etag = await create_conversation(http)
            convs.append(conv)
    clients = [BurstClient(i, conv, [a, b], tally) for i, conv in enumerate(convs)]
    stop = asyncio.Event()
    restarts: list[tuple[float, float]] = []  # (restart began, database back), monotonic
    backs_utc: list[float] = []  # the database back, as a UNIX time (to compare run records)

    async def progress(since: float, count: int) -> None:
        async def enough() -> bool | None:
            return True if tally.created_since(since) >= count else None

        await until(enough, within=HANG_GUARD_SECONDS, interval=0.02, what=f"{count} more 201s")

    async def controller() -> None:
        try:
            since = time.monotonic()
            for _ in range(2):
                await progress(since, PROGRESS)
                began = time.monotonic()
                await asyncio.to_thread(pg_cluster.restart, "fast")
                since = time.monotonic()
                restarts.append((began, since))
                backs_utc.append(time.time())
            await progress(since, PROGRESS)
        finally:
            stop.set()

    try:
        await asyncio.wait_for(
            asyncio.gather(controller(), *(c.run(stop, at_most=AT_MOST) for c in clients)),
            timeout=4 * HANG_GUARD_SECONDS,
        )
    finally:
        for c in clients:
            await c.aclose()

    recoveries = []
    for began, back in restarts:
        first = tally.first_created_after(back)
        assert first is not None
        recoveries.append((round(back - began, 2), round(first - back, 2)))

    held_after_back: list[float] = []
    interrupted = 0
    async with client(b) as http:
        for conv in convs:
            interrupted += await check_stored_exactly_once(http, tally, conv)
            for record in await all_runs(http, conv):
                if record["status"] != "interrupted":
                    continue
                ended = datetime.fromisoformat(record["finished_at"]).timestamp()
                back = max((t for t in backs_utc if t <= ended), default=None)
                if back is not None:
                    held_after_back.append(round(ended - back, 2))
            found = await http.get(f"/conversations/{conv}")
            assert found.json()["active_run_id"] is None, found.text

    figures = tally.figures()
    figures.update(
        {
            "restarts (restart took s, first 201 after it s)": recoveries,
            "runs interrupted (a start cut by the restart)": interrupted,
            "interrupted runs freed after the database returned (s)": held_after_back,
            "outcome writes retried": sum(
                s.log_path.read_text(errors="replace").count("trying again") for s in (a, b)
            ),
        }
    )
    print("\nPostgreSQL restarted twice during a 20-client burst on 2 servers:", figures)

    assert tally.statuses[500] == 0, tally.others
    assert not tally.transport_errors, tally.transport_errors
    assert not tally.others, tally.others
    assert not tally.without_retry_after, tally.without_retry_after
    assert set(tally.slugs) <= {"database-unavailable"}, tally.slugs
    # a 201 that stored nothing lost no acknowledged prompt, but it is a finished run lost
    assert not tally.unstored, tally.unstored
    assert set(tally.run_statuses) == {"completed"}, tally.run_statuses
    assert tally.statuses[201] >= 3 * PROGRESS
    # an interrupted run held its conversation at most about one lease past the return
    tick = min(1.0, LEASE_SECONDS / 3)
    assert all(held <= LEASE_SECONDS + 3 * tick for held in held_after_back), held_after_back
    for server in (a, b):
        assert "Traceback" not in server.log(), server.log()
