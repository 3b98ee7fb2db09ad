"""Every stored version of a context is reconstructible (app/store/versions.py): after any
sequence of runs, compactions and replaces, the context read at each listed version is, byte
for byte, what was served at that version; versions past the retention are swept (rows and
texts no kept version needs go with them) and answer 410, versions never written 404."""

from __future__ import annotations

import asyncio
import itertools
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Table, func, select

from app.agent.messages import Context
from app.clock import ManualClock
from app.store.db import make_engine
from app.store.tables import context_messages, message_texts
from app.store.versions import VersionExpired, VersionNotFound
from tests.repository import Repository

from .builders import assistant, compaction, completed_run, result, user

T = "acme"
_ids = itertools.count()

#: one write of the context: a run that appends, a run that compacts first, a replace
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("run"), st.integers(0, 3)),
        st.tuples(st.just("compact"), st.integers(1, 4)),
        st.tuples(st.just("replace"), st.integers(0, 4)),
    ),
    min_size=1,
    max_size=8,
)


async def served(repo: Repository, conv: str) -> tuple[int, bytes]:
    rows = await repo.load_context_rows(T, conv)
    return rows.conversation.version, rows.context_json()


async def write(repo: Repository, conv: str, op: str, n: int, step: int) -> None:
    base = await repo.load_context(T, conv)
    if op == "replace":
        messages = tuple(
            m for i in range(n) for m in (user(f"r{step}.{i}"), assistant(f"a{step}.{i}"))
        )
        ctx = Context(system_prompt=f"sys {step % 2}", summary="", messages=messages)
        await repo.replace_context(T, conv, ctx, if_match=base.etag)
        return
    run = await repo.insert_run(T, conv, base_etag=base.etag, prompts=[user(f"p{step}")])
    if op == "compact" and base.context.messages:
        k = min(n, len(base.context.messages))
        p, a = user(f"p{step}"), assistant(f"s{step}")
        kept = base.context.messages[k:]
        ctx = base.context.model_copy(update={"summary": f"sum {step}", "messages": (*kept, p, a)})
        res = result("completed", ctx, [p, a], [compaction(base.context.messages[:k], ctx.summary)])
    else:
        res = completed_run(base.context, f"p{step}", f"a{step}")
    outcome = await repo.finish_run(T, conv, run.run_id, base=base, result=res, store=True)
    assert outcome.stored


async def check_every_version(url: str, ops: list[tuple[str, int]]) -> None:
    engine = make_engine(url)
    try:
        repo = Repository(engine)
        conv = f"v{next(_ids)}"
        await repo.create_conversation(T, conv, "sys 0")
        seen = dict([await served(repo, conv)])
        for step, (op, n) in enumerate(ops):
            await write(repo, conv, op, n, step)
            version, body = await served(repo, conv)
            seen[version] = body
        listed = await repo.list_versions(T, conv, limit=100)
        assert [v.version for v in listed] == sorted(seen, reverse=True)
        for version, body in seen.items():
            assert (await repo.load_version_rows(T, conv, version)).context_json() == body
    finally:
        await engine.dispose()


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(ops=OPS)
def test_every_listed_version_reads_as_it_was_served(
    database_url: str, ops: list[tuple[str, int]]
) -> None:
    asyncio.run(check_every_version(database_url, ops))


async def count(repo: Repository, table: Table) -> int:
    async with repo.engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(table))).scalar_one())


async def test_old_versions_are_swept_with_the_rows_and_texts_only_they_held(
    database_url: str,
) -> None:
    clock = ManualClock()
    eng = make_engine(database_url)
    try:
        repo = Repository(eng, clock)
        await repo.create_conversation(T, "c", "S")
        for step in range(2):
            await write(repo, "c", "run", 0, step)
        await write(repo, "c", "replace", 1, 9)  # version 4: one new exchange
        assert await count(repo, context_messages) == 4 + 2
        texts = await count(repo, message_texts)

        clock.advance(timedelta(hours=2).total_seconds())
        await write(repo, "c", "run", 0, 10)  # version 5, written after the others
        assert await repo.sweep_old_versions(seconds=3600, batch=100) == 4
        assert [v.version for v in await repo.list_versions(T, "c")] == [5]
        # the rows only versions 1-4 held are gone, and their texts with them (the run
        # records still hold theirs)
        assert await count(repo, context_messages) == 2 + 2
        assert await count(repo, message_texts) <= texts + 2
        with pytest.raises(VersionExpired):
            await repo.load_version_rows(T, "c", 2)
        with pytest.raises(VersionNotFound):
            await repo.load_version_rows(T, "c", 6)
        body = (await repo.load_version_rows(T, "c", 5)).context_json()
        assert body == (await served(repo, "c"))[1]
    finally:
        await eng.dispose()
