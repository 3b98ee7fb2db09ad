"""What a run costs the database, counted (docs/performance.md, "Where a run's time goes"): a
run over HTTP on a conversation this process ran before issues the same few statements at 10
and at 1,000 messages, and the engine carries no event listener of its own (with one,
SQLAlchemy dispatches events around every statement). Counts, never timings."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.db import sqlite_checkpoints
from app.store.quotas import QuotaStore

from ..helpers import server_calls
from .conftest import AppClient

MINIMAL = {"Prefer": "return=minimal"}
API_KEY = "statements-key-0123456789"

#: a run's statements, by their first words: the start (quota, run row, lease), then the outcome
#: (the conditional save, its rows, the run's records, the transcript, events and the outbox)
START = [
    "SELECT conversations",  # the row, its queue head and whether the tenant has a quota
    "INSERT INTO tenant_usage",  # the run counts in the tenant's day
    "INSERT INTO runs",
    "UPDATE conversations",  # the lease (the inserts before it ride with it)
]
OUTCOME = [
    "UPDATE conversations",  # the conditional save
    "INSERT INTO context_messages",
    "INSERT INTO context_versions",  # the version's record (docs/decisions.md)
    "UPDATE runs",  # its outcome, and which of its new messages is its final
    "INSERT INTO run_new_messages",
    "INSERT INTO tenant_usage",  # the run's tokens
    "INSERT INTO transcript",
    "INSERT INTO run_events",
    "INSERT INTO message_texts",  # the texts the records, transcript and events reference
    "INSERT INTO webhook_deliveries",
]


def verb(statement: str) -> str:
    words = statement.split()
    if words[0] == "SELECT":  # by the table of its first column
        return f"SELECT {words[1].split('.')[0]}"
    return " ".join(words[:3]) if words[0] == "INSERT" else " ".join(words[:2])


#: set while requests are counted: their statements, and those of the tasks they start, see it
#: (a task copies its creator's context); the app's background loops, started before, do not
_COUNTED: ContextVar[bool] = ContextVar("counted", default=False)


@contextmanager
def statements(engine: AsyncEngine) -> Iterator[list[str]]:
    """The statements executed for the requests made inside the block, by verb; a background
    loop's statement landing meanwhile (a lease renewal, the webhook outbox's poll) is not
    counted."""
    seen: list[str] = []

    def after(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if _COUNTED.get():
            seen.append(verb(statement))

    event.listen(engine.sync_engine, "after_cursor_execute", after)
    token = _COUNTED.set(True)
    try:
        yield seen
    finally:
        _COUNTED.reset(token)
        event.remove(engine.sync_engine, "after_cursor_execute", after)


async def put(client: AppClient, conv: str, n: int) -> None:
    messages = [
        {
            "type": "user" if i % 2 == 0 else "assistant",
            "content": [{"type": "text", "text": f"message {i}"}],
        }
        for i in range(n)
    ]
    answer = await client.put(
        f"/conversations/{conv}/context",
        headers={"If-None-Match": "*"},
        json={"system_prompt": "Be brief.", "summary": "", "messages": messages},
    )
    assert answer.status_code == 201, answer.text


async def test_a_run_issues_the_same_few_statements_at_10_and_1000_messages(
    app_factory: Callable[..., Any],
) -> None:
    # With an API key configured, as a deployment has: without one, a request checks every
    # 2 s whether keys were added to the database since (one COUNT, then and there), which
    # would land among the run's statements now and then.
    async with app_factory(api_keys=f"acme:{API_KEY}") as client:
        client.headers["Authorization"] = f"Bearer {API_KEY}"
        await _count_statements(client)


async def _count_statements(client: AppClient) -> None:
    engine: AsyncEngine = client.app.state.services.engine
    seen: dict[int, list[str]] = {}
    for n in (10, 1_000):
        conv = f"count-{n}"
        await put(client, conv, n)
        warm = await client.post(f"/conversations/{conv}/runs", json={"prompts": ["warm"]})
        assert warm.status_code == 201
        with statements(engine) as run:
            answer = await client.post(
                f"/conversations/{conv}/runs", json={"prompts": ["hi"]}, headers=MINIMAL
            )
        assert answer.status_code == 201 and answer.json()["status"] == "completed"
        seen[n] = run
    assert seen[10] == seen[1_000]
    # each write transaction opens with its own BEGIN on SQLite (app/store/db.py)
    begin = ["BEGIN IMMEDIATE"] if engine.dialect.name == "sqlite" else []
    assert seen[10] == [*begin, *START, *begin, *OUTCOME]


async def test_a_tenant_with_a_quota_has_its_quota_row_read_when_a_run_starts(
    app_factory: Callable[..., Any],
) -> None:
    # the first statement says whether the tenant has a quota row; only then is it read (on
    # PostgreSQL locked, serialising the tenant's starts), right after
    async with app_factory(api_keys=f"acme:{API_KEY}") as client:
        client.headers["Authorization"] = f"Bearer {API_KEY}"
        svc: Any = client.app.state.services
        await QuotaStore(svc.engine, svc.runs.clock).set("acme", runs_per_minute=1_000)
        await put(client, "quota", 10)
        warm = await client.post("/conversations/quota/runs", json={"prompts": ["warm"]})
        assert warm.status_code == 201
        with statements(svc.engine) as run:
            answer = await client.post(
                "/conversations/quota/runs", json={"prompts": ["hi"]}, headers=MINIMAL
            )
        assert answer.status_code == 201 and answer.json()["status"] == "completed"
    first = run.index("SELECT conversations")
    assert run[first + 1] == "SELECT tenant_quotas" and run.count("SELECT tenant_quotas") == 1


async def test_the_engine_has_no_event_listener_of_its_own(client: AppClient) -> None:
    engine: AsyncEngine = client.app.state.services.engine
    # SQLAlchemy checks this flag around every statement: with a listener on the engine it
    # dispatches before/after events for each one, each run's ~16 statements
    assert not engine.sync_engine._has_events


async def test_a_run_on_sqlite_makes_no_call_into_the_driver_thread(
    app_factory: Callable[..., Any], monkeypatch: Any
) -> None:
    # Each call into aiosqlite's thread is a hop (a queue put, a thread wake-up, a call back
    # onto the loop). The BEGIN IMMEDIATE of each write transaction rides with its first
    # statement, the inserts nobody reads with the next statement or the COMMIT, and a run's
    # small statements and its two COMMITs run on the loop's own thread
    # (app/store/sqlite_driver.py), as long as no statement listener is on the engine (this
    # test adds none) and no log checkpoint is due (none is, here): no call into the thread.
    import threading

    import aiosqlite

    from app.store import sqlite_driver

    hops: list[str] = []
    ran: list[tuple[str, bool]] = []  # (statement, on the loop's thread)
    execute = aiosqlite.Connection._execute
    run_statement = sqlite_driver._run_statement

    async def counted(self: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if _COUNTED.get():
            hops.append(getattr(fn, "__name__", "?"))
        return await execute(self, fn, *args, **kwargs)

    loop_thread = threading.get_ident()

    def recorded(raw: Any, operation: str, *args: Any) -> Any:
        # aiosqlite's thread does not see the request's context: a statement of the counted
        # run that went there is missing from ``ran``
        if _COUNTED.get():
            ran.append((verb(operation), threading.get_ident() == loop_thread))
        return run_statement(raw, operation, *args)

    monkeypatch.setattr(aiosqlite.Connection, "_execute", counted)
    monkeypatch.setattr(sqlite_driver, "_run_statement", recorded)
    await _one_warm_run_counted_on_sqlite(app_factory, "hops")
    assert hops == []
    # every statement, the inserts held for each COMMIT included, ran on the loop
    assert ran == [(s, True) for s in [*START, *OUTCOME]]


async def test_a_run_on_sqlite_executes_every_statement_straight_on_the_driver(
    app_factory: Callable[..., Any], monkeypatch: Any
) -> None:
    # The run's statements are prepared (app/store/direct.py): with no statement listener
    # on the engine, none takes SQLAlchemy's per-statement path (an execution context, a
    # cursor result, a greenlet switch); each goes to the driver as compiled once.
    from app.store.sqlite_driver import OneHopConnection

    direct, through_sqlalchemy = _counted_paths(monkeypatch, OneHopConnection)
    await _one_warm_run_counted_on_sqlite(app_factory, "direct")
    assert through_sqlalchemy == []
    assert direct == [*START, *OUTCOME]


async def test_a_run_on_postgresql_executes_every_statement_straight_on_the_driver(
    app_factory: Callable[..., Any], monkeypatch: Any
) -> None:
    # The same on PostgreSQL: asyncpg's adapter cursor runs each statement (or holds it)
    # as it would SQLAlchemy's.
    from app.store.pg_driver import KeepingConnection

    direct, through_sqlalchemy = _counted_paths(monkeypatch, KeepingConnection)
    await _one_warm_run_counted(app_factory, "direct", "postgresql")
    assert through_sqlalchemy == []
    assert direct == [*START, *OUTCOME]


def _counted_paths(monkeypatch: Any, driver: type[Any]) -> tuple[list[str], list[str]]:
    """The statements of the counted requests that reach ``driver``'s ``execute_direct``
    and those that take SQLAlchemy's execution context, as they happen."""
    from sqlalchemy.engine import Connection

    direct: list[str] = []
    through_sqlalchemy: list[str] = []
    execute_direct = driver.execute_direct
    execute_context = Connection._execute_context

    async def counted_direct(self: Any, operation: str, *args: Any, **kwargs: Any) -> Any:
        if _COUNTED.get():
            direct.append(verb(operation))
        return await execute_direct(self, operation, *args, **kwargs)

    def counted_context(
        self: Any, dialect: Any, constructor: Any, statement: Any, *args: Any, **kwargs: Any
    ) -> Any:
        if _COUNTED.get():
            through_sqlalchemy.append(str(statement))
        return execute_context(self, dialect, constructor, statement, *args, **kwargs)

    monkeypatch.setattr(driver, "execute_direct", counted_direct)
    monkeypatch.setattr(Connection, "_execute_context", counted_context)
    return direct, through_sqlalchemy


