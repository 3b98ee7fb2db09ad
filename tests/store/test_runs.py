"""Runs: one write transaction that stores the result conditionally, finishes the run row,
fills the audit tables and appends to the transcript (contract §4 "A run", §5)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from app.agent.messages import (
    AnyMessage,
    AssistantMessage,
    AttemptError,
    Context,
    TextBlock,
    ToolCallBlock,
    ToolResultMessage,
)
from app.agent.records import Result
from app.store.changes import plan_context_write
from app.store.errors import NotFound
from app.store.stores import Loaded, RunOutcome
from tests.repository import Repository

from .builders import (
    assistant,
    compaction,
    completed_run,
    conversation,
    failed_attempt,
    result,
    user,
)

T = "acme"


async def run_once(
    repo: Repository,
    conv_id: str,
    make: Callable[[Context], Result],
    *,
    store: bool = True,
) -> tuple[Loaded, Result, str, RunOutcome]:
    base = await repo.load_context(T, conv_id)
    res = make(base.context)
    run = await repo.insert_run(T, conv_id, base_etag=base.etag, prompts=[user("p")])
    outcome = await repo.finish_run(T, conv_id, run.run_id, base=base, result=res, store=store)
    return base, res, run.run_id, outcome


async def test_a_completed_run_stores_its_context_and_records_everything(
    repo: Repository,
) -> None:
    await repo.replace_context(T, "c1", conversation(4), create=True)
    base, res, run_id, outcome = await run_once(repo, "c1", completed_run)

    assert outcome.status == "completed" and outcome.stored
    assert outcome.etag == outcome.result_etag != base.etag
    loaded = await repo.load_context(T, "c1")
    assert loaded.context == res.context
    assert loaded.etag == outcome.etag
    assert (loaded.first_position, loaded.next_position) == (0, 6)

    record = await repo.get_run(T, "c1", run_id)
    assert record is not None
    assert record.run.status == "completed" and record.run.stored
    assert record.run.base_etag == base.etag and record.run.result_etag == outcome.etag
    assert record.run.finished_at is not None and record.run.finished_at >= record.run.created_at
    assert record.run.usage == res.usage.model_dump(mode="json")
    assert record.run.prompts == [user("p").model_dump(mode="json")]
    assert (record.new_messages, record.final, record.compactions) == (
        res.new_messages,
        res.final,
        res.compactions,
    )

    entries = await repo.list_transcript(T, "c1")
    assert [(e.kind, e.run_id, e.failed) for e in entries] == [
        ("context_replaced", None, False),
        ("prompt", run_id, False),
        ("attempt", run_id, False),
    ]
    assert [e.seq for e in entries] == [1, 2, 3]


async def test_a_run_on_a_stale_version_ends_conflicted_and_writes_no_context(
    repo: Repository,
) -> None:
    await repo.replace_context(T, "c1", conversation(4), create=True)
    base = await repo.load_context(T, "c1")
    run = await repo.insert_run(T, "c1", base_etag=base.etag, prompts=[user("next?")])
    # A PUT lands while the run is in flight.
    put_etag = await repo.replace_context(T, "c1", conversation(2, summary="x"), if_match=base.etag)

    res = completed_run(base.context)
    outcome = await repo.finish_run(T, "c1", run.run_id, base=base, result=res, store=True)

    assert (outcome.status, outcome.stored, outcome.result_etag) == ("conflicted", False, None)
    assert outcome.etag == put_etag
    loaded = await repo.load_context(T, "c1")
    assert loaded.context == conversation(2, summary="x")
    assert loaded.etag == put_etag
    record = await repo.get_run(T, "c1", run.run_id)
    assert record is not None
    assert (record.run.status, record.run.stored) == ("conflicted", False)
    assert record.new_messages == res.new_messages and record.final == res.final
    kinds = [e.kind for e in await repo.list_transcript(T, "c1")]
    assert kinds == ["context_replaced", "context_replaced", "prompt", "attempt"]


async def test_of_two_runs_from_the_same_base_only_the_first_is_stored(repo: Repository) -> None:
    await repo.replace_context(T, "c1", conversation(2), create=True)
    base = await repo.load_context(T, "c1")
    one = await repo.insert_run(T, "c1", base_etag=base.etag, prompts=[])
    two = await repo.insert_run(T, "c1", base_etag=base.etag, prompts=[])
    first = completed_run(base.context, "one?", "one")
    second = completed_run(base.context, "two?", "two")
    a = await repo.finish_run(T, "c1", one.run_id, base=base, result=first, store=True)
    b = await repo.finish_run(T, "c1", two.run_id, base=base, result=second, store=True)
    assert (a.status, b.status) == ("completed", "conflicted")
    assert b.etag == a.etag
    assert (await repo.load_context(T, "c1")).context == first.context


async def test_a_discarded_failed_run_leaves_the_stored_state_alone(repo: Repository) -> None:
    await repo.replace_context(T, "c1", conversation(2), create=True)
    before = await repo.load_context(T, "c1")
    attempt = failed_attempt()
    error = AttemptError(kind="fatal", message="it broke")

    def make(ctx: Context) -> Result:
        p = user("do it")
        return result(
            "failed",
            ctx.model_copy(update={"messages": (*ctx.messages, p)}),
            [p, attempt],
            error=error,
        )

    _, res, run_id, outcome = await run_once(repo, "c1", make, store=False)

    assert (outcome.status, outcome.stored, outcome.etag) == ("failed", False, before.etag)
    after = await repo.load_context(T, "c1")
    assert (after.context, after.etag) == (before.context, before.etag)
    record = await repo.get_run(T, "c1", run_id)
    assert record is not None
    assert record.run.error == error.model_dump(mode="json")
    assert record.final == attempt and record.new_messages == res.new_messages
    entries = (await repo.list_transcript(T, "c1"))[1:]
    assert [(e.kind, e.failed) for e in entries] == [("prompt", False), ("attempt", True)]


async def test_a_failed_run_kept_stores_its_context(repo: Repository) -> None:
    await repo.replace_context(T, "c1", conversation(2), create=True)

    def make(ctx: Context) -> Result:
        p = user("do it")
        return result(
            "failed",
            ctx.model_copy(update={"messages": (*ctx.messages, p)}),
            [p, failed_attempt()],
            error=AttemptError(kind="fatal", message="x"),
        )

    _, res, _, outcome = await run_once(repo, "c1", make, store=True)
    assert (outcome.status, outcome.stored) == ("failed", True)
    assert (await repo.load_context(T, "c1")).context == res.context


async def test_a_run_whose_conversation_was_deleted_or_recreated_records_nothing(
    repo: Repository,
) -> None:
    await repo.replace_context(T, "c1", conversation(2), create=True)
    base = await repo.load_context(T, "c1")
    run = await repo.insert_run(T, "c1", base_etag=base.etag, prompts=[])
    await repo.delete_conversation(T, "c1")
    with pytest.raises(NotFound):
        await repo.finish_run(
            T, "c1", run.run_id, base=base, result=completed_run(base.context), store=True
        )

    # Re-created under the same id: the old run must not write into the new incarnation.
    await repo.replace_context(T, "c1", conversation(2), create=True)
    fresh = await repo.load_context(T, "c1")
    with pytest.raises(NotFound):
        await repo.finish_run(
            T, "c1", run.run_id, base=base, result=completed_run(base.context), store=True
        )
    after = await repo.load_context(T, "c1")
    assert (after.context, after.etag) == (fresh.context, fresh.etag)
    assert len(await repo.list_transcript(T, "c1")) == 1
    assert await repo.list_runs(T, "c1") == []


async def test_insert_run_for_a_missing_conversation_is_not_found(repo: Repository) -> None:
    with pytest.raises(NotFound):
        await repo.insert_run(T, "ghost", base_etag='"x-1"', prompts=[])


# --- compaction: the stored rows are exactly result.context ------------------------------------


async def test_a_compaction_folding_part_of_the_base_stores_exactly_the_result(
    repo: Repository,
) -> None:
    await repo.replace_context(T, "c1", conversation(6), create=True)

    def make(ctx: Context) -> Result:
        folded, kept = ctx.messages[:2], ctx.messages[2:]
        p, a = user("next?"), assistant("ok")
        new_ctx = ctx.model_copy(update={"summary": "S1", "messages": (*kept, p, a)})
        return result("completed", new_ctx, [p, a], [compaction(folded, "S1", at=0)])

    _base, res, run_id, _outcome = await run_once(repo, "c1", make)
    loaded = await repo.load_context(T, "c1")
    assert loaded.context == res.context
    assert (loaded.first_position, loaded.next_position) == (2, 8)
    record = await repo.get_run(T, "c1", run_id)
    assert record is not None
    assert record.compactions == res.compactions
    entries = [e for e in await repo.list_transcript(T, "c1") if e.run_id == run_id]
    assert [e.kind for e in entries] == ["compaction", "prompt", "attempt"]
    assert entries[0].body["folded"] == {"from_position": 0, "to_position": 2, "count": 2}
    assert entries[0].body["summary"] == "S1" and entries[0].body["previous_summary"] == ""


async def test_compactions_folding_the_base_and_a_prompt_of_the_run_store_exactly_the_result(
    repo: Repository,
) -> None:
    await repo.replace_context(T, "c1", conversation(6), create=True)
    p, overflowed, answer = user("long one"), failed_attempt("overflow"), assistant("done")

    def make(ctx: Context) -> Result:
        # threshold before admission folds 2 stored messages; the first attempt overflows and
        # the overflow compaction folds the other 4 stored messages and the run's prompt.
        first = compaction(ctx.messages[:2], "S1", reason="threshold", at=0)
        second = compaction((*ctx.messages[2:], p), "S2", previous="S1", reason="overflow", at=2)
        new_ctx = ctx.model_copy(update={"summary": "S2", "messages": (answer,)})
        return result("completed", new_ctx, [p, overflowed, answer], [first, second])

    _base, res, run_id, outcome = await run_once(repo, "c1", make)
    assert outcome.stored
    loaded = await repo.load_context(T, "c1")
    assert loaded.context == res.context
    # Stored 0..5, the prompt took 6 (folded in the run, never written), the answer 7.
    assert (loaded.first_position, loaded.next_position) == (7, 8)

    entries = [e for e in await repo.list_transcript(T, "c1") if e.run_id == run_id]
    assert [(e.kind, e.failed) for e in entries] == [
        ("compaction", False),
        ("prompt", False),
        ("attempt", True),
        ("compaction", False),
        ("attempt", False),
    ]
    assert [e.body["folded"] for e in entries if e.kind == "compaction"] == [
        {"from_position": 0, "to_position": 2, "count": 2},
        {"from_position": 2, "to_position": 7, "count": 5},
    ]
    # The transcript keeps what compaction removed from the context.
    assert entries[1].body == p.model_dump(mode="json")

    # And the next run continues from the compacted state.
    _, res2, _, _ = await run_once(repo, "c1", completed_run)
    loaded = await repo.load_context(T, "c1")
    assert loaded.context == res2.context
    assert (loaded.first_position, loaded.next_position) == (7, 10)


async def test_a_manual_compaction_stores_the_compacted_context(repo: Repository) -> None:
    await repo.replace_context(T, "c1", conversation(6), create=True)

    def make(ctx: Context) -> Result:
        c = compaction(ctx.messages[:4], "S", reason="manual", at=0)
        return result(
            "completed",
            ctx.model_copy(update={"summary": "S", "messages": ctx.messages[4:]}),
            [],
            [c],
        )

    _, res, run_id, _outcome = await run_once(repo, "c1", make)
    loaded = await repo.load_context(T, "c1")
    assert loaded.context == res.context and loaded.first_position == 4
    record = await repo.get_run(T, "c1", run_id)
    assert record is not None and record.final is None
    assert [e.kind for e in await repo.list_transcript(T, "c1", after_seq=1)] == ["compaction"]


async def test_a_tool_exchange_is_transcribed_in_order(repo: Repository) -> None:
    await repo.create_conversation(T, "c1")
    call = ToolCallBlock(id="call_9", name="time_now", arguments="{}")
    p = user("what time is it?")
    asks = AssistantMessage(content=(call,), stop_reason="tool_use")
    answer = ToolResultMessage(
        tool_call_id="call_9", tool_name="time_now", content=(TextBlock(text="noon"),)
    )
    says = assistant("It is noon.")

    def make(ctx: Context) -> Result:
        return result(
            "completed",
            ctx.model_copy(update={"messages": (p, asks, answer, says)}),
            [p, asks, answer, says],
        )

    _, res, _run_id, _ = await run_once(repo, "c1", make)
    assert (await repo.load_context(T, "c1")).context == res.context
    entries = await repo.list_transcript(T, "c1")
    assert [e.kind for e in entries] == ["prompt", "attempt", "tool_result", "attempt"]
    assert [e.body for e in entries] == [m.model_dump(mode="json") for m in (p, asks, answer, says)]


async def test_many_runs_with_compactions_always_reload_as_their_result(
    repo: Repository,
) -> None:
    await repo.replace_context(T, "c1", conversation(3), create=True)
    for i in range(8):

        def make(ctx: Context, i: int = i) -> Result:
            p, a = user(f"q{i}"), assistant(f"a{i}")
            grown: tuple[AnyMessage, ...] = (*ctx.messages, p, a)
            fold = i % 3  # 0, 1 or 2 messages folded, sometimes reaching into the run
            if not fold:
                return result("completed", ctx.model_copy(update={"messages": grown}), [p, a])
            c = compaction(grown[:fold], f"S{i}", previous=ctx.summary)
            return result(
                "completed",
                ctx.model_copy(update={"summary": f"S{i}", "messages": grown[fold:]}),
                [p, a],
                [c],
            )

        _, res, _, outcome = await run_once(repo, "c1", make)
        assert outcome.stored
        assert (await repo.load_context(T, "c1")).context == res.context
    seqs = [e.seq for e in await repo.list_transcript(T, "c1", limit=1000)]
    assert seqs == list(range(1, len(seqs) + 1))


async def test_a_result_that_does_not_extend_its_base_is_still_stored_exactly(
    repo: Repository,
) -> None:
    await repo.replace_context(T, "c1", conversation(4), create=True)

    def make(ctx: Context) -> Result:
        rewritten = (user("rewritten"), *ctx.messages[1:], user("p"))
        return result("completed", ctx.model_copy(update={"messages": rewritten}), [user("p")])

    base = await repo.load_context(T, "c1")
    plan = plan_context_write(
        base.context, base.first_position, base.next_position, make(base.context)
    )
    assert plan.delete_before == base.next_position and len(plan.inserts) == 5
    _, res, _, _ = await run_once(repo, "c1", make)
    assert (await repo.load_context(T, "c1")).context == res.context


# --- listing ---------------------------------------------------------------------------------


async def test_runs_are_listed_oldest_first_in_pages(repo: Repository) -> None:
    await repo.create_conversation(T, "c1")
    ids = [(await repo.insert_run(T, "c1", base_etag='"x-1"', prompts=[])).run_id for _ in range(5)]
    page1 = await repo.list_runs(T, "c1", limit=2)
    page2 = await repo.list_runs(T, "c1", after=page1[-1].run_id, limit=2)
    page3 = await repo.list_runs(T, "c1", after=page2[-1].run_id, limit=2)
    listed = [r.run_id for r in (*page1, *page2, *page3)]
    assert sorted(listed) == sorted(ids) and len(listed) == 5
    assert [r.status for r in page1] == ["running", "running"]
    assert await repo.get_run(T, "c1", "nope") is None
    assert await repo.get_run("other-tenant", "c1", ids[0]) is None
    with pytest.raises(NotFound):
        await repo.list_runs(T, "ghost")


async def test_the_transcript_pages_by_seq(repo: Repository) -> None:
    await repo.create_conversation(T, "c1")
    for _ in range(3):
        await run_once(repo, "c1", completed_run)
    page1 = await repo.list_transcript(T, "c1", limit=4)
    page2 = await repo.list_transcript(T, "c1", after_seq=page1[-1].seq, limit=4)
    assert [e.seq for e in page1 + page2] == [1, 2, 3, 4, 5, 6]
    assert page1[0].created_at.tzinfo is not None
    with pytest.raises(NotFound):
        await repo.list_transcript(T, "ghost")


async def test_concurrent_runs_from_the_same_base_store_exactly_one(repo: Repository) -> None:
    await repo.replace_context(T, "c1", conversation(2), create=True)
    base = await repo.load_context(T, "c1")
    runs = [await repo.insert_run(T, "c1", base_etag=base.etag, prompts=[]) for _ in range(6)]
    results = [completed_run(base.context, f"q{i}", f"a{i}") for i in range(6)]
    outcomes = await asyncio.gather(
        *(
            repo.finish_run(T, "c1", run.run_id, base=base, result=res, store=True)
            for run, res in zip(runs, results, strict=True)
        )
    )
    assert sorted(o.status for o in outcomes) == ["completed"] + ["conflicted"] * 5
    winner = next(r for r, o in zip(results, outcomes, strict=True) if o.stored)
    loaded = await repo.load_context(T, "c1")
    assert loaded.context == winner.context
    assert {o.etag for o in outcomes} == {loaded.etag}
    seqs = [e.seq for e in await repo.list_transcript(T, "c1", limit=100)]
    assert seqs == list(range(1, 1 + 1 + 6 * 2))


async def test_a_run_in_flight_is_read_without_its_audit_tables(repo: Repository) -> None:
    """A queued or running run has no audit records yet (they are written in the transaction
    that ends it): reading it, alone or in a page, reads its row only; once it ended, its
    records come with it."""
    from sqlalchemy import event

    await repo.replace_context(T, "c1", conversation(2), create=True)
    base = await repo.load_context(T, "c1")
    run = await repo.insert_run(T, "c1", base_etag=base.etag, prompts=[user("p")])
    seen: list[str] = []

    def after(conn: object, cursor: object, statement: str, *args: object) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            seen.append(statement)

    engine = repo.engine.sync_engine
    event.listen(engine, "after_cursor_execute", after)
    try:
        record = await repo.get_run(T, "c1", run.run_id)
        assert record is not None and record.run.status == "running"
        assert (record.new_messages, record.final, record.compactions) == ((), None, ())
        assert len(seen) == 1 and "FROM runs" in seen[0]
        [listed] = await repo.list_run_records(T, "c1")
        assert listed == record
        res = completed_run(base.context)
        await repo.finish_run(T, "c1", run.run_id, base=base, result=res, store=True)
        seen.clear()
        record = await repo.get_run(T, "c1", run.run_id)
        assert record is not None and record.run.status == "completed"
        assert (record.new_messages, record.final) == (res.new_messages, res.final)
        assert len(seen) == 4  # the row, then its new messages, final and compactions
    finally:
        event.remove(engine, "after_cursor_execute", after)
