"""A pending call's kind stored with it: each entry of ``conversations.pending_calls`` gains
``kind`` (``client`` | ``approval``), as the run that paused decided it, and ``server_label``
when the call records the server that runs it (docs/tools.md, "Pending calls and their kind").

Before this revision the kind was not stored: it followed the agent profile when read (a call
to a server tool of the profile was an approval). A call to a remote MCP server is no server
tool of the profile, so the kind is now kept with the call: the service writes it with every
run's outcome, and reads an entry without one (a context written by PUT or import) as the
profile infers it.

The upgrade fills ``kind`` in for the conversations that await calls now (the rows of the
partial index ``ix_conversations_tenant_pending``), in batches of ``BATCH`` conversations in key
order: the kinds come from the ``required_action`` of each one's latest paused run (one
statement per batch, a window over the paused runs of the batch's conversations), matched by
call id. A call no paused run lists (its context was PUT) keeps no kind and is read as before.
The values are written as ``JSONText`` writes them (compact, not ASCII-escaped); this revision
does not import the application.

The downgrade removes ``kind`` and ``server_label`` from the entries (in batches), leaving them
as revision 0009 wrote them. Stored tool calls themselves keep their ``server_label``: a
version of the service from before it does not read a message whose call records one.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-08
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import context, op

revision: str = "0016"
down_revision: str | Sequence[str] | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: conversations converted per batch
BATCH = 500

conversations = sa.table(
    "conversations",
    sa.column("tenant", sa.String()),
    sa.column("id", sa.String()),
    sa.column("pending_calls", sa.Text()),
)
runs = sa.table(
    "runs",
    sa.column("tenant", sa.String()),
    sa.column("conversation_id", sa.String()),
    sa.column("run_id", sa.String()),
    sa.column("created_at", sa.DateTime()),
    sa.column("required_action", sa.Text()),
)


def _text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def upgrade() -> None:
    if context.is_offline_mode():  # `--sql` prints the DDL: there is none, and no rows to read
        return
    bind = op.get_bind()
    for keys, pending in _batches(bind):
        kinds = _latest_kinds(bind, keys)
        updates = []
        for key, entries in pending.items():
            found = kinds.get(key, {})
            changed = False
            for entry in entries:
                kind = found.get(entry.get("id"))
                if kind in ("client", "approval") and entry.get("kind") != kind:
                    entry["kind"] = kind
                    changed = True
            if changed:
                updates.append({"k_tenant": key[0], "k_id": key[1], "value": _text(entries)})
        _write(bind, updates)


def downgrade() -> None:
    if context.is_offline_mode():
        return
    bind = op.get_bind()
    for _, pending in _batches(bind):
        updates = []
        for key, entries in pending.items():
            if any("kind" in e or "server_label" in e for e in entries):
                bare = [{k: e[k] for k in ("id", "name", "arguments") if k in e} for e in entries]
                updates.append({"k_tenant": key[0], "k_id": key[1], "value": _text(bare)})
        _write(bind, updates)


def _batches(
    bind: sa.Connection,
) -> Any:
    """The conversations that await calls, ``BATCH`` at a time: their keys and entries."""
    c = conversations.c
    after: tuple[str, str] | None = None
    while True:
        stmt = sa.select(c.tenant, c.id, c.pending_calls).where(c.pending_calls.is_not(None))
        if after is not None:
            stmt = stmt.where(sa.tuple_(c.tenant, c.id) > sa.tuple_(*after))
        rows = list(bind.execute(stmt.order_by(c.tenant, c.id).limit(BATCH)))
        if not rows:
            return
        pending: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for tenant, conv_id, value in rows:
            try:
                entries = json.loads(value)
            except (TypeError, ValueError):
                continue  # not what the service writes: left as it is
            if isinstance(entries, list) and all(isinstance(e, dict) for e in entries):
                pending[(tenant, conv_id)] = entries
        yield [(r[0], r[1]) for r in rows], pending
        after = (rows[-1][0], rows[-1][1])


def _latest_kinds(
    bind: sa.Connection, keys: Sequence[tuple[str, str]]
) -> dict[tuple[str, str], dict[str, str]]:
    """Per conversation of ``keys``: the kind of each call its latest paused run listed."""
    if not keys:
        return {}
    r = runs.c
    first, last = keys[0], keys[-1]
    ranked = (
        sa.select(
            r.tenant,
            r.conversation_id,
            r.required_action,
            sa.func.row_number()
            .over(
                partition_by=(r.tenant, r.conversation_id),
                order_by=(r.created_at.desc(), r.run_id.desc()),
            )
            .label("rank"),
        )
        .where(
            r.required_action.is_not(None),
            sa.tuple_(r.tenant, r.conversation_id) >= sa.tuple_(*first),
            sa.tuple_(r.tenant, r.conversation_id) <= sa.tuple_(*last),
        )
        .subquery()
    )
    stmt = sa.select(ranked.c.tenant, ranked.c.conversation_id, ranked.c.required_action).where(
        ranked.c.rank == 1
    )
    out: dict[tuple[str, str], dict[str, str]] = {}
    for tenant, conv_id, value in bind.execute(stmt):
        try:
            action = json.loads(value)
            calls = action.get("tool_calls") or []
            out[(tenant, conv_id)] = {
                str(call["id"]): str(call.get("kind")) for call in calls if "id" in call
            }
        except (TypeError, ValueError, AttributeError, KeyError):
            continue
    return out


def _write(bind: sa.Connection, updates: list[dict[str, str]]) -> None:
    if not updates:
        return
    c = conversations.c
    bind.execute(
        conversations.update()
        .where(c.tenant == sa.bindparam("k_tenant"), c.id == sa.bindparam("k_id"))
        .values(pending_calls=sa.bindparam("value")),
        updates,
    )