async def _one_warm_run_counted_on_sqlite(app_factory: Callable[..., Any], conv: str) -> None:
    """A run on a conversation of 10 messages this process ran before, with :data:`_COUNTED`
    set around it (skipped on PostgreSQL: what the callers count is SQLite's driver)."""
    await _one_warm_run_counted(app_factory, conv, "sqlite")


async def _one_warm_run_counted(app_factory: Callable[..., Any], conv: str, on: str) -> None:
    """:func:`_one_warm_run_counted_on_sqlite` on the database ``on`` (skipped on the other)."""
    async with app_factory(api_keys=f"acme:{API_KEY}") as client:
        engine: AsyncEngine = client.app.state.services.engine
        if engine.dialect.name != on:
            pytest.skip(f"counts what goes to {on}")
        client.headers["Authorization"] = f"Bearer {API_KEY}"
        await put(client, conv, 10)
        warm = await client.post(f"/conversations/{conv}/runs", json={"prompts": ["warm"]})
        assert warm.status_code == 201
        checkpoints = sqlite_checkpoints(engine)
        if checkpoints is not None:  # none falls due in the counted run's two commits
            checkpoints.done()
        token = _COUNTED.set(True)
        try:
            answer = await client.post(
                f"/conversations/{conv}/runs", json={"prompts": ["hi"]}, headers=MINIMAL
            )
        finally:
            _COUNTED.reset(token)
        assert answer.status_code == 201 and answer.json()["status"] == "completed"


