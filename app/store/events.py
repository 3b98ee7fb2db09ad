"""A run's events, durable: written in batches as the run goes, the last batch and
the ``run.finished`` marker in the transaction that records the run's outcome
(:meth:`~app.store.runs.RunStore.finish_run`); read in order after a sequence number; purged
after their retention in bounded batches (the run record and the transcript stay)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Integer, bindparam, delete, func, select, tuple_
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from ._sql import StoreBase, bound_child_key
from .db import read_one, write_transaction
from .direct import prepared
from .tables import run_events
from .texts import MESSAGE_EVENT, TextBatch, collect_garbage, load, with_text

#: rows deleted per purge statement, and statements per purge at most
PURGE_BATCH = 1000
PURGE_BATCHES = 10


#: one run's events: bound parameters ``tenant``, ``conv_id``, ``run_id`` (and ``after`` and
#: ``limit`` to read them); built once, as a reader following a run reads them again and again
_OF_RUN = (*bound_child_key(run_events), run_events.c.run_id == bindparam("run_id"))
_joined, _data, _digest = with_text(run_events, "data")
_READ_EVENTS = prepared(
    select(*(c for c in run_events.c if c.name not in ("data", "data_sha256")), _data, _digest)
    .select_from(_joined)
    .where(*_OF_RUN, run_events.c.seq > bindparam("after"))
    .order_by(run_events.c.seq)
    .limit(bindparam("limit", type_=Integer))
)
_EVENT_BOUNDS = prepared(
    select(
        func.min(run_events.c.seq).label("first"), func.max(run_events.c.seq).label("last")
    ).where(*_OF_RUN)
)


@dataclass(frozen=True)
class EventRow:
    """One stored event of a run (``data`` is ``None`` for ``run.finished``)."""

    tenant: str
    conversation_id: str
    run_id: str
    seq: int
    event: str
    data: Any
    created_at: datetime

    def values(self) -> dict[str, Any]:
        return {
            "tenant": self.tenant,
            "conversation_id": self.conversation_id,
            "run_id": self.run_id,
            "seq": self.seq,
            "event": self.event,
            "data": self.data,
            "created_at": self.created_at,
        }


async def insert_events(
    conn: AsyncConnection, rows: Sequence[EventRow], texts: TextBatch | None = None
) -> None:
    """One multi-row statement for any number of events (nothing for none); a ``message``
    event references its message's text (in ``texts`` when given, for the caller to flush;
    else written here, one more statement when the batch holds a message).

    An event already stored is left as it is: a batch whose commit was not confirmed (the
    connection broke) is written again with the outcome, and must not make it fail."""
    if not rows:
        return
    batch = texts if texts is not None else TextBatch(rows[0].tenant)
    values = []
    for row in rows:
        value = row.values()
        if row.event == MESSAGE_EVENT and row.data is not None:
            value["data_sha256"] = batch.add(row.data)
            value["data"] = None
        else:
            value["data_sha256"] = None
        values.append(value)
    stmt = _INSERT_PG if conn.dialect.name == "postgresql" else _INSERT_SQLITE
    await conn.execute(stmt, values)
    if texts is None:
        await batch.flush(conn)


#: built once per dialect (a run's path pays no statement construction)
_INSERT_PG: Any = prepared(pg_insert(run_events).on_conflict_do_nothing())
_INSERT_SQLITE: Any = prepared(sqlite_insert(run_events).on_conflict_do_nothing())


class EventStore(StoreBase):
    async def append_events(self, rows: Sequence[EventRow]) -> None:
        """A batch of a running run's events, in one short transaction."""
        if not rows:
            return
        async with write_transaction(self.engine) as conn:
            await insert_events(conn, rows)

    async def read_events(
        self, tenant: str, conv_id: str, run_id: str, *, after: int, limit: int
    ) -> list[EventRow]:
        """Up to ``limit`` events of a run with ``seq > after``, in order (the primary key)."""
        rows = await read_one(
            self.engine,
            _READ_EVENTS,
            {
                "tenant": tenant,
                "conv_id": conv_id,
                "run_id": run_id,
                "after": after,
                "limit": limit,
            },
        )
        return [
            EventRow(
                **{k: v for k, v in row.items() if k not in ("data_text", "data_sha256")},
                data=load(row["data_text"], row["data_sha256"]),
            )
            for row in rows
        ]

    async def event_bounds(self, tenant: str, conv_id: str, run_id: str) -> tuple[int, int] | None:
        """The first and last stored ``seq`` of a run (``None`` when none is stored)."""
        [row] = await read_one(
            self.engine, _EVENT_BOUNDS, {"tenant": tenant, "conv_id": conv_id, "run_id": run_id}
        )
        if row["first"] is None:
            return None
        return int(row["first"]), int(row["last"])

    async def purge_events(self, retention_seconds: float) -> int:
        """Delete events written more than ``retention_seconds`` ago, oldest first, at most
        ``PURGE_BATCH`` rows a statement and ``PURGE_BATCHES`` statements a call (the rest
        waits for the next call). Returns how many were deleted."""
        cutoff = self.clock.now() - timedelta(seconds=retention_seconds)
        key = tuple_(
            run_events.c.tenant,
            run_events.c.conversation_id,
            run_events.c.run_id,
            run_events.c.seq,
        )
        deleted = 0
        for _ in range(PURGE_BATCHES):
            batch = (
                select(
                    run_events.c.tenant,
                    run_events.c.conversation_id,
                    run_events.c.run_id,
                    run_events.c.seq,
                )
                .where(run_events.c.created_at < cutoff)
                .order_by(run_events.c.created_at)
                .limit(PURGE_BATCH)
            )
            async with write_transaction(self.engine) as conn:
                done = (
                    await conn.execute(
                        delete(run_events)
                        .where(key.in_(batch))
                        .returning(run_events.c.tenant, run_events.c.data_sha256)
                    )
                ).all()
                # the texts only these events referenced (those of an unfinished run)
                texts: dict[str, set[str]] = {}
                for tenant, digest in done:
                    if digest is not None:
                        texts.setdefault(tenant, set()).add(digest)
                for tenant, digests in texts.items():
                    await collect_garbage(conn, tenant, digests)
            count = len(done)
            deleted += count
            if count < PURGE_BATCH:
                break
        return deleted


__all__ = ["PURGE_BATCH", "PURGE_BATCHES", "EventRow", "EventStore", "insert_events"]
