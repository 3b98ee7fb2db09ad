"""What runs leave behind, read back: run records with their audit rows (new messages, final,
compactions) and the append-only transcript (contract §4)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Integer, Table, and_, bindparam, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.agent.codec import (
    dump_messages,
    dumps_message,
    dumps_messages_json,
    load_message,
)
from app.agent.messages import AnyMessage, AssistantMessage
from app.agent.records import Compaction, Result

from ._sql import StoreBase, bound_child_key, child_key, require_conversation
from .db import read_one, read_transaction, write_transaction
from .direct import prepared
from .errors import StoredRecordDamaged
from .tables import (
    Dumped,
    Run,
    TranscriptEntry,
    run_compactions,
    run_finals,
    run_new_messages,
    runs,
    transcript,
)
from .texts import (
    MESSAGE_KINDS,
    TextBatch,
    load,
    run_of,
    select_runs,
    select_transcript,
    transcript_entry,
    with_text,
)


@dataclass(frozen=True)
class RunRecord:
    """A run row with its audit records decoded."""

    run: Run
    new_messages: tuple[AnyMessage, ...]
    final: AssistantMessage | None
    compactions: tuple[Compaction, ...]


#: the statuses of a run that has no audit records yet: they are written in the transaction
#: that ends it (app/store/outcomes.py), and an import brings finished runs only
_M = TypeVar("_M")

IN_FLIGHT = ("queued", "running")


def _one_run(table: Table) -> list[ColumnElement[bool]]:
    """The rows of one run in ``table``, by bound parameters ``tenant``, ``conv_id`` and
    ``run_id``."""
    return [*bound_child_key(table), table.c.run_id == bindparam("run_id")]


def _of_runs(tenant: str, conv_id: str, ids: Sequence[str]) -> Callable[[Table], Any]:
    """The rows of these runs in a table (a page of them)."""

    def of(table: Table) -> list[ColumnElement[bool]]:
        return [*child_key(table, tenant, conv_id), table.c.run_id.in_(list(ids))]

    return of


def _audit_reads(of: Callable[[Table], list[ColumnElement[bool]]]) -> tuple[Any, Any, Any]:
    """The three reads of runs' audit records (new messages, finals, compactions), their rows
    chosen by ``of``."""
    new_from, new_text, new_key = with_text(run_new_messages)
    final_from, final_text, final_key = with_text(run_finals)
    return (
        select(run_new_messages.c.run_id, new_text, new_key)
        .select_from(new_from)
        .where(*of(run_new_messages))
        .order_by(run_new_messages.c.run_id, run_new_messages.c.seq),
        select(run_finals.c.run_id, final_text, final_key)
        .select_from(final_from)
        .where(*of(run_finals)),
        select(run_compactions)
        .where(*of(run_compactions))
        .order_by(run_compactions.c.run_id, run_compactions.c.seq),
    )


#: one run's reads, built once (a reader polling a run, following its events or fetching a
#: /v1 response pays no statement construction): its row, per dialect (its prompts' texts are
#: gathered by each dialect's own aggregate), its status alone, and its audit records
_ONE_RUN_AUDIT = tuple(prepared(read) for read in _audit_reads(_one_run))
_RUN_STATUS = prepared(select(runs.c.status).where(*_one_run(runs)))


#: a page of a conversation's transcript after a ``seq``: bound parameters ``tenant``,
#: ``conv_id``, ``after`` and ``limit``
_TRANSCRIPT_PAGE = prepared(
    select_transcript()
    .where(*bound_child_key(transcript), transcript.c.seq > bindparam("after"))
    .order_by(transcript.c.seq)
    .limit(bindparam("limit", type_=Integer))
)


@cache
def _one_run_row(dialect: str) -> Any:
    return prepared(select_runs(dialect).where(*_one_run(runs)))


@cache
def _found_run(dialect: str) -> Any:
    """A tenant's run by its id alone (a /v1 response's), by ``tenant`` and ``run_id``."""
    return prepared(
        select_runs(dialect).where(
            runs.c.tenant == bindparam("tenant"), runs.c.run_id == bindparam("run_id")
        )
    )


class RecordStore(StoreBase):
    async def get_run(self, tenant: str, conv_id: str, run_id: str) -> RunRecord | None:
        """A run with its new messages, final and compactions: one statement for a run in
        flight, four for one that ended."""
        key = {"tenant": tenant, "conv_id": conv_id, "run_id": run_id}
        async with read_transaction(self.engine) as conn:
            row = (await conn.execute(_one_run_row(conn.dialect.name), key)).mappings().first()
            if row is None:
                return None
            [record] = await _records(conn, tenant, conv_id, [run_of(row)])
        return record

    async def run_status(self, tenant: str, conv_id: str, run_id: str) -> str | None:
        """A run's status alone (None: no such run), in one statement: what a reader following
        a run's events reads each time it finds none new."""
        rows = await read_one(
            self.engine, _RUN_STATUS, {"tenant": tenant, "conv_id": conv_id, "run_id": run_id}
        )
        return str(rows[0]["status"]) if rows else None

    async def recent_run_durations(self, tenant: str, conv_id: str, *, limit: int) -> list[float]:
        """Seconds each of the conversation's last ``limit`` finished runs took (one read on
        ``ix_runs_conversation_created``)."""
        rows = await read_one(
            self.engine,
            select(runs.c.created_at, runs.c.finished_at)
            .where(*child_key(runs, tenant, conv_id), runs.c.finished_at.is_not(None))
            .order_by(runs.c.created_at.desc())
            .limit(limit),
        )
        return [
            (row["finished_at"] - row["created_at"]).total_seconds()
            for row in rows
            if row["finished_at"] is not None and row["created_at"] is not None
        ]

    async def list_runs(
        self, tenant: str, conv_id: str, *, after: str | None = None, limit: int = 50
    ) -> list[Run]:
        """A page of a conversation's runs, oldest first, starting after the run ``after``."""
        stmt = select_runs(self.engine.dialect.name).where(*child_key(runs, tenant, conv_id))
        if after is not None:
            cursor = (
                select(runs.c.created_at)
                .where(*child_key(runs, tenant, conv_id), runs.c.run_id == after)
                .scalar_subquery()
            )
            stmt = stmt.where(
                or_(
                    runs.c.created_at > cursor,
                    and_(runs.c.created_at == cursor, runs.c.run_id > after),
                )
            )
        stmt = stmt.order_by(runs.c.created_at, runs.c.run_id).limit(limit)
        async with read_transaction(self.engine) as conn:
            await require_conversation(conn, tenant, conv_id)
            rows = (await conn.execute(stmt)).mappings().all()
        return [run_of(row) for row in rows]

    async def list_run_records(
        self, tenant: str, conv_id: str, *, after: str | None = None, limit: int = 50
    ) -> list[RunRecord]:
        """A page of runs (as :meth:`list_runs`) with their audit records, in four queries."""
        page = await self.list_runs(tenant, conv_id, after=after, limit=limit)
        async with read_transaction(self.engine) as conn:
            return await _records(conn, tenant, conv_id, page)

    async def list_transcript(
        self, tenant: str, conv_id: str, *, after_seq: int = 0, limit: int = 100
    ) -> list[TranscriptEntry]:
        """A page of the transcript, by ``seq``, starting after ``after_seq``."""
        key = {"tenant": tenant, "conv_id": conv_id, "after": after_seq, "limit": limit}
        async with read_transaction(self.engine) as conn:
            await require_conversation(conn, tenant, conv_id)
            rows = (await conn.execute(_TRANSCRIPT_PAGE, key)).mappings().all()
        return [transcript_entry(row) for row in rows]

    # --- the transcript's messages, as the /v1 surface lists them (its items) ---------------

    async def find_run(self, tenant: str, run_id: str) -> Run | None:
        """The tenant's run of this id, whatever its conversation (``ix_runs_run_id``)."""
        rows = await read_one(
            self.engine,
            _found_run(self.engine.dialect.name),
            {"tenant": tenant, "run_id": run_id},
        )
        return run_of(rows[0]) if rows else None

    async def record_of(self, tenant: str, run: Run) -> RunRecord:
        """The record of a run already read (:meth:`find_run`): its audit records, read now
        (none while it was queued or running when read)."""
        async with read_transaction(self.engine) as conn:
            [record] = await _records(conn, tenant, run.conversation_id, [run])
        return record

    async def delete_response(self, tenant: str, run_id: str) -> bool:
        """Mark the tenant's run ``run_id`` deleted as a response, unless it is queued or
        running; False when nothing was marked (not found, deleted already, or in flight)."""
        r = runs.c
        async with write_transaction(self.engine) as conn:
            done = await conn.execute(
                update(runs)
                .where(
                    r.tenant == tenant,
                    r.run_id == run_id,
                    r.response_deleted_at.is_(None),
                    r.status.not_in(IN_FLIGHT),
                )
                .values(response_deleted_at=self.clock.now())
            )
        return bool(done.rowcount)

    async def run_message_entries(
        self, tenant: str, conv_id: str, run_ids: Sequence[str]
    ) -> list[TranscriptEntry]:
        """The transcript entries holding the messages of these runs, by ``seq``: one per
        message of each run's ``new_messages``, in their order."""
        if not run_ids:
            return []
        stmt = (
            select_transcript()
            .where(
                *child_key(transcript, tenant, conv_id),
                transcript.c.run_id.in_(list(run_ids)),
                transcript.c.kind.in_(MESSAGE_KINDS),
            )
            .order_by(transcript.c.seq)
        )
        async with read_transaction(self.engine) as conn:
            await require_conversation(conn, tenant, conv_id)
            rows = (await conn.execute(stmt)).mappings().all()
        return [transcript_entry(row) for row in rows]

    async def deleted_items(self, tenant: str, conv_id: str) -> set[str]:
        """The ids of the /v1 items deleted from the conversation (its ``item_deleted``
        entries)."""
        stmt = select(transcript.c.body).where(
            *child_key(transcript, tenant, conv_id), transcript.c.kind == "item_deleted"
        )
        async with read_transaction(self.engine) as conn:
            bodies = (await conn.execute(stmt)).scalars().all()
        found: set[str] = set()
        for body in bodies:
            found.update(str(i) for i in (body or {}).get("items", []))
        return found

    async def message_entries(
        self,
        tenant: str,
        conv_id: str,
        *,
        from_seq: int | None = None,
        descending: bool = False,
        limit: int = 100,
    ) -> list[TranscriptEntry]:
        """A page of the transcript's message entries, by ``seq`` (descending: newest first),
        from ``from_seq`` on (inclusive; None: from the start, or the end)."""
        stmt = select_transcript().where(
            *child_key(transcript, tenant, conv_id), transcript.c.kind.in_(MESSAGE_KINDS)
        )
        if from_seq is not None:
            bound = transcript.c.seq <= from_seq if descending else transcript.c.seq >= from_seq
            stmt = stmt.where(bound)
        order = transcript.c.seq.desc() if descending else transcript.c.seq
        stmt = stmt.order_by(order).limit(limit)
        async with read_transaction(self.engine) as conn:
            await require_conversation(conn, tenant, conv_id)
            rows = (await conn.execute(stmt)).mappings().all()
        return [transcript_entry(row) for row in rows]


