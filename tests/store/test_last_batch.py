"""The pending calls of a stored conversation are read from its last batch alone (issue 12):
``last_batch`` runs the same statements, each with a LIMIT, on a conversation of 10 messages
and on one of 5,000. Counted with SQLAlchemy's cursor events, not timed."""

from __future__ import annotations

from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from app.agent.messages import (
    AssistantMessage,
    Context,
    TextBlock,
    ToolCallBlock,
    ToolResultMessage,
)
from tests.repository import Repository

from .builders import conversation

T = "acme"


def with_open_batch(n: int) -> Context:
    """``n`` messages, then an assistant message with 40 calls, 35 of them answered."""
    calls = tuple(ToolCallBlock(id=f"c{i}", name="lookup", arguments="{}") for i in range(40))
    batch = AssistantMessage(content=calls, provider="echo", model="echo", stop_reason="tool_use")
    answered = tuple(
        ToolResultMessage(
            tool_call_id=f"c{i}",
            tool_name="lookup",
            content=(TextBlock(text="r"),),
        )
        for i in range(35)
    )
    base = conversation(n)
    return base.model_copy(update={"messages": (*base.messages, batch, *answered)})


async def statements_of_last_batch(
    engine: AsyncEngine, repo: Repository, conv: str
) -> tuple[tuple[Any, ...], list[str]]:
    seen: list[str] = []

    def after(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    event.listen(engine.sync_engine, "after_cursor_execute", after)
    try:
        tail, _ = await repo.last_batch(T, conv)
    finally:
        event.remove(engine.sync_engine, "after_cursor_execute", after)
    return tail, seen


async def test_last_batch_reads_only_the_trailing_batch(
    engine: AsyncEngine, repo: Repository
) -> None:
    found = {}
    for n in (10, 5_000):
        context = with_open_batch(n)
        await repo.replace_context(T, f"conv-{n}", context, create=True)
        tail, statements = await statements_of_last_batch(engine, repo, f"conv-{n}")
        assert tail == context.messages[-36:]  # the assistant message and its 35 results
        found[n] = statements
    assert found[10] == found[5_000]
    reads = [s for s in found[10] if "context_messages" in s]
    assert len(reads) == 2  # two chunks of 32 rows reach the assistant message
    assert all("LIMIT" in s.upper() for s in reads)
