"""Migration 0013 writes the checksum of every existing message row (in batches), leaves a row
whose text does not decode without one (so that reads and ``carryover check`` report it), and
its downgrade drops the column. The checksum is the one the service writes and checks."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import insert, inspect, select

from app.agent.codec import dumps_message
from app.store.db import make_engine
from app.store.errors import StoredDataDamaged
from app.store.integrity import body_sha256, scan
from app.store.migrate import downgrade, upgrade
from app.store.tables import Dumped, context_messages, conversations
from tests.repository import Repository

from .builders import assistant, user

T = "acme"
#: more message rows than one batch of the migration (1,000)
CONVERSATIONS = 420
BROKEN = {"c0007": '{"type":"user","content":[', "c0300": '["not", "a message"]'}


def _texts(i: int) -> list[str]:
    return [
        dumps_message(user(f"q{i} é ✓ \U0001f600 \n \x01")),
        dumps_message(assistant(f"a{i}" * (i % 5 + 1))),
        dumps_message(user("x" * i)),
    ]


async def test_the_migration_writes_every_checksum_and_leaves_undecodable_rows_without(
    empty_database_url: str,
) -> None:
    url = empty_database_url
    await upgrade(url, "0012")
    now = datetime(2026, 1, 1, tzinfo=UTC)
    engine = make_engine(url)
    try:
        async with engine.begin() as conn:
            rows, bodies = [], []
            for i in range(CONVERSATIONS):
                conv_id = f"c{i:04d}"
                texts = _texts(i)
                if conv_id in BROKEN:
                    texts[1] = BROKEN[conv_id]
                rows.append(
                    {
                        "tenant": T,
                        "id": conv_id,
                        "incarnation": f"inc{i}",
                        "version": 1,
                        "system_prompt": "",
                        "summary": "",
                        "next_position": len(texts) + 5,
                        "message_count": len(texts),
                        "transcript_seq": 0,
                        "created_at": now,
                        "updated_at": now,
                    }
                )
                bodies += [
                    {"tenant": T, "conversation_id": conv_id, "position": 5 + p, "body": t}
                    for p, t in enumerate(texts)
                ]
            await conn.execute(insert(conversations), rows)
            # the texts as they are (Dumped: the JSONText column binds them unchanged)
            await conn.execute(
                insert(context_messages), [{**b, "body": Dumped(b["body"])} for b in bodies]
            )
    finally:
        await engine.dispose()

    await upgrade(url)
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            m = context_messages.c
            stored = {
                (r.conversation_id, r.position): r.body_sha256
                for r in await conn.execute(select(m.conversation_id, m.position, m.body_sha256))
            }
        assert len(stored) == len(bodies)
        for b in bodies:
            digest = stored[(b["conversation_id"], b["position"])]
            if b["conversation_id"] in BROKEN and b["position"] == 6:
                assert digest is None
            else:
                assert digest == body_sha256(b["body"])

        found = [(d.conversation_id, d.message_index) async for d in scan(engine, batch=250)]
        assert found == [("c0007", 1), ("c0300", 1)]
        repo = Repository(engine)
        loaded = await repo.load_context(T, "c0008")
        assert len(loaded.context.messages) == 3
        with pytest.raises(StoredDataDamaged) as caught:
            await repo.load_context(T, "c0300")
        assert caught.value.message_index == 1
    finally:
        await engine.dispose()

    await downgrade(url, "0012")
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            columns = await conn.run_sync(
                lambda c: {col["name"] for col in inspect(c).get_columns("context_messages")}
            )
        assert "body_sha256" not in columns and "body" in columns
    finally:
        await engine.dispose()
