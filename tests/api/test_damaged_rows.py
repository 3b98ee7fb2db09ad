"""A damaged stored message (docs/faults.md, "Damaged stored rows"): a row changed behind the
service's back — made invalid JSON, or valid JSON that is not what was written — is never
served, copied or run. Every read of its conversation answers 409 ``stored-data-damaged``
naming the conversation and the message; a run takes no lease, stores nothing and blocks
nothing; other conversations are untouched; a PUT with If-Match repairs it; ``carryover check``
lists it. On both engines; each read by a fresh process (nothing of the conversation cached)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import text

from app.cli import main
from app.config import get_settings
from app.store.db import make_engine

from ..fakes.gated import GatedProvider, gated_pool
from ..helpers import assert_problem, until, user
from .conftest import AppClient, SettingsFactory

A, B = "damaged", "sound"
PROBLEM = "https://carryover.dev/problems/"
ASYNC = {"Prefer": "respond-async"}
KEY = {"Idempotency-Key": "key-1"}

#: how a row is damaged: (SQL expression of the new body, what the read says)
DAMAGES = {
    # invalid JSON: the object cut short
    "invalid-json": "substr(body, 1, length(body) - 3)",
    # valid JSON that is not what was written: one letter of a text changed
    "flipped-byte": "replace(body, 'second', 'secomd')",
}


def assistant(text_: str) -> dict[str, Any]:
    return {"type": "assistant", "content": [{"type": "text", "text": text_}]}


CONTEXT = {
    "system_prompt": "Be brief.",
    "summary": "",
    "messages": [user("first"), assistant("one"), user("second"), assistant("two")],
}


async def put_context(client: AppClient, conv: str) -> str:
    put = await client.put(
        f"/conversations/{conv}/context", json=CONTEXT, headers={"If-None-Match": "*"}
    )
    assert put.status_code == 201, put.text
    etag: str = put.headers["etag"]
    return etag


#: the text a context row references (message_texts, shared with the conversations that
#: store the same message), as an expression over the row
REFERENCED = (
    "(SELECT {expression} FROM message_texts t WHERE t.tenant = context_messages.tenant "
    "AND t.sha256 = context_messages.body_sha256)"
)


async def damage(url: str, conv: str, position: int, expression: str) -> None:
    """Damage one context row: it is given its own text, ``expression`` over the text it
    references (the other conversations that reference the same text stay sound)."""
    engine = make_engine(url)
    try:
        async with engine.begin() as conn:
            own = REFERENCED.format(expression=expression)
            done = await conn.execute(
                text(
                    f"UPDATE context_messages SET body = {own} "
                    "WHERE conversation_id = :conv AND position = :position"
                ),
                {"conv": conv, "position": position},
            )
            assert done.rowcount == 1
    finally:
        await engine.dispose()


def assert_damaged(response: Any, etag: str, index: int = 2) -> dict[str, Any]:
    body = assert_problem(response, 409, "stored-data-damaged")
    assert body["conversation_id"] == A
    assert body["message_index"] == index
    assert body["current_etag"] == etag
    assert f"message {index}" in body["detail"] and "If-Match" in body["detail"]
    return body


@pytest.mark.parametrize("kind", sorted(DAMAGES))
async def test_a_damaged_conversation_answers_a_problem_on_every_read_and_takes_no_run(
    kind: str,
    app_factory: Callable[..., Any],
    database_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with app_factory() as client:
        etag = await put_context(client, A)
        await put_context(client, B)
        stored = (await client.get(f"/conversations/{B}/context")).json()  # defaults written
    await damage(database_url, A, 2, DAMAGES[kind])

    async with app_factory() as client:  # a fresh process: nothing of A in its caches
        with caplog.at_level(logging.ERROR, logger="app.store.integrity"):
            assert_damaged(await client.get(f"/conversations/{A}/context"), etag)
        assert any(  # the operator's signal
            r.levelno == logging.ERROR and f"message 2 of conversation {A!r}" in r.getMessage()
            for r in caplog.records
        )
        assert_damaged(await client.get(f"/conversations/{A}/export"), etag)
        fork = await client.post(f"/conversations/{A}/fork", json={"id": "copy"})
        assert_damaged(fork, etag)
        assert (await client.get("/conversations/copy")).status_code == 404
        assert_damaged(  # message 2 is the first left out: whether the cut is safe is unknown
            await client.post(f"/conversations/{A}/fork", json={"id": "copy", "messages": 2}),
            etag,
        )
        # what comes before it can still be saved: a fork of the sound messages
        salvage = await client.post(f"/conversations/{A}/fork", json={"id": "kept", "messages": 1})
        assert salvage.status_code == 201, salvage.text
        kept = (await client.get("/conversations/kept/context")).json()
        assert kept["messages"] == stored["messages"][:1]
        for _ in range(2):  # again and again: nothing is left holding the conversation
            run = await client.post(
                f"/conversations/{A}/runs", json={"prompts": ["hi"]}, headers=KEY
            )
            assert_damaged(run, etag)
        assert_damaged(await client.post(f"/conversations/{A}/compact"), etag)

        conv = (await client.get(f"/conversations/{A}")).json()
        assert conv["active_run_id"] is None and conv["etag"] == etag
        assert (await client.get(f"/conversations/{A}/runs")).json()["items"] == []
        entries = (await client.get(f"/conversations/{A}/transcript")).json()["items"]
        assert [e["kind"] for e in entries] == ["context_replaced"]

        # the other conversation is untouched
        assert (await client.get(f"/conversations/{B}/context")).json() == stored
        run = await client.post(f"/conversations/{B}/runs", json={"prompts": ["hi"]})
        assert run.status_code == 201 and run.json()["status"] == "completed", run.text
        assert (await client.get(f"/conversations/{B}/export")).status_code == 200

        # the repair the problem names: a PUT of the context with If-Match
        repaired = await client.put(
            f"/conversations/{A}/context", json=CONTEXT, headers={"If-Match": etag}
        )
        assert repaired.status_code == 200, repaired.text
        got = await client.get(f"/conversations/{A}/context")
        assert got.status_code == 200 and got.json() == stored
        run = await client.post(f"/conversations/{A}/runs", json={"prompts": ["hi"]}, headers=KEY)
        assert run.status_code == 201 and run.json()["status"] == "completed", run.text
        assert run.headers.get("idempotent-replayed") is None  # the key was never taken
        exported = await client.get(f"/conversations/{A}/export")
        assert exported.status_code == 200
        assert len(json.loads(exported.content)["context"]["messages"]) == 6
        assert (
            await client.post(f"/conversations/{A}/fork", json={"id": "copy"})
        ).status_code == 201


async def test_a_message_stored_before_checksums_is_verified_by_decoding(
    app_factory: Callable[..., Any], database_url: str
) -> None:
    async with app_factory() as client:
        etag = await put_context(client, A)
        stored = (await client.get(f"/conversations/{A}/context")).json()
    engine = make_engine(database_url)
    try:
        async with engine.begin() as conn:  # as migration 0013 leaves a row it cannot vouch for
            own = REFERENCED.format(expression="t.body")
            await conn.execute(
                text(f"UPDATE context_messages SET body = {own}, body_sha256 = NULL")
            )
    finally:
        await engine.dispose()
    async with app_factory() as client:
        got = await client.get(f"/conversations/{A}/context")
        assert got.status_code == 200 and got.json() == stored
        run = await client.post(f"/conversations/{A}/runs", json={"prompts": ["x"]})
        assert run.status_code == 201, run.text  # its new rows have checksums, the old none
        etag = run.headers["etag"]
    await damage(database_url, A, 2, DAMAGES["invalid-json"])
    async with app_factory() as client:
        assert_damaged(await client.get(f"/conversations/{A}/context"), etag)
        assert_damaged(await client.post(f"/conversations/{A}/runs", json={"prompts": ["x"]}), etag)


@pytest.fixture
def cli_database(database_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The environment of ``carryover check`` on the test database: the settings re-read,
    the logging the command configures taken back after it."""
    for name in list(os.environ):
        if name.upper().startswith("CARRYOVER_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("CARRYOVER_DATABASE_URL", database_url)
    get_settings.cache_clear()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield database_url
    get_settings.cache_clear()
    root.handlers[:] = handlers
    root.setLevel(level)


async def check(*argv: str) -> int:
    """``carryover check ARGV``, in a thread (the command runs its own event loop)."""
    return await asyncio.to_thread(main, ["check", *argv])


async def test_carryover_check_lists_the_damaged_messages_and_how_to_repair(
    app_factory: Callable[..., Any], cli_database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    database_url = cli_database
    async with app_factory() as client:
        etag = await put_context(client, A)
        await put_context(client, B)
    assert await check() == 0
    assert "no damaged messages" in capsys.readouterr().out

    await damage(database_url, A, 2, DAMAGES["flipped-byte"])
    await damage(database_url, A, 3, DAMAGES["invalid-json"])
    assert await check("--batch", "3") == 1  # batches smaller than the table
    out = capsys.readouterr().out
    assert "conversation 'damaged' message 2" in out
    assert "conversation 'damaged' message 3" in out
    assert "'sound'" not in out
    assert f"PUT /conversations/{A}/context with If-Match: {etag}" in out

    assert await check("--json") == 1
    document = json.loads(capsys.readouterr().out)
    assert [(d["conversation_id"], d["message_index"]) for d in document["damaged_messages"]] == [
        (A, 2),
        (A, 3),
    ]
    assert document["damaged_conversations"] == [
        {
            "tenant": document["damaged_messages"][0]["tenant"],
            "conversation_id": A,
            "etag": etag,
            "repair": f"PUT /conversations/{A}/context with If-Match: {etag} and the context "
            f"to keep, or DELETE /conversations/{A}",
        }
    ]

    async with app_factory() as client:
        repaired = await client.put(
            f"/conversations/{A}/context", json=CONTEXT, headers={"If-Match": etag}
        )
        assert repaired.status_code == 200
    assert await check() == 0


async def test_a_queued_background_run_is_refused_at_its_turn_and_frees_the_conversation(
    app_factory: Callable[..., Any], make_settings: SettingsFactory, database_url: str
) -> None:
    gate = GatedProvider(hold=lambda prompt: prompt.startswith("held"))
    async with app_factory(agents=gated_pool(make_settings(), gate)) as client:
        try:
            await put_context(client, A)
            runs = f"/conversations/{A}/runs"
            first = await client.post(runs, json={"prompts": ["held"]}, headers=ASYNC)
            assert first.status_code == 202, first.text
            held = await gate.arrival("held")
            queued = await client.post(
                runs, json={"prompts": ["next"], "if_busy": "enqueue"}, headers=ASYNC
            )
            assert queued.status_code == 202 and queued.json()["status"] == "queued"
            await damage(database_url, A, 2, DAMAGES["flipped-byte"])
            held.release()  # the first run ran on the context it read before the damage

            async def ended(run_id: str) -> dict[str, Any] | None:
                record: dict[str, Any] = (await client.get(f"{runs}/{run_id}")).json()
                return None if record["status"] in ("queued", "running") else record

            assert (await until(lambda: ended(first.json()["run_id"])))["status"] == "completed"
            record = await until(lambda: ended(queued.json()["run_id"]))
            assert record["status"] == "failed" and record["stored"] is False
            assert record["error"]["type"] == PROBLEM + "run-stored-data-damaged"
            assert record["error"]["code"] == "stored_data_damaged"
            assert "message 2" in record["error"]["detail"]
            conv = (await client.get(f"/conversations/{A}")).json()
            assert conv["active_run_id"] is None
            assert_damaged(await client.get(f"/conversations/{A}/context"), conv["etag"])
        finally:
            gate.open()


async def test_a_damaged_transcript_entry_or_run_record_is_refused_not_a_500(
    app_factory: Callable[..., Any], database_url: str
) -> None:
    async with app_factory() as client:
        await put_context(client, A)
        run = await client.post(f"/conversations/{A}/runs", json={"prompts": ["hi"]})
        assert run.status_code == 201
        run_id = run.json()["run_id"]
        # the context goes back to what was PUT: the run's messages are its records' alone
        put = await client.put(
            f"/conversations/{A}/context", json=CONTEXT, headers={"If-Match": run.headers["etag"]}
        )
        assert put.status_code == 200, put.text
    engine = make_engine(database_url)
    try:
        async with engine.begin() as conn:
            # the records' texts live in message_texts, each checked against its key; those
            # of the stored context are left sound
            for table in ("transcript", "run_new_messages"):
                await conn.execute(text(f"UPDATE {table} SET body = substr(body, 2)"))
            await conn.execute(
                text(
                    "UPDATE message_texts SET body = substr(body, 2) WHERE sha256 NOT IN "
                    "(SELECT m.body_sha256 FROM context_messages m JOIN conversations c "
                    "ON c.tenant = m.tenant AND c.id = m.conversation_id "
                    "WHERE m.body_sha256 IS NOT NULL "
                    "AND m.position >= c.next_position - c.message_count) "
                    "AND sha256 NOT IN (SELECT system_sha256 FROM context_versions) "
                    "AND sha256 NOT IN (SELECT summary_sha256 FROM context_versions)"
                )
            )
    finally:
        await engine.dispose()
    async with app_factory() as client:
        for path in ("transcript", f"runs/{run_id}"):
            got = await client.get(f"/conversations/{A}/{path}")
            body = assert_problem(got, 409, "stored-data-damaged")
            assert "not JSON" in body["detail"] or "match its checksum" in body["detail"]
            assert got.headers.get("connection") != "close"  # a handled answer, not a 500
        # the context itself is sound: it is served, and runs go on
        assert (await client.get(f"/conversations/{A}/context")).status_code == 200
        again = await client.post(f"/conversations/{A}/runs", json={"prompts": ["again"]})
        assert again.status_code == 201, again.text


async def test_a_transcript_entry_of_a_kind_it_cannot_have_is_refused_not_a_500(
    app_factory: Callable[..., Any], database_url: str
) -> None:
    """A kind changed behind the service's back (or written by another version of it): the
    transcript read answers the damaged-record problem, and the context and runs go on."""
    async with app_factory() as client:
        await put_context(client, A)
        run = await client.post(f"/conversations/{A}/runs", json={"prompts": ["hi"]})
        assert run.status_code == 201
    engine = make_engine(database_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(text("UPDATE transcript SET kind = 'eo' WHERE kind = 'prompt'"))
    finally:
        await engine.dispose()
    async with app_factory() as client:
        got = await client.get(f"/conversations/{A}/transcript")
        body = assert_problem(got, 409, "stored-data-damaged")
        assert "'eo'" in body["detail"]
        assert (await client.get(f"/conversations/{A}/context")).status_code == 200
        again = await client.post(f"/conversations/{A}/runs", json={"prompts": ["again"]})
        assert again.status_code == 201, again.text


async def test_carryover_check_lists_a_damaged_message_text_and_the_conversations_using_it(
    app_factory: Callable[..., Any], cli_database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    database_url = cli_database
    async with app_factory() as client:
        for conv, prompt in ((A, "the damaged one"), (B, "the sound one")):
            await put_context(client, conv)
            run = await client.post(f"/conversations/{conv}/runs", json={"prompts": [prompt]})
            assert run.status_code == 201, run.text
    assert await check() == 0
    capsys.readouterr()

    engine = make_engine(database_url)
    try:
        async with engine.begin() as conn:
            # still JSON, still a message: only its key can tell
            changed = await conn.execute(
                text(
                    "UPDATE message_texts SET body = replace(body, 'the damaged one', "
                    "'the damagec one') WHERE body LIKE '%the damaged one%'"
                )
            )
            assert changed.rowcount == 2  # the prompt, and echo's answer quoting it
    finally:
        await engine.dispose()

    assert await check("--batch", "1") == 1
    out = capsys.readouterr().out
    assert f"referenced by conversation(s) {A!r}" in out
    assert f"DELETE /conversations/{A}" in out
    assert repr(B) not in out
    assert await check("--json") == 1
    document = json.loads(capsys.readouterr().out)
    # the context of A references the same texts: its two messages are damaged with them
    assert [(m["conversation_id"], m["message_index"]) for m in document["damaged_messages"]] == [
        (A, 4),
        (A, 5),
    ]
    assert len(document["damaged_texts"]) == 2
    for found in document["damaged_texts"]:
        assert found["conversations"] == [A]
        assert "does not match" in found["reason"]