async def _records(
    conn: AsyncConnection, tenant: str, conv_id: str, page: Sequence[Run]
) -> list[RunRecord]:
    """The audit records of a page of runs: one query per audit table, none when every run of
    the page is still queued or running (:data:`IN_FLIGHT`)."""
    ids = [run.run_id for run in page if run.status not in IN_FLIGHT]
    if not ids:
        return [RunRecord(run=run, new_messages=(), final=None, compactions=()) for run in page]
    if len(ids) == 1:  # one run: the statements built once
        reads, key = _ONE_RUN_AUDIT, {"tenant": tenant, "conv_id": conv_id, "run_id": ids[0]}
    else:
        reads, key = _audit_reads(_of_runs(tenant, conv_id, ids)), None
    new_read, final_read, compaction_read = reads
    new_rows = (await conn.execute(new_read, key)).all()
    final_rows = (await conn.execute(final_read, key)).all()
    compaction_rows = (await conn.execute(compaction_read, key)).mappings().all()
    new_messages: dict[str, list[AnyMessage]] = {run.run_id: [] for run in page}
    for row in new_rows:
        new_messages[row.run_id].append(load_message(load(row.body_text, row.body_sha256)))
    finals: dict[str, AssistantMessage] = {}
    for row in final_rows:
        final = load_message(load(row.body_text, row.body_sha256))
        assert isinstance(final, AssistantMessage)
        finals[row.run_id] = final
    for run in page:  # a final named among the run's new messages (runs.final_seq)
        if run.final_seq is not None and run.run_id not in finals:
            finals[run.run_id] = _final_at(new_messages[run.run_id], run.final_seq)
    compactions: dict[str, list[Compaction]] = {run.run_id: [] for run in page}
    for c in compaction_rows:
        compactions[c["run_id"]].append(
            Compaction.model_validate(
                {
                    "reason": c["reason"],
                    "folded": c["folded"],
                    "previous_summary": c["previous_summary"],
                    "summary": c["summary"],
                    "tokens_before": c["tokens_before"],
                    "tokens_after": c["tokens_after"],
                    "usage": c["usage"],
                    "at": c["at"],
                }
            )
        )
    return [
        RunRecord(
            run=run,
            new_messages=tuple(new_messages[run.run_id]),
            final=finals.get(run.run_id),
            compactions=tuple(compactions[run.run_id]),
        )
        for run in page
    ]


