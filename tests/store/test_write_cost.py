"""A run's write is O(what changed), not O(conversation) (contract §5; acceptance point).

``finish_run`` on a conversation of 10 messages and on one of 5,000 must execute the same SQL
statements and write the same number of rows. Counted with SQLAlchemy's cursor events, not timed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from app.agent.messages import (
    AssistantMessage,
    Context,
    TextBlock,
    ToolCallBlock,
    ToolResultMessage,
)
from app.agent.records import Result
from tests.repository import Repository

from .builders import assistant, compaction, completed_run, conversation, result, user

T = "acme"
SMALL, LARGE = 10, 5_000


@dataclass
class Writes:
    statements: list[str] = field(default_factory=list)
    rows: int = 0

    @property
    def verbs(self) -> list[str]:
        return [" ".join(s.split()[:3]) for s in self.statements]


@contextmanager
def counting(engine: AsyncEngine) -> Iterator[Writes]:
    writes = Writes()

    def after(
        conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool
    ) -> None:
        writes.statements.append(statement)
        if statement.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE")):
            writes.rows += len(parameters) if executemany else max(cursor.rowcount, 0)

    event.listen(engine.sync_engine, "after_cursor_execute", after)
    try:
        yield writes
    finally:
        event.remove(engine.sync_engine, "after_cursor_execute", after)


def plain(ctx: Context) -> Result:
    return completed_run(ctx)


def with_tools(ctx: Context) -> Result:
    p = user("what time is it?")
    asks = AssistantMessage(
        content=(ToolCallBlock(id="c1", name="time_now", arguments="{}"),), stop_reason="tool_use"
    )
    answer = ToolResultMessage(
        tool_call_id="c1", tool_name="time_now", content=(TextBlock(text="noon"),)
    )
    says = assistant("noon")
    msgs = (p, asks, answer, says)
    return result("completed", ctx.model_copy(update={"messages": (*ctx.messages, *msgs)}), msgs)


def with_compaction(ctx: Context) -> Result:
    p, a = user("next?"), assistant("ok")
    folded = ctx.messages[:4]
    new_ctx = ctx.model_copy(update={"summary": "S", "messages": (*ctx.messages[4:], p, a)})
    return result("completed", new_ctx, [p, a], [compaction(folded, "S")])


async def measure(
    repo: Repository,
    engine: AsyncEngine,
    conv_id: str,
    size: int,
    make: Callable[[Context], Result],
) -> Writes:
    await repo.replace_context(T, conv_id, conversation(size), create=True)
    base = await repo.load_context(T, conv_id)
    run = await repo.insert_run(T, conv_id, base_etag=base.etag, prompts=[user("next?")])
    res = make(base.context)
    with counting(engine) as writes:
        outcome = await repo.finish_run(T, conv_id, run.run_id, base=base, result=res, store=True)
    assert outcome.stored
    assert (await repo.load_context(T, conv_id)).context == res.context
    return writes


RUN_WRITE = [
    "UPDATE conversations SET",  # the conditional version bump; allocates transcript seqs
    "INSERT INTO context_messages",  # the appended messages only
    "INSERT INTO context_versions",  # the version's record (app/store/versions.py)
    "UPDATE runs SET",  # its outcome, and which of its new messages is its final
    "INSERT INTO run_new_messages",
    "INSERT INTO transcript",
    "INSERT INTO message_texts",  # the texts of the rows, records and transcript, each once
    "INSERT INTO webhook_deliveries",  # the outbox, as INSERT … SELECT (issue 13)
]
#: a run that used tokens also settles them on its tenant's day (app/store/quotas.py): one row
SETTLED_RUN_WRITE = [*RUN_WRITE[:5], "INSERT INTO tenant_usage", *RUN_WRITE[5:]]
#: a compaction deletes nothing: the folded rows stay, below the new first position, for the
#: versions before it (the version sweep deletes them after the retention)
WITH_COMPACTION = [*RUN_WRITE[:5], "INSERT INTO run_compactions", *RUN_WRITE[5:]]


@pytest.mark.parametrize(
    ("make", "expected", "rows"),
    [
        (plain, SETTLED_RUN_WRITE, 12),
        (with_tools, RUN_WRITE, 19),
        (with_compaction, WITH_COMPACTION, 14),  # its new summary is a text too
    ],
    ids=["plain", "tools", "compaction"],
)
async def test_a_runs_write_does_not_grow_with_the_conversation(
    repo: Repository,
    engine: AsyncEngine,
    make: Callable[[Context], Result],
    expected: list[str],
    rows: int,
) -> None:
    small = await measure(repo, engine, "small", SMALL, make)
    large = await measure(repo, engine, "large", LARGE, make)

    assert large.statements == small.statements
    assert large.rows == small.rows == rows
    # A conditional write, never read-then-write: no SELECT at all.
    begin = ["BEGIN IMMEDIATE"] if engine.dialect.name == "sqlite" else []
    assert large.verbs == [*begin, *expected]
