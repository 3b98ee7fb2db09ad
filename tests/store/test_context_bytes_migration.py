"""Migration 0010 counts the stored size of existing contexts (``conversations.context_bytes``),
in batches, equal to the body GET context answers; its downgrade drops the column."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import insert, inspect

from app.agent.codec import dump_message
from app.store.db import make_engine
from app.store.migrate import downgrade, upgrade
from app.store.tables import context_messages, conversations
from tests.repository import Repository

from .builders import assistant, user

T = "acme"
#: more than one batch of the migration (200 conversations)
CONVERSATIONS = 450


def _messages(i: int) -> list[dict[str, object]]:
    if i % 7 == 0:
        return []  # an empty context: only its frame
    return [
        dump_message(user(f"q{i} é ✓ \U0001f600 \n \x01")),
        dump_message(assistant(f"a{i}" * (i % 5 + 1))),
        dump_message(user("x" * i)),
    ][: 1 + i % 3]


async def test_the_migration_counts_every_stored_context_as_get_answers_it(
    empty_database_url: str,
) -> None:
    url = empty_database_url
    await upgrade(url, "0008")
    now = datetime(2026, 1, 1, tzinfo=UTC)
    engine = make_engine(url)
    try:
        async with engine.begin() as conn:
            rows, bodies = [], []
            for i in range(CONVERSATIONS):
                messages = _messages(i)
                rows.append(
                    {
                        "tenant": T if i % 2 else "other",
                        "id": f"c{i:04d}",
                        "incarnation": f"inc{i}",
                        "version": 1,
                        "system_prompt": "Brief. ü" if i % 3 else "",
                        "summary": f"summary {i} «»" if i % 4 else "",
                        "next_position": len(messages) + 5,
                        "message_count": len(messages),
                        "transcript_seq": 0,
                        "created_at": now,
                        "updated_at": now,
                    }
                )
                bodies += [
                    {
                        "tenant": rows[-1]["tenant"],
                        "conversation_id": rows[-1]["id"],
                        "position": 5 + p,  # positions need not start at 0
                        "body": m,
                    }
                    for p, m in enumerate(messages)
                ]
            await conn.execute(insert(conversations), rows)
            await conn.execute(insert(context_messages), bodies)
    finally:
        await engine.dispose()

    await upgrade(url)
    engine = make_engine(url)
    try:
        repo = Repository(engine)
        for row in rows:
            tenant, conv_id = str(row["tenant"]), str(row["id"])
            stored = await repo.load_context_rows(tenant, conv_id)
            assert stored.conversation.context_bytes == len(stored.context_json()), conv_id
            loaded = stored.decode()
            assert loaded.size is not None and loaded.size.bytes == len(stored.context_json())
    finally:
        await engine.dispose()

    await downgrade(url, "0008")
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            columns = await conn.run_sync(
                lambda c: {col["name"] for col in inspect(c).get_columns("conversations")}
            )
        assert "context_bytes" not in columns and "token_tally" in columns
    finally:
        await engine.dispose()
