"""A run's events, durable: written in batches as the run goes, the last batch and
the ``run.finished`` marker in the transaction that records the run's outcome
(:meth:`~app.store.runs.RunStore.finish_run`); read in order after a sequence number; purged
after their retention in bounded batches (the run record and the transcript stay).

A row is one event; the last batch, written with the outcome, is one row for all its events
(``first_seq`` … ``seq``, :data:`EVENTS_ROW`) when the run's records, written in the same
transaction, reference every message text among them: a message event then names its text by
key inside the row, as a run's ``prompt_keys`` do, and that text lives as long as the run
record, which outlives its events. So a run that ends within the flush interval writes one
event row, not one per event (each row costs its own bindings and four B-tree inserts).
Readers expand such a row into its events; an event stored twice (a batch whose commit was
not confirmed, written again with the outcome) is read once.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Integer, and_, bindparam, delete, func, select, tuple_
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from app.agent.codec import compact_json

from ._sql import StoreBase, bound_child_key
from .columns import Dumped, dump_json
from .db import read_one, read_transaction, write_transaction
from .direct import prepared
from .errors import StoredRecordDamaged
from .tables import message_texts, run_events, run_new_messages
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
        func.min(func.coalesce(run_events.c.first_seq, run_events.c.seq)).label("first"),
        func.max(run_events.c.seq).label("last"),
    ).where(*_OF_RUN)
)
#: the texts of a run's new messages (bound: ``tenant``, ``conv_id``, ``run_id``): among them
#: every text a row of its several events names (module docstring)
_RUN_TEXTS = prepared(
    select(message_texts.c.sha256, message_texts.c.body)
    .select_from(
        run_new_messages.join(
            message_texts,
            and_(
                message_texts.c.tenant == run_new_messages.c.tenant,
                message_texts.c.sha256 == run_new_messages.c.body_sha256,
            ),
        )
    )
    .where(*bound_child_key(run_new_messages), run_new_messages.c.run_id == bindparam("run_id"))
)

#: the ``event`` of a row that holds several events (``first_seq`` … ``seq``)
EVENTS_ROW = "events"


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
    conn: AsyncConnection,
    rows: Sequence[EventRow],
    texts: TextBatch | None = None,
    referenced: Collection[str] = (),
) -> None:
    """One statement for any number of events (nothing for none); a ``message`` event
    references its message's text (in ``texts`` when given, for the caller to flush; else
    written here, one more statement when the batch holds a message).

    ``referenced``: the keys of the texts the caller's transaction makes the run's records
    reference (its new messages). When every message event's text is among them, the events
    are one row (module docstring), else a row each.

    An event already stored is left as it is: a batch whose commit was not confirmed (the
    connection broke) is written again with the outcome, and must not make it fail."""
    if not rows:
        return
    batch = texts if texts is not None else TextBatch(rows[0].tenant)
    keys = [
        batch.add(row.data) if row.event == MESSAGE_EVENT and row.data is not None else None
        for row in rows
    ]
    values: list[dict[str, Any]] | dict[str, Any]
    if len(rows) > 1 and referenced and all(k is None or k in referenced for k in keys):
        values = _one_row(rows, keys)
    else:
        values = []
        for row, key in zip(rows, keys, strict=True):
            value = row.values()
            value["data_sha256"] = key
            value["first_seq"] = None
            if key is not None:
                value["data"] = None
            values.append(value)
    stmt = _INSERT_PG if conn.dialect.name == "postgresql" else _INSERT_SQLITE
    await conn.execute(stmt, values)
    if texts is None:
        await batch.flush(conn)


def _one_row(rows: Sequence[EventRow], keys: Sequence[str | None]) -> dict[str, Any]:
    """``rows`` (of one run, in order) as one row: ``[seq, event, data]`` each, a message
    event ``[seq, "message", null, key]``; the row's ``seq`` is the last one's, its time the
    last one's (when the batch was complete)."""
    items = []
    for row, key in zip(rows, keys, strict=True):
        head = f"[{row.seq},{compact_json(row.event)},"
        items.append(f'{head}null,"{key}"]' if key is not None else f"{head}{dump_json(row.data)}]")
    last = rows[-1]
    return {
        "tenant": last.tenant,
        "conversation_id": last.conversation_id,
        "run_id": last.run_id,
        "seq": last.seq,
        "event": EVENTS_ROW,
        "data": Dumped("[" + ",".join(items) + "]"),
        "created_at": last.created_at,
        "data_sha256": None,
        "first_seq": rows[0].seq,
    }


