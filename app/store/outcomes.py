"""How a run's outcome is recorded: the one write transaction behind
:meth:`~app.store.runs.RunStore.finish_run` (contract §4 step 5), and what a run that may no
longer finish learns.

Split out of :mod:`app.store.runs`; :class:`FinishingStore` is a base of
:class:`~app.store.runs.RunStore`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import Integer, and_, bindparam, case, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.agent.codec import dumps_message
from app.agent.records import Result
from app.agent.sizes import ContextSize
from app.agent.tokens import TokenTally
from app.etag import version_etag

from ._sql import (
    ContextStats,
    Loaded,
    StoreBase,
    child_key,
    insert_messages,
    insert_transcript,
    read_conversation,
)
from .changes import ContextWrite, TranscriptItem, stored_pending
from .db import defer_inserts, write_transaction
from .direct import prepared
from .errors import NotFound, run_not_found
from .events import EventRow, insert_events
from .integrity import body_sha256
from .quotas import settle
from .records import dumped_folded, final_among_new, insert_audit
from .tables import Dumped, conversations, runs
from .texts import TextBatch, prompt_keys
from .versions import insert_version, version_row
from .webhooks import enqueue_deliveries

RunStatus = Literal[
    "queued",
    "running",
    "completed",
    "failed",
    "cancelled",
    "conflicted",
    "interrupted",
    "requires_action",
]


@dataclass(frozen=True)
class RunOutcome:
    """What :meth:`RunStore.finish_run` recorded."""

    status: RunStatus
    stored: bool  # did the run's context become the stored state
    etag: str  # the stored state's ETag after the write (stored or not)
    result_etag: str | None  # the ETag of the run's context, when stored
    finished_at: datetime | None = None
    #: what is stored now, when this run stored it (exactly the run's context): for a cache
    saved: Loaded | None = None
    #: when the save only appended to the stored messages (no compaction, nothing rewritten):
    #: the texts it inserted, in order, exactly as stored (GET context's body cache)
    appended: tuple[str, ...] | None = None


def _outcome_statements() -> tuple[Any, Any, Any]:
    """The outcome's three statements on bound parameters, built once (a run's end pays no
    statement construction): store the context (conditional on incarnation and version),
    only release the lease and take the transcript's seqs (not stored), finish the run row."""
    c = conversations.c
    mine = and_(c.tenant == bindparam("b_tenant"), c.id == bindparam("b_conv_id"))
    same_incarnation = c.incarnation == bindparam("b_incarnation")
    release = case((c.active_run_id == bindparam("b_run_id"), None), else_=c.active_run_id)
    seqs = c.transcript_seq + bindparam("b_entries", type_=Integer())
    store = (
        update(conversations)
        .where(mine, same_incarnation, c.version == bindparam("b_version"))
        .values(
            version=c.version + 1,
            system_prompt=bindparam("b_system_prompt"),
            summary=bindparam("b_summary"),
            next_position=bindparam("b_next_position"),
            message_count=bindparam("b_message_count"),
            transcript_seq=seqs,
            updated_at=bindparam("b_updated_at"),
            active_run_id=release,
            token_tally=bindparam("b_token_tally"),
            pending_calls=bindparam("b_pending_calls"),
            context_bytes=bindparam("b_context_bytes"),
        )
        .returning(c.version, c.transcript_seq)
    )
    only_release = (
        update(conversations)
        .where(mine, same_incarnation)
        .values(transcript_seq=seqs, active_run_id=release)
        .returning(c.version, c.transcript_seq)
    )
    r = runs.c
    finish = (
        update(runs)
        .where(
            r.tenant == bindparam("b_tenant"),
            r.conversation_id == bindparam("b_conv_id"),
            r.run_id == bindparam("b_run_id"),
            r.status == "running",
        )
        .values(
            status=bindparam("b_status"),
            stored=bindparam("b_stored"),
            result_etag=bindparam("b_result_etag"),
            usage=bindparam("b_usage"),
            error=bindparam("b_error"),
            required_action=bindparam("b_required_action"),
            finished_at=bindparam("b_finished_at"),
            lease_expires_at=None,
            final_seq=bindparam("b_final_seq", type_=Integer()),
        )
    )
    return store, only_release, finish


_STORE, _RELEASE, _FINISH = map(prepared, _outcome_statements())
#: the finish of a run whose prompts are all among its new messages: its row references
#: their texts instead of keeping its own copy (app/store/texts.py, :func:`prompt_keys`)
_FINISH_REFERENCING = prepared(_FINISH.values(prompts=[], prompt_keys=bindparam("b_prompt_keys")))


class NotRunning(Exception):
    """The run being finished is no longer ``running`` (or no longer exists)."""