def named_final(messages: Sequence[_M], seq: int, is_attempt: Callable[[_M], bool]) -> _M:
    """The final a run row names among its new messages (``runs.final_seq``), as decoded
    messages or as their JSON values (the export); damaged when it is not an attempt."""
    final = messages[seq] if 0 <= seq < len(messages) else None
    if final is None or not is_attempt(final):
        raise StoredRecordDamaged(f"its final names new message {seq}, which is not an attempt")
    return final


def _final_at(messages: Sequence[AnyMessage], seq: int) -> AssistantMessage:
    final = named_final(messages, seq, lambda m: isinstance(m, AssistantMessage))
    assert isinstance(final, AssistantMessage)
    return final


async def dumped_folded(result: Result) -> list[Dumped]:
    """The JSON text of each compaction's folded messages, for :func:`insert_audit`: built
    before the write transaction, a few hundred messages per call with the event loop
    running between them (a compaction of a long context folds thousands; one
    ``json.dumps`` of them all would stall the loop for tens of milliseconds)."""
    return [Dumped((await dumps_messages_json(c.folded)).decode()) for c in result.compactions]


#: built once (a run's path pays no statement construction)
_INSERT_NEW_MESSAGES = prepared(insert(run_new_messages))
_INSERT_FINAL = prepared(insert(run_finals))
_INSERT_COMPACTIONS = prepared(insert(run_compactions))


