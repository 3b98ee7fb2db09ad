"""Revision 0019 (both engines): token counts and conversation versions are 64-bit integers.
On PostgreSQL the columns become BIGINT; on SQLite nothing changes (its INTEGER is 64-bit). A
tenant's daily totals and its token quota keep their values through the upgrade and then hold
counts past 2**31 - 1 (PostgreSQL's INTEGER, where settling a busy day's usage failed); the
downgrade goes back."""

from __future__ import annotations

from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection

from app.store.db import make_engine
from app.store.migrate import current_revision, downgrade, head_revision, upgrade

BIG = 2**40
COLUMNS = {
    "tenant_usage": ("input_tokens", "output_tokens", "cached_tokens"),
    "tenant_quotas": ("tokens_per_day",),
    "run_compactions": ("tokens_before", "tokens_after"),
    "conversations": ("version",),
}


def _types(conn: Connection) -> dict[str, str]:
    found = inspect(conn)
    return {
        f"{table}.{c['name']}": str(c["type"]).upper()
        for table, names in COLUMNS.items()
        for c in found.get_columns(table)
        if c["name"] in names
    }


async def test_upgrade_keeps_the_counts_and_takes_ones_past_two_to_the_31(
    empty_database_url: str,
) -> None:
    url = empty_database_url
    await upgrade(url, "0018")
    engine = make_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO tenant_usage (tenant, day, runs, input_tokens, output_tokens, "
                    "cached_tokens) VALUES ('t', '2026-12-06', 3, 2000000000, 5, 7)"
                )
            )
            await conn.execute(
                text(
                    "INSERT INTO tenant_quotas (tenant, tokens_per_day, updated_at) "
                    "VALUES ('t', 2000000000, CURRENT_TIMESTAMP)"
                )
            )
        async with engine.connect() as conn:
            before = await conn.run_sync(_types)
        await upgrade(url)
        assert await current_revision(url) == head_revision()
        async with engine.begin() as conn:
            after = await conn.run_sync(_types)
            # 64-bit on both: BIGINT on PostgreSQL, SQLite's INTEGER as it was (no rebuild)
            wide = "BIGINT" if url.startswith("postgresql") else "INTEGER"
            assert set(after.values()) == {wide}, after
            row = (await conn.execute(text("SELECT * FROM tenant_usage"))).mappings().one()
            assert (row["runs"], row["input_tokens"], row["output_tokens"]) == (3, 2000000000, 5)
            await conn.execute(
                text("UPDATE tenant_usage SET input_tokens = input_tokens + :big"), {"big": BIG}
            )
            await conn.execute(text("UPDATE tenant_quotas SET tokens_per_day = :big"), {"big": BIG})
        async with engine.connect() as conn:
            usage = (await conn.execute(text("SELECT input_tokens FROM tenant_usage"))).scalar()
            quota = (await conn.execute(text("SELECT tokens_per_day FROM tenant_quotas"))).scalar()
        assert (usage, quota) == (2000000000 + BIG, BIG)
        async with engine.begin() as conn:  # values a downgrade can hold again
            await conn.execute(text("UPDATE tenant_usage SET input_tokens = 1"))
            await conn.execute(text("UPDATE tenant_quotas SET tokens_per_day = 2"))
        await downgrade(url, "0018")
        async with engine.connect() as conn:
            assert await conn.run_sync(_types) == before
    finally:
        await engine.dispose()
