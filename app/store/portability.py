"""Export and import of a whole conversation (docs/conversations.md, "Export and import").

Export reads in pages inside ONE read transaction (a consistent snapshot), yielding the parts
of the document as it goes, so a conversation of any length is never held whole in memory.
Import writes everything in one write transaction: all of it, or nothing.

The document's parts, as plain JSON values (the API validates their shape):

- ``conversation``: ``id``, ``metadata``, ``expires_at``, ``created_at``, ``updated_at``,
  ``version`` (of the ETag), ``etag``;
- ``context``: ``system_prompt``, ``summary``, ``messages`` (codec form);
- ``transcript``: entries ``seq, run_id, kind, failed, body, created_at``;
- ``runs``: run rows (without lease bookkeeping) with ``new_messages``, ``final`` and
  ``compactions``.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from app.etag import version_etag

from ._sql import (
    ContextStats,
    DumpedContext,
    StoreBase,
    child_key,
    insert_messages,
    read_conversation,
    read_joined,
)
from .changes import last_batch_of_bodies, stored_pending
from .columns import dump_json
from .db import read_transaction, write_transaction
from .errors import AlreadyExists, StoreError, conversation_not_found
from .metadata import read_metadata, write_metadata
from .records import named_final
from .tables import (
    context_messages,
    conversations,
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
    prompt_keys,
    run_of,
    select_runs,
    select_transcript,
    with_text,
)
from .versions import insert_version, version_row

#: rows read per page while exporting
EXPORT_PAGE = 500

#: the run columns an export carries (lease bookkeeping is the running process's, not history)
RUN_FIELDS = (
    "run_id",
    "status",
    "stored",
    "on_failure",
    "agent",
    "base_etag",
    "result_etag",
    "prompts",
    "usage",
    "error",
    "created_at",
    "finished_at",
    "cancel_requested",
)
COMPACTION_FIELDS = (
    "reason",
    "previous_summary",
    "summary",
    "folded",
    "tokens_before",
    "tokens_after",
    "usage",
)
TRANSCRIPT_FIELDS = ("seq", "run_id", "kind", "failed", "body", "created_at")


class RunInFlight(StoreError):
    """The conversation has a run in flight: its export would not be a finished state."""

    slug = "run-in-progress"
    status = 409

    def __init__(self, active_run_id: str) -> None:
        super().__init__(
            f"run {active_run_id} is in progress on this conversation; export it when it ends",
            headers={"Retry-After": "1"},
            active_run_id=active_run_id,
        )


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


async def _paged(
    conn: AsyncConnection, table: Any, tenant: str, conv_id: str, key: str, base: Any = None
) -> AsyncIterator[Any]:
    """Rows of one child table by ``key``, a page at a time (keyset); ``base``: the
    ``SELECT`` of the rows (all columns of ``table`` when None)."""
    column = table.c[key]
    after: Any = None
    while True:
        first: Any = select(table) if base is None else base
        stmt = first.where(*child_key(table, tenant, conv_id))
        if after is not None:
            stmt = stmt.where(column > after)
        rows = (await conn.execute(stmt.order_by(column).limit(EXPORT_PAGE))).mappings().all()
        for row in rows:
            yield row
        if len(rows) < EXPORT_PAGE:
            return
        after = rows[-1][key]


class PortabilityStore(StoreBase):
    async def export_parts(self, tenant: str, conv_id: str) -> AsyncIterator[tuple[str, Any]]:
        """The document as ``(part, value)`` pairs, in order: ``("conversation", {...})``,
        ``("context", {system_prompt, summary})``, then ``("message", body)`` each,
        ``("transcript", entry)`` each, ``("run", record)`` each.

        Raises before the first part when the conversation does not exist (404), has a run
        in flight (409) or a damaged message (409 ``stored-data-damaged``), so an HTTP answer
        can still be a problem.
        """
        conn_cm = read_transaction(self.engine)
        conn = await conn_cm.__aenter__()
        try:
            conv = await read_conversation(conn, tenant, conv_id)
            if conv is None:
                raise conversation_not_found(conv_id)
            if conv.active_run_id is not None:
                raise RunInFlight(conv.active_run_id)
            # its messages checked before anything is sent (app/store/integrity.py): the
            # context is bounded (GET context sends it whole), its texts read joined, once
            await read_joined(conn, conv)
            metadata = (await read_metadata(conn, tenant, [conv_id]))[conv_id]
        except BaseException:
            await conn_cm.__aexit__(None, None, None)
            raise
        return self._export(conn_cm, conn, conv, metadata)

    async def _export(
        self, conn_cm: Any, conn: AsyncConnection, conv: Any, metadata: dict[str, str]
    ) -> AsyncIterator[tuple[str, Any]]:
        tenant, conv_id = conv.tenant, conv.id
        try:
            yield (
                "conversation",
                {
                    "id": conv.id,
                    "metadata": metadata,
                    "expires_at": _time(conv.expires_at),
                    "created_at": _time(conv.created_at),
                    "updated_at": _time(conv.updated_at),
                    "version": conv.version,
                    "etag": conv.etag,
                },
            )
            yield "context", {"system_prompt": conv.system_prompt, "summary": conv.summary}
            joined, text, digest = with_text(context_messages)
            first = conv.next_position - conv.message_count  # the rows below: older versions
            messages = (
                select(context_messages.c.position, text, digest)
                .select_from(joined)
                .where(context_messages.c.position >= first)
            )
            async for row in _paged(conn, context_messages, tenant, conv_id, "position", messages):
                yield "message", load(row["body_text"], row["body_sha256"])
            entries = select_transcript()
            async for row in _paged(conn, transcript, tenant, conv_id, "seq", entries):
                entry = {f: row[f] for f in TRANSCRIPT_FIELDS if f != "body"}
                entry["body"] = load(row["body_text"], row["body_sha256"])
                entry["created_at"] = _time(row["created_at"])
                yield "transcript", entry
            listed = select_runs(conn.dialect.name)
            async for row in _paged(conn, runs, tenant, conv_id, "run_id", listed):
                yield "run", await _run_record(conn, tenant, conv_id, row)
        finally:
            await conn_cm.__aexit__(None, None, None)

    async def import_conversation(
        self,
        tenant: str,
        conv_id: str,
        document: Mapping[str, Any],
        *,
        max_bytes: int | None = None,
    ) -> str:
        """Write a validated export document under ``conv_id`` in one transaction; its ETag.

        The conversation gets a new incarnation (ETags never repeat) with the document's
        version; ``updated_at`` is the time of the import. :class:`AlreadyExists` when the id
        is taken; :class:`LimitExceeded` when its context as stored would be larger than
        ``max_bytes``; then nothing is written.
        """
        now = self.clock.now()
        conv = document["conversation"]
        context = document["context"]
        messages: Sequence[dict[str, Any]] = context["messages"]
        dumped = DumpedContext.of(
            context["system_prompt"],
            context["summary"],
            [dump_json(m) for m in messages],
        )
        dumped.check(max_bytes, "the imported context")
        entries: Sequence[dict[str, Any]] = document["transcript"]
        incarnation = uuid.uuid4().hex
        version = int(conv["version"])
        values = {
            "tenant": tenant,
            "id": conv_id,
            "incarnation": incarnation,
            "version": version,
            "system_prompt": context["system_prompt"],
            "summary": context["summary"],
            "next_position": len(messages),
            "message_count": len(messages),
            "transcript_seq": max((e["seq"] for e in entries), default=0),
            "created_at": conv["created_at"],
            "updated_at": now,
            "active_run_id": None,
            "expires_at": conv.get("expires_at"),
            # no tally (the first read counts it); the pending calls of the document's
            # context from its last batch alone
            **ContextStats(
                None, dumped.size, stored_pending(last_batch_of_bodies(messages))
            ).columns(),
        }
        async with write_transaction(self.engine) as conn:
            try:
                await conn.execute(insert(conversations).values(values))
            except IntegrityError:
                raise AlreadyExists(f"conversation {conv_id!r} already exists") from None
            key = {"tenant": tenant, "conversation_id": conv_id}
            texts = TextBatch(tenant)  # the texts of its run records and transcript
            await write_metadata(conn, tenant, conv_id, conv.get("metadata") or {})
            if messages:
                await insert_messages(conn, tenant, conv_id, dumped.rows(), texts)
            for run in document["runs"]:
                # its prompts referenced when its new messages hold them (app/store/texts.py)
                keys = prompt_keys(run["prompts"], (texts.add(m) for m in run["new_messages"]))
                row = {
                    **key,
                    **{f: run[f] for f in RUN_FIELDS},
                    "started_at": run["created_at"],  # the format does not carry it
                    "lease_owner": None,
                    "lease_expires_at": None,
                }
                if keys is not None:
                    row.update(prompts=[], prompt_keys=keys)
                await conn.execute(insert(runs).values(**row))
                run_key = {**key, "run_id": run["run_id"]}
                if run["new_messages"]:
                    await conn.execute(
                        insert(run_new_messages),
                        [
                            {**run_key, "seq": i, "body": None, "body_sha256": texts.add(m)}
                            for i, m in enumerate(run["new_messages"])
                        ],
                    )
                if run["final"] is not None:
                    await conn.execute(
                        insert(run_finals).values(
                            **run_key, body=None, body_sha256=texts.add(run["final"])
                        )
                    )
                if run["compactions"]:
                    await conn.execute(
                        insert(run_compactions),
                        [
                            {**run_key, "seq": i, **{f: c[f] for f in COMPACTION_FIELDS}}
                            for i, c in enumerate(run["compactions"])
                        ],
                    )
            if entries:
                await conn.execute(
                    insert(transcript),
                    [
                        {**key, **{f: e[f] for f in TRANSCRIPT_FIELDS}, "body_sha256": None}
                        if e["kind"] not in MESSAGE_KINDS
                        else {
                            **key,
                            **{f: e[f] for f in TRANSCRIPT_FIELDS},
                            "body": None,
                            "body_sha256": texts.add(e["body"]),
                        }
                        for e in entries
                    ],
                )
            await insert_version(
                conn,
                version_row(
                    tenant,
                    conv_id,
                    version,
                    next_position=len(messages),
                    message_count=len(messages),
                    system_prompt=context["system_prompt"],
                    summary=context["summary"],
                    cause="imported",
                    now=now,
                    texts=texts,
                ),
            )
            await texts.flush(conn)
        return version_etag(incarnation, version)


async def _run_record(conn: AsyncConnection, tenant: str, conv_id: str, row: Any) -> dict[str, Any]:
    run_id = row["run_id"]
    record = {f: row[f] for f in RUN_FIELDS}
    record["prompts"] = run_of(row).prompts
    record["created_at"] = _time(row["created_at"])
    record["finished_at"] = _time(row["finished_at"])

    def of(table: Any) -> Any:
        return select(table).where(*child_key(table, tenant, conv_id), table.c.run_id == run_id)

    def texts_of(table: Any) -> Any:
        joined, text, digest = with_text(table)
        return (
            select(text, digest)
            .select_from(joined)
            .where(*child_key(table, tenant, conv_id), table.c.run_id == run_id)
        )

    news = await conn.execute(texts_of(run_new_messages).order_by(run_new_messages.c.seq))
    record["new_messages"] = [load(r.body_text, r.body_sha256) for r in news.all()]
    final = (await conn.execute(texts_of(run_finals))).first()
    record["final"] = None if final is None else load(final.body_text, final.body_sha256)
    seq = row["final_seq"]
    if final is None and seq is not None:  # its final named among its new messages
        record["final"] = named_final(
            record["new_messages"],
            seq,
            lambda m: isinstance(m, dict) and m.get("type") == "assistant",
        )
    comps = (await conn.execute(of(run_compactions).order_by(run_compactions.c.seq))).mappings()
    record["compactions"] = [{f: r[f] for f in COMPACTION_FIELDS} for r in comps.all()]
    return record


__all__ = ["EXPORT_PAGE", "PortabilityStore", "RunInFlight"]