class FinishingStore(StoreBase):
    """The write of a finished run's outcome (a base of :class:`~app.store.runs.RunStore`)."""

    async def _finish_run(
        self,
        tenant: str,
        conv_id: str,
        run_id: str,
        *,
        base: Loaded,
        result: Result,
        store: bool,
        plan: ContextWrite,
        entries: Sequence[TranscriptItem],
        tokens: TokenTally,
        size: ContextSize | None,
        events: Sequence[EventRow] = (),
        paused_events: Sequence[EventRow] | None = None,
        prompts: Sequence[Any] | None = None,
    ) -> RunOutcome:
        now = self.clock.now()
        # the statements' bound parameters are named b_* (SQLAlchemy reserves column names
        # in an UPDATE for the SET clause)
        where = {
            "b_tenant": tenant,
            "b_conv_id": conv_id,
            "b_incarnation": base.incarnation,
            "b_run_id": run_id,
            "b_entries": len(entries),
        }

        folded = await dumped_folded(result)  # before the transaction: not under its lock
        final_seq = final_among_new(result)
        inserts = [(p, Dumped(dumps_message(m))) for p, m in plan.inserts] if store else []
        # Lock order, here as everywhere: the conversation row first, then the run row.
        stats = None
        if store:
            assert size is not None
            kinds = (
                {c.id: c.kind for c in result.required_action.tool_calls}
                if result.required_action is not None
                else None
            )
            stats = ContextStats(tokens, size, stored_pending(result.context.messages, kinds))
        async with write_transaction(self.engine) as conn:
            row = None
            if stats is not None:
                row = (
                    await conn.execute(
                        _STORE,
                        {
                            **where,
                            "b_version": base.version,
                            "b_system_prompt": result.context.system_prompt,
                            "b_summary": result.context.summary,
                            "b_next_position": plan.next_position,
                            "b_message_count": len(result.context.messages),
                            "b_updated_at": now,
                            # pending calls from the result's last batch: O(last batch)
                            **{f"b_{k}": v for k, v in stats.columns().items()},
                        },
                    )
                ).first()
            stored = row is not None
            if row is None:
                # Not stored (discarded or stale): only allocate the transcript's seqs.
                row = (await conn.execute(_RELEASE, where)).first()
                if row is None:
                    raise NotFound(f"conversation {conv_id!r} was deleted during the run")
            # the inserts below are read by no one here: on SQLite they ride with the next
            # statement or the COMMIT into the driver's thread (app/store/db.py)
            defer_inserts(conn)

            # the texts of context rows, records, transcript, events and the version: one
            # statement
            texts = TextBatch(tenant)
            if stored:
                # Folded messages keep their rows, below the new first position: the versions
                # before this one are made of them (app/store/versions.py); the version sweep
                # deletes them after the version retention.
                await insert_messages(conn, tenant, conv_id, inserts, texts)
                await insert_version(
                    conn,
                    version_row(
                        tenant,
                        conv_id,
                        row.version,
                        next_position=plan.next_position,
                        message_count=len(result.context.messages),
                        system_prompt=result.context.system_prompt,
                        summary=result.context.summary,
                        cause="run",
                        run_id=run_id,
                        now=now,
                        texts=texts,
                        # unchanged, they are the base version's texts: not written again
                        stored=(base.context.system_prompt, base.context.summary),
                    ),
                )

            status: RunStatus = result.status if stored or not store else "conflicted"
            etag = version_etag(base.incarnation, row.version)
            result_etag = etag if stored else None
            keys = (
                prompt_keys(prompts, (body_sha256(dumps_message(m)) for m in result.new_messages))
                if prompts
                else None
            )
            finished = await conn.execute(
                _FINISH if keys is None else _FINISH_REFERENCING,
                {
                    **({} if keys is None else {"b_prompt_keys": keys}),
                    "b_tenant": tenant,
                    "b_conv_id": conv_id,
                    "b_run_id": run_id,
                    "b_status": status,
                    "b_stored": stored,
                    "b_result_etag": result_etag,
                    "b_usage": result.usage.model_dump(mode="json"),
                    "b_error": result.error.model_dump(mode="json") if result.error else None,
                    "b_required_action": (
                        result.required_action.model_dump(mode="json")
                        if status == "requires_action" and result.required_action
                        else None
                    ),
                    "b_finished_at": now,
                    "b_final_seq": final_seq,
                },
            )
            if not finished.rowcount:
                raise NotRunning  # rolls the transaction back

            recorded = await insert_audit(
                conn, tenant, conv_id, run_id, result, folded, texts, final_seq=final_seq
            )
            await settle(conn, tenant, now, result.usage)
            first_seq = row.transcript_seq - len(entries) + 1
            await insert_transcript(conn, tenant, conv_id, run_id, first_seq, entries, now, texts)
            if status == "requires_action" and paused_events is not None:
                events = paused_events  # the pause is stored: it is announced
            await insert_events(conn, events, texts, referenced=recorded)
            await texts.flush(conn)
            await enqueue_deliveries(conn, tenant, conv_id, run_id, status, now)
        saved = None
        if stored:
            saved = Loaded(
                context=result.context,
                etag=etag,
                version=row.version,
                incarnation=base.incarnation,
                first_position=plan.next_position - len(result.context.messages),
                next_position=plan.next_position,
                tokens=tokens,
                size=size,
                pending_calls=stats.pending if stats is not None else None,
            )
        return RunOutcome(
            status=status,
            stored=stored,
            etag=etag,
            result_etag=result_etag,
            finished_at=now,
            saved=saved,
            appended=(
                tuple(text for _, text in inserts)
                if stored and plan.delete_before is None and not plan.rewritten
                else None
            ),
        )


async def no_longer_running(
    conn: AsyncConnection, tenant: str, conv_id: str, run_id: str
) -> RunOutcome:
    """What a run that may no longer finish learns: how it was recorded (``interrupted``, or
    its own outcome when a first attempt to finish did commit), and the stored ETag."""
    run = (
        await conn.execute(
            select(runs.c.status, runs.c.stored, runs.c.result_etag, runs.c.finished_at).where(
                *child_key(runs, tenant, conv_id), runs.c.run_id == run_id
            )
        )
    ).first()
    conv = await read_conversation(conn, tenant, conv_id)
    if run is None or conv is None:
        raise run_not_found(conv_id, run_id)
    return RunOutcome(
        status=run.status,
        stored=run.stored,
        etag=conv.etag,
        result_etag=run.result_etag,
        finished_at=run.finished_at,
    )


__all__ = ["FinishingStore", "NotRunning", "RunOutcome", "RunStatus", "no_longer_running"]