def final_among_new(result: Result) -> int | None:
    """Where ``result.final`` is among ``result.new_messages`` (its index, the ``seq`` of its
    row): the run's last attempt, so searched from the end; None when it has none, or it is
    not there."""
    final = result.final
    if final is None:
        return None
    for i in range(len(result.new_messages) - 1, -1, -1):
        if result.new_messages[i] is final:
            return i
    return None


async def insert_audit(
    conn: AsyncConnection,
    tenant: str,
    conv_id: str,
    run_id: str,
    result: Result,
    folded: Sequence[Dumped] | None = None,
    texts: TextBatch | None = None,
    *,
    final_seq: int | None = None,
) -> frozenset[str]:
    """A finished run's audit records: its new messages, final and compactions (``folded``:
    :func:`dumped_folded` of ``result``, when the caller has it). The messages' texts go into
    ``texts`` when given (the caller flushes it), else are written here. The keys of the texts
    its new messages reference (they live as long as the run record).

    ``final_seq``: where the final is among the new messages (:func:`final_among_new`), which
    the run row says (``runs.final_seq``): then it has no row of its own."""
    key = {"tenant": tenant, "conversation_id": conv_id, "run_id": run_id}
    batch = texts if texts is not None else TextBatch(tenant)
    keys = [batch.add(Dumped(dumps_message(m))) for m in result.new_messages]
    if keys:
        await conn.execute(
            _INSERT_NEW_MESSAGES,
            [{**key, "seq": i, "body": None, "body_sha256": k} for i, k in enumerate(keys)],
        )
    if result.final is not None and final_seq is None:
        final = Dumped(dumps_message(result.final))
        await conn.execute(_INSERT_FINAL, {**key, "body": None, "body_sha256": batch.add(final)})
    if texts is None:
        await batch.flush(conn)
    if result.compactions:
        await conn.execute(
            _INSERT_COMPACTIONS,
            [
                {
                    **key,
                    "seq": i,
                    "reason": c.reason,
                    "previous_summary": c.previous_summary,
                    "summary": c.summary,
                    "folded": folded[i] if folded is not None else dump_messages(c.folded),
                    "tokens_before": c.tokens_before,
                    "tokens_after": c.tokens_after,
                    "usage": c.usage.model_dump(mode="json"),
                    "at": c.at,
                }
                for i, c in enumerate(result.compactions)
            ],
        )
    return frozenset(keys)


__all__ = [
    "RecordStore",
    "RunRecord",
    "dumped_folded",
    "final_among_new",
    "insert_audit",
    "named_final",
]