async def test_a_run_on_postgresql_makes_nine_round_trips(
    app_factory: Callable[..., Any], monkeypatch: Any
) -> None:
    # Each statement is a round trip to the server. The inserts nobody reads in the
    # transaction ride with its next statement as WITH clauses (app/store/pg_driver.py), and
    # a connection in use is not pinged when taken from the pool (app/store/db.py), and a
    # tenant without a quota reads no quota row (the first statement says so): a run is two
    # transactions of four and five round trips, whatever the conversation's length.
    with server_calls(monkeypatch, counted=_COUNTED.get) as calls:
        await _one_warm_run_counted(app_factory, "trips", "postgresql")
    trips = [c.split()[0] for c in calls if not c.startswith("prepare ")]
    start = ["BEGIN", "SELECT", "WITH", "COMMIT"]
    outcome = ["BEGIN", "UPDATE", "WITH", "WITH", "COMMIT"]
    assert trips == [*start, *outcome], calls


async def test_a_warm_run_on_sqlite_has_none_of_its_statements_prepared_again(
    app_factory: Callable[..., Any], monkeypatch: Any
) -> None:
    # The driver keeps each statement prepared (Python's sqlite3 statement cache), but SQLite
    # prepares one again, parsing and planning it, when it marked it to be re-planned on
    # every new binding: a LIKE whose pattern is a bare parameter, say. Counted by SQLite
    # itself (its sqlite_stmt table), for every statement of a warm run but the PRAGMAs
    # (the busy timeout set around a BEGIN IMMEDIATE), which SQLite always compiles anew.
    import sqlite3

    from app.store import sqlite_driver

    raws: set[sqlite3.Connection] = set()
    run_statement = sqlite_driver._run_statement

    def recorded(raw: Any, operation: str, *args: Any) -> Any:
        raws.add(raw)
        return run_statement(raw, operation, *args)

    def prepared_again() -> dict[str, int]:
        counts: dict[str, int] = {}
        for raw in raws:
            try:
                rows = raw.execute("SELECT sql, reprep FROM sqlite_stmt").fetchall()
            except sqlite3.OperationalError:  # SQLite built without SQLITE_ENABLE_STMTVTAB
                pytest.skip("this SQLite has no sqlite_stmt table")
            for sql, reprep in rows:
                if not sql.startswith("PRAGMA"):
                    counts[verb(sql)] = counts.get(verb(sql), 0) + reprep
        return counts

    monkeypatch.setattr(sqlite_driver, "_run_statement", recorded)
    async with app_factory(api_keys=f"acme:{API_KEY}") as client:
        engine: AsyncEngine = client.app.state.services.engine
        if engine.dialect.name != "sqlite":
            pytest.skip("counts what SQLite prepares")
        client.headers["Authorization"] = f"Bearer {API_KEY}"
        await put(client, "reprepared", 10)
        for prompt in ("warm", "warm again"):
            warm = await client.post("/conversations/reprepared/runs", json={"prompts": [prompt]})
            assert warm.status_code == 201
        before = prepared_again()
        answer = await client.post(
            "/conversations/reprepared/runs", json={"prompts": ["hi"]}, headers=MINIMAL
        )
        assert answer.status_code == 201 and answer.json()["status"] == "completed"
        after = prepared_again()
    assert set(after) >= {*START, *OUTCOME}  # each of the run's statements was seen
    assert {
        verb: n - before.get(verb, 0) for verb, n in after.items() if n > before.get(verb, 0)
    } == {}
