"""Stored bytes per table after N runs with large prompts, against the content the runs added
(docs/performance.md, "Storage"). In process (the app on an ASGI transport, the ``echo``
agent, which answers each prompt with its text), on SQLite in a temporary folder and on
PostgreSQL in a database of its own on 127.0.0.1:5432 (dropped at the end).

"Content" is the bytes of the messages the runs added: each run's new messages, as the codec
dumps them (the prompt and the answer). "Stored" is the file's size (SQLite, after a
checkpoint; ``dbstat`` per table when the build has it) and ``pg_total_relation_size`` per
table (PostgreSQL, after ``VACUUM ANALYZE``), minus what the empty schema takes.

    .venv/bin/python bench/storage.py [--runs 300] [--conversations 30] [--chars 20000]
        [--engines sqlite,postgresql] [--pg-admin postgresql://postgres@127.0.0.1:5432/test]
        [--reads N] [--json PATH]

``--reads N`` also times N rounds of the reads that serve what moved (GET runs, a run, the
transcript, a run's stored events, and the stored context read by a process that caches no
context; medians, in process).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import string
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from sqlalchemy import text

from app.api.app import create_app
from app.config import Settings
from app.store.db import make_engine
from app.store.migrate import upgrade

TABLES = (
    "conversations",
    "context_messages",
    "context_versions",
    "message_texts",
    "runs",
    "run_new_messages",
    "run_finals",
    "run_compactions",
    "transcript",
    "run_events",
    "idempotency_keys",
)


async def table_bytes(url: str) -> dict[str, int]:
    engine = make_engine(url)
    sizes: dict[str, int] = {}
    try:
        async with engine.connect() as conn:
            if url.startswith("sqlite"):
                await conn.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))
                try:
                    rows = (
                        await conn.execute(
                            text("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name")
                        )
                    ).all()
                except Exception:  # a build without dbstat: the file only
                    rows = []
                names = {str(n): int(s) for n, s in rows}
                for table in TABLES:  # a table with its indexes
                    sizes[table] = sum(
                        s
                        for n, s in names.items()
                        if n == table or n.startswith(f"sqlite_autoindex_{table}_")
                    )
                path = url.split("///", 1)[1]
                sizes["(file)"] = await asyncio.to_thread(os.path.getsize, path)
            else:
                await conn.commit()
                raw = await conn.get_raw_connection()
                await raw.driver_connection.execute("VACUUM ANALYZE")  # type: ignore[union-attr]
                for table in TABLES:
                    exists = (
                        await conn.execute(text("SELECT to_regclass(:t)"), {"t": table})
                    ).scalar()
                    sizes[table] = (
                        int(
                            (
                                await conn.execute(
                                    text("SELECT pg_total_relation_size(:t)"), {"t": table}
                                )
                            ).scalar_one()
                        )
                        if exists
                        else 0
                    )
                sizes["(file)"] = int(
                    (
                        await conn.execute(text("SELECT pg_database_size(current_database())"))
                    ).scalar_one()
                )
    finally:
        await engine.dispose()
    return sizes


async def read_times(
    client: httpx.AsyncClient, uncached: httpx.AsyncClient, conversations: int, reads: int
) -> dict[str, float]:
    """Median ms of the reads that serve run records, the transcript and stored events: a
    page of runs and of the transcript of each conversation in turn, and one run record and
    its events; and the stored context as a process without context caches reads it (what a
    run's first read of a conversation, an export or a fork costs)."""
    run_id = (await client.get("/conversations/c0/runs")).json()["items"][-1]["run_id"]
    names = ("runs", "run", "transcript", "events", "context")
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(reads):
        conv = f"c{i % conversations}"
        paths = {
            "runs": (client, f"/conversations/{conv}/runs"),
            "run": (client, f"/conversations/c0/runs/{run_id}"),
            "transcript": (client, f"/conversations/{conv}/transcript"),
            "events": (client, f"/conversations/c0/runs/{run_id}/events"),
            "context": (uncached, f"/conversations/{conv}/context"),
        }
        for name, (reader, path) in paths.items():
            start = time.perf_counter()
            got = await reader.get(path)
            times[name].append(time.perf_counter() - start)
            assert got.status_code == 200, got.text
    return {k: round(statistics.median(v) * 1000, 2) for k, v in times.items()}


async def drive(
    url: str, runs: int, conversations: int, chars: int, reads: int = 0
) -> tuple[int, dict[str, float]]:
    """The runs; the bytes of the messages they added, and the read times."""
    settings = Settings(database_url=url)
    app = create_app(settings)
    content = 0
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://bench") as client,
    ):
        for c in range(conversations):
            got = await client.post("/conversations", json={"id": f"c{c}", "system_prompt": "S"})
            assert got.status_code == 201, got.text
        for i in range(runs):
            # letters at random: text PostgreSQL's TOAST cannot shrink (copies stay copies)
            prompt = f"{i} " + "".join(random.Random(i).choices(string.ascii_letters, k=chars))
            got = await client.post(
                f"/conversations/c{i % conversations}/runs",
                json={"prompts": [{"type": "user", "content": [{"type": "text", "text": prompt}]}]},
            )
            assert got.status_code in (200, 201), got.text
            for message in got.json()["new_messages"]:
                content += len(json.dumps(message, ensure_ascii=False, separators=(",", ":")))
        reads_ms = await timed_reads(url, client, conversations, reads) if reads else {}
    return content, reads_ms


