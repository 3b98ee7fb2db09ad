"""Listing 100k conversations filtered by one metadata key, on SQLite and PostgreSQL.

Seeds N conversations (default 100,000) straight into a migrated database with SQL (each with
``user`` = one of N/100 values and ``topic`` = one of 10), then times
``GET /conversations?metadata.topic=t3&limit=50`` through the real app in process (ASGI, no
network): the first page, and a deep page (the cursor of page ``--deep``, i.e. after
``deep * 50`` matches), plus a selective filter (``metadata.user=u42``: 100 matches) and
``has_pending_action=true|false`` (one conversation in 2,000 waits on a call). Prints the p50
and p90 of each, per engine, and the query plan of the filtered listing.

    .venv/bin/python bench/listing.py                 # 100,000 conversations, both engines
    .venv/bin/python bench/listing.py --count 20000 --engines sqlite

It is a script that prints figures, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from sqlalchemy import insert, text

from app.api.app import create_app
from app.config import Settings
from app.store.db import make_engine
from app.store.migrate import upgrade
from app.store.tables import conversation_metadata, conversations

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
TENANT = "default"
BATCH = 5_000


#: one conversation in this many has a pending call (50 of 100,000)
PENDING_EVERY = 2_000


async def seed(url: str, count: int) -> None:
    engine = make_engine(url)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    try:
        for first in range(0, count, BATCH):
            rows, meta = [], []
            for i in range(first, min(count, first + BATCH)):
                conv_id = f"c{i:07d}"
                at = start + timedelta(seconds=i)
                rows.append(
                    {
                        "tenant": TENANT,
                        "id": conv_id,
                        "incarnation": uuid.uuid4().hex,
                        "version": 1,
                        "system_prompt": "",
                        "summary": "",
                        "next_position": 0,
                        "message_count": 0,
                        "transcript_seq": 0,
                        "created_at": at,
                        "updated_at": at,
                        "active_run_id": None,
                        "expires_at": None,
                        # one in PENDING_EVERY waits on a call (has_pending_action=true)
                        "pending_calls": (
                            [{"id": f"call_{i}", "name": "lookup", "arguments": "{}"}]
                            if i % PENDING_EVERY == 0
                            else None
                        ),
                    }
                )
                key = {"tenant": TENANT, "conversation_id": conv_id}
                meta.append({**key, "key": "user", "value": f"u{i % max(1, count // 100)}"})
                meta.append({**key, "key": "topic", "value": f"t{i % 10}"})
            async with engine.begin() as conn:
                await conn.execute(insert(conversations), rows)
                await conn.execute(insert(conversation_metadata), meta)
        async with engine.begin() as conn:
            await conn.execute(text("ANALYZE"))
    finally:
        await engine.dispose()


async def plan(url: str, key: str, value: str) -> str:
    engine = make_engine(url)
    sql = (
        "SELECT c.id FROM conversations c WHERE c.tenant = 'default' AND c.id IN (SELECT "
        "m.conversation_id FROM conversation_metadata m WHERE m.tenant = 'default' AND "
        "m.key = :key AND m.value = :value) ORDER BY c.updated_at DESC, c.id DESC LIMIT 51"
    )
    prefix = "EXPLAIN QUERY PLAN " if url.startswith("sqlite") else "EXPLAIN "
    try:
        async with engine.connect() as conn:
            rows = (await conn.execute(text(prefix + sql), {"key": key, "value": value})).all()
    finally:
        await engine.dispose()
    return "\n".join("    " + " ".join(str(c) for c in row) for row in rows)


def p(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def measure(url: str, repeats: int, deep: int, count: int) -> dict[str, list[float]]:
    app = create_app(Settings(database_url=url))
    timings: dict[str, list[float]] = {}
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://b") as client,
    ):

        async def get(params: dict[str, Any]) -> dict[str, Any]:
            response = await client.get("/conversations", params=params)
            response.raise_for_status()
            body: dict[str, Any] = response.json()
            return body

        filtered = {"metadata.topic": "t3", "limit": 50}
        cursor = None
        for _ in range(deep):
            cursor = (await get({**filtered, **({"cursor": cursor} if cursor else {})}))[
                "next_cursor"
            ]
        pending = -(-count // PENDING_EVERY)
        cases: dict[str, tuple[dict[str, Any], int]] = {
            "first page, metadata.topic=t3 (10% match)": (filtered, 50),
            f"page {deep + 1} of it (after {deep * 50})": ({**filtered, "cursor": cursor}, 50),
            "first page, metadata.user=u42 (100 match)": (
                {"metadata.user": "u42", "limit": 50},
                50,
            ),
            "first page, no filter": ({"limit": 50}, 50),
            f"has_pending_action=true ({pending} match)": (
                {"has_pending_action": "true", "limit": 50},
                min(50, pending),
            ),
            "has_pending_action=false": ({"has_pending_action": "false", "limit": 50}, 50),
        }
        for name, (params, expected) in cases.items():
            await get(params)  # warm
            samples = []
            for _ in range(repeats):
                began = time.perf_counter()
                body = await get(params)
                samples.append(time.perf_counter() - began)
            assert len(body["items"]) == expected, (name, len(body["items"]))
            timings[name] = samples
    return timings


async def postgres_database() -> tuple[str, str]:
    name = f"carryover_bench_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(PG_ADMIN)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return name, f"postgresql://postgres@127.0.0.1:5432/{name}"


async def drop_postgres(name: str) -> None:
    conn = await asyncpg.connect(PG_ADMIN)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


async def bench(engine: str, count: int, repeats: int, deep: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        pg_name = None
        if engine == "sqlite":
            url = f"sqlite:///{Path(tmp) / 'listing.db'}"
        else:
            pg_name, url = await postgres_database()
        try:
            await upgrade(url)
            began = time.perf_counter()
            await seed(url, count)
            print(
                f"\n{engine}: {count:,} conversations seeded in {time.perf_counter() - began:.1f} s"
            )
            timings = await measure(url, repeats, deep, count)
            for name, samples in timings.items():
                print(f"  {name:45s} p50 {p(samples, 0.5):7.2f} ms   p90 {p(samples, 0.9):7.2f} ms")
            for key, value in (("topic", "t3"), ("user", "u42")):
                print(f"  plan of the listing filtered by {key}={value}:")
                print(await plan(url, key, value))
        finally:
            if pg_name is not None:
                await drop_postgres(pg_name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--deep", type=int, default=100, help="which page is the deep one")
    parser.add_argument("--engines", nargs="+", default=["sqlite", "postgresql"])
    args = parser.parse_args()
    for engine in args.engines:
        asyncio.run(bench(engine, args.count, args.repeats, args.deep))


if __name__ == "__main__":
    main()
