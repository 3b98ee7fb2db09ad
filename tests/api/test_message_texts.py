"""Each message text of the stored context, run records, the transcript and message events is
stored once (docs/operations.md, "Storage"): counted in the database after runs, not timed. A second
conversation sending the same history stores no new text; deleting a conversation deletes the
texts only it referenced; export, import and fork stay byte-identical."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import text

from app.store.db import make_engine

from .conftest import AppClient

PROMPT_CHARS = 20_000

#: the texts of a conversation's system prompt "S" and empty summary, which its versions
#: reference: '"S"' and '""'
FRAME = 5


def prompt(i: int) -> str:
    return f"{i} " + "".join(chr(0x41 + (i * 7 + k) % 26) for k in range(PROMPT_CHARS))


async def scalar(url: str, sql: str) -> int:
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            return int((await conn.execute(text(sql))).scalar() or 0)
    finally:
        await engine.dispose()


def octets(column: str) -> str:
    return f"COALESCE(SUM(LENGTH(CAST({column} AS BLOB))), 0)"


def pg_octets(column: str) -> str:
    return f"COALESCE(SUM(OCTET_LENGTH({column})), 0)"


async def record_text_bytes(url: str) -> dict[str, int]:
    """The bytes of message text each table holds (the run records and the transcript)."""
    size = pg_octets if url.startswith("postgresql") else octets
    return {
        table: await scalar(url, f"SELECT {size('body')} FROM {table}")
        for table in ("message_texts", "run_new_messages", "run_finals")
    } | {
        "transcript": await scalar(
            url,
            f"SELECT {size('body')} FROM transcript WHERE kind IN "
            "('prompt', 'attempt', 'tool_result', 'client_result')",
        ),
        "run_events": await scalar(
            url, f"SELECT {size('data')} FROM run_events WHERE event = 'message'"
        ),
    }


async def runs(client: AppClient, conv: str, prompts: list[str]) -> int:
    """Run each prompt on ``conv``; the bytes of the messages the runs added."""
    content = 0
    for p in prompts:
        got = await client.post(f"/conversations/{conv}/runs", json={"prompts": [p]})
        assert got.status_code == 201, got.text
        for message in got.json()["new_messages"]:
            content += len(json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode())
    return content


async def create(client: AppClient, conv: str) -> None:
    got = await client.post("/conversations", json={"id": conv, "system_prompt": "S"})
    assert got.status_code == 201, got.text


async def test_records_and_transcript_hold_each_text_once(
    client: AppClient, database_url: str
) -> None:
    await create(client, "a")
    content = await runs(client, "a", [prompt(i) for i in range(8)])

    stored = await record_text_bytes(database_url)
    # every message the runs added, once: records, transcript and message events hold
    # references only
    # and the version records' system prompt and summary: '"S"' and '""'
    assert stored["message_texts"] == content + FRAME
    assert stored["run_new_messages"] == stored["run_finals"] == stored["transcript"] == 0
    assert stored["run_events"] == 0
    # and they read back as they were answered
    listed = (await client.get("/conversations/a/runs")).json()["items"]
    assert [r["new_messages"][0]["content"][0]["text"] for r in listed] == [
        prompt(i) for i in range(8)
    ]
    entries = (await client.get("/conversations/a/transcript")).json()["items"]
    assert [e["body"] for e in entries if e["kind"] == "prompt"] == [
        r["new_messages"][0] for r in listed
    ]


async def test_a_second_conversation_sending_the_same_history_stores_no_new_text(
    client: AppClient, database_url: str
) -> None:
    history = [prompt(i) for i in range(3)]
    await create(client, "first")
    await runs(client, "first", history)
    before = await scalar(database_url, "SELECT COUNT(*) FROM message_texts")
    size = await record_text_bytes(database_url)

    await create(client, "again")  # a client that keeps no state sends it all again
    await runs(client, "again", history)

    assert await scalar(database_url, "SELECT COUNT(*) FROM message_texts") == before
    assert await record_text_bytes(database_url) == size


async def test_deleting_a_conversation_deletes_the_texts_only_it_referenced(
    client: AppClient, database_url: str
) -> None:
    await create(client, "keep")
    await create(client, "gone")
    await runs(client, "keep", [prompt(1)])
    await runs(client, "gone", [prompt(1), prompt(2)])  # its first run's texts are shared
    shared = await scalar(database_url, "SELECT COUNT(*) FROM message_texts")
    # prompt 1 and its answer; prompt 2 and its answer; the system prompt and summary
    assert shared == 4 + 2

    assert (await client.delete("/conversations/gone")).status_code == 204
    assert await scalar(database_url, "SELECT COUNT(*) FROM message_texts") == 2 + 2
    record = (await client.get("/conversations/keep/runs")).json()["items"][0]
    assert record["new_messages"][0]["content"][0]["text"] == prompt(1)

    assert (await client.delete("/conversations/keep")).status_code == 204
    assert await scalar(database_url, "SELECT COUNT(*) FROM message_texts") == 0


async def test_export_import_and_fork_are_byte_identical(
    client: AppClient, database_url: str
) -> None:
    await create(client, "src")
    await runs(client, "src", [prompt(1), "é ✓ \U0001f600 \n \x01"])
    exported = await client.get("/conversations/src/export")
    assert exported.status_code == 200
    document: dict[str, Any] = exported.json()
    imported = await client.post("/conversations/import", params={"id": "copy"}, json=document)
    assert imported.status_code == 201, imported.text
    again = (await client.get("/conversations/copy/export")).json()
    for part in ("transcript", "runs"):
        assert json.dumps(again[part]) == json.dumps(document[part])
    forked = await client.post("/conversations/src/fork", json={"id": "fk"})
    assert forked.status_code == 201, forked.text
    source = (await client.get("/conversations/src/context")).content
    fork = (await client.get("/conversations/fk/context")).content
    assert fork == source
    # the copies stored no text of their own
    assert await scalar(database_url, "SELECT COUNT(*) FROM message_texts") == 4 + 2


async def test_the_stored_context_references_its_texts_and_a_replace_keeps_them_for_versions(
    client: AppClient, database_url: str
) -> None:
    await create(client, "a")
    content = await runs(client, "a", [prompt(i) for i in range(3)])
    size = pg_octets if database_url.startswith("postgresql") else octets
    # the context's rows hold references: its messages are the records' texts
    assert await scalar(database_url, f"SELECT {size('body')} FROM context_messages") == 0
    assert (await record_text_bytes(database_url))["message_texts"] == content + FRAME
    texts = await scalar(database_url, "SELECT COUNT(*) FROM message_texts")

    # a context PUT on another conversation: its own message is one text more
    own = {"type": "user", "content": [{"type": "text", "text": "only here"}]}
    put = await client.put(
        "/conversations/b/context",
        json={"system_prompt": "", "summary": "", "messages": [own]},
        headers={"If-None-Match": "*"},
    )
    assert put.status_code == 201, put.text
    assert await scalar(database_url, "SELECT COUNT(*) FROM message_texts") == texts + 1
    # replaced: its text stays, for the version before (until the version retention)
    empty = {"system_prompt": "", "summary": "", "messages": []}
    put = await client.put(
        "/conversations/b/context", json=empty, headers={"If-Match": put.headers["etag"]}
    )
    assert put.status_code == 200, put.text
    assert await scalar(database_url, "SELECT COUNT(*) FROM message_texts") == texts + 1
    # the records of "a" still reference its texts: emptying its context keeps them
    etag = (await client.get("/conversations/a")).json()["etag"]
    put = await client.put("/conversations/a/context", json=empty, headers={"If-Match": etag})
    assert put.status_code == 200, put.text
    assert await scalar(database_url, "SELECT COUNT(*) FROM message_texts") == texts + 1
    listed = (await client.get("/conversations/a/runs")).json()["items"]
    assert len(listed) == 3


async def test_a_finished_runs_prompts_reference_the_texts_of_its_records(
    client: AppClient, database_url: str
) -> None:
    await create(client, "a")
    await runs(client, "a", [prompt(i) for i in range(3)])
    size = pg_octets if database_url.startswith("postgresql") else octets
    # each run row keeps "[]" and three keys, not its prompt
    assert await scalar(database_url, f"SELECT {size('prompts')} FROM runs") == 3 * 2
    assert await scalar(database_url, "SELECT COUNT(*) FROM runs WHERE prompt_keys IS NULL") == 0
    listed = (await client.get("/conversations/a/runs")).json()["items"]
    assert [r["prompts"][0]["content"][0]["text"] for r in listed] == [prompt(i) for i in range(3)]
    one = (await client.get(f"/conversations/a/runs/{listed[1]['run_id']}")).json()
    assert one["prompts"] == listed[1]["prompts"]
    exported = (await client.get("/conversations/a/export")).json()
    assert [r["prompts"] for r in exported["runs"]] == [
        r["prompts"] for r in sorted(listed, key=lambda r: r["run_id"])
    ]
    # a referenced prompt text that is not what was stored is refused, never served
    engine = make_engine(database_url)
    try:
        async with engine.begin() as conn:
            changed = await conn.execute(
                text(
                    'UPDATE message_texts SET body = replace(body, \'"text":"1 \', '
                    '\'"text":"9 \') WHERE body LIKE \'%"type":"user"%\' '
                    'AND body LIKE \'%"text":"1 %\''
                )
            )
            assert changed.rowcount == 1
    finally:
        await engine.dispose()
    for path in (f"runs/{listed[1]['run_id']}", "runs"):
        got = await client.get(f"/conversations/a/{path}")
        assert got.status_code == 409, got.text
        assert got.json()["type"].endswith("/stored-data-damaged")