async def timed_reads(
    url: str, client: httpx.AsyncClient, conversations: int, reads: int
) -> dict[str, float]:
    """The reads, beside a second app on the same database that keeps no context in memory."""
    bare = Settings(
        database_url=url,
        context_cache_messages=0,
        context_cache_bytes=0,
        context_body_cache_bytes=0,
    )
    app = create_app(bare)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://bench") as uncached,
    ):
        return await read_times(client, uncached, conversations, reads)


async def measure(
    url: str, runs: int, conversations: int, chars: int, reads: int
) -> dict[str, Any]:
    await upgrade(url)
    empty = await table_bytes(url)
    content, reads_ms = await drive(url, runs, conversations, chars, reads)
    full = await table_bytes(url)
    grown = {k: full[k] - empty.get(k, 0) for k in full}
    stored = grown["(file)"]
    return {
        "engine": url.split(":", 1)[0].split("+")[0],
        "runs": runs,
        "content_bytes": content,
        "stored_bytes": stored,
        "ratio": round(stored / content, 2),
        "tables": grown,
        "read_ms": reads_ms,
    }


async def pg_database(admin: str, name: str, create: bool) -> None:
    conn = await asyncpg.connect(admin)
    try:
        if create:
            await conn.execute(f'CREATE DATABASE "{name}"')
        else:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--conversations", type=int, default=30)
    parser.add_argument("--chars", type=int, default=20_000)
    parser.add_argument("--engines", default="sqlite,postgresql")
    parser.add_argument("--pg-admin", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--reads", type=int, default=0, help="time this many rounds of reads")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for engine in args.engines.split(","):
            if engine == "sqlite":
                url = f"sqlite:///{folder}/storage.db"
                rows.append(
                    await measure(url, args.runs, args.conversations, args.chars, args.reads)
                )
            else:
                name = f"carryover_bench_storage_{os.getpid()}"
                await pg_database(args.pg_admin, name, True)
                try:
                    url = args.pg_admin.rsplit("/", 1)[0] + f"/{name}"
                    rows.append(
                        await measure(url, args.runs, args.conversations, args.chars, args.reads)
                    )
                finally:
                    await pg_database(args.pg_admin, name, False)
    print("| engine | runs | content MB | stored MB | stored ÷ content |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['engine']} | {r['runs']} | {r['content_bytes'] / 1e6:.2f} | "
            f"{r['stored_bytes'] / 1e6:.2f} | {r['ratio']} |"
        )
    print()
    print("| engine | " + " | ".join(t for t in rows[0]["tables"]) + " |")
    print("|---|" + "---|" * len(rows[0]["tables"]))
    for r in rows:
        print(
            f"| {r['engine']} | "
            + " | ".join(f"{v / 1e6:.2f}" for v in r["tables"].values())
            + " |"
        )
    if args.reads:
        print()
        print("| engine | " + " | ".join(f"GET {k}, ms" for k in rows[0]["read_ms"]) + " |")
        print("|---|" + "---|" * len(rows[0]["read_ms"]))
        for r in rows:
            print(f"| {r['engine']} | " + " | ".join(str(v) for v in r["read_ms"].values()) + " |")
    if args.json:
        document = {"rows": rows, "loadavg": os.getloadavg(), "argv": sys.argv}
        args.json.write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