def _items(row: RowMapping) -> list[tuple[int, str, Any, str | None]]:
    """The events a row of several events holds: ``(seq, event, data, key)``, ``key`` the
    text a message event names (its ``data`` then None); refused as damaged when the row is
    not what :func:`_one_row` writes."""
    value = load(row["data_text"], None)
    if not isinstance(value, list) or not value:
        raise StoredRecordDamaged("a row of run events does not hold a list of events")
    items = []
    for item in value:
        if (
            not isinstance(item, list)
            or len(item) not in (3, 4)
            or type(item[0]) is not int
            or not isinstance(item[1], str)
            or (len(item) == 4 and (item[2] is not None or not isinstance(item[3], str)))
        ):
            raise StoredRecordDamaged("a row of run events holds an event it cannot")
        items.append((item[0], item[1], item[2], item[3] if len(item) == 4 else None))
    return items


#: built once per dialect (a run's path pays no statement construction)
_INSERT_PG: Any = prepared(pg_insert(run_events).on_conflict_do_nothing())
_INSERT_SQLITE: Any = prepared(sqlite_insert(run_events).on_conflict_do_nothing())


def _held(rows: Sequence[RowMapping]) -> dict[int, list[tuple[int, str, Any, str | None]]]:
    """The events of each row of several events among ``rows``, by the row's ``id``."""
    return {id(row): _items(row) for row in rows if row["first_seq"] is not None}


def _event(row: RowMapping, data: Any, **fields: Any) -> EventRow:
    """An event of a row of :data:`_READ_EVENTS` (``fields``: those of one of its events)."""
    values = {k: v for k, v in row.items() if k not in ("data_text", "data_sha256", "first_seq")}
    return EventRow(**{**values, **fields}, data=data)


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
        """Up to ``limit`` events of a run with ``seq > after``, in order (the primary key;
        a row of several events is where its last one is)."""
        parameters = {
            "tenant": tenant,
            "conv_id": conv_id,
            "run_id": run_id,
            "after": after,
            "limit": limit,
        }
        rows = await read_one(self.engine, _READ_EVENTS, parameters)
        if not any(row["first_seq"] is not None for row in rows):
            return [_event(row, load(row["data_text"], row["data_sha256"])) for row in rows]
        held = _held(rows)
        needed = {key for items in held.values() for seq, _, _, key in items if key and seq > after}
        run = {"tenant": tenant, "conv_id": conv_id, "run_id": run_id}
        texts = await read_one(self.engine, _RUN_TEXTS, run) if needed else []
        found = {row["sha256"]: row["body"] for row in texts}
        if not needed <= found.keys():
            # a text gone between the two reads (the conversation deleted meanwhile?): both
            # again, in one snapshot, where a text still missing is damage
            async with read_transaction(self.engine) as conn:
                rows = list((await conn.execute(_READ_EVENTS, parameters)).mappings().all())
                texts = list((await conn.execute(_RUN_TEXTS, run)).mappings().all())
            held = _held(rows)
            found = {row["sha256"]: row["body"] for row in texts}
        events: dict[int, EventRow] = {}
        for row in rows:
            if row["first_seq"] is None:
                events.setdefault(
                    row["seq"], _event(row, load(row["data_text"], row["data_sha256"]))
                )
                continue
            for seq, name, data, key in held[id(row)]:
                if seq > after and seq not in events:
                    value = data if key is None else load(found.get(key), key)
                    events[seq] = _event(row, value, seq=seq, event=name)
        return [events[seq] for seq in sorted(events)][:limit]

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


__all__ = [
    "EVENTS_ROW",
    "PURGE_BATCH",
    "PURGE_BATCHES",
    "EventRow",
    "EventStore",
    "insert_events",
]
