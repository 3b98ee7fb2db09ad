"""The stored context references its messages' texts: each ``context_messages`` row keeps
``body_sha256`` (the checksum of revision 0013, now also the key of its text in
``message_texts``, revision 0014) and a null ``body``, so a message's text is stored once per
tenant for the context, the run records, the transcript and the events alike
(app/store/texts.py, docs/operations.md "Storage").

``body`` becomes nullable and ``ix_context_messages_text`` indexes the references (the garbage
collection of texts looks them up). Existing rows are converted in batches of ``BATCH`` rows
(keyset on the primary key): a row whose text hashes to its checksum has the text written to
``message_texts`` once per tenant and its own ``body`` set NULL. A row without a checksum
(its text did not decode when revision 0013 ran) or whose text does not match it (damaged)
keeps its own text, so every read still reports it as before. The hash is repeated here so
that the revision does not import the application.

SQLite keeps the freed pages in the file until ``VACUUM`` (docs/operations.md, "Storage").

A run's prompts too: ``runs`` gets ``prompt_keys``, the keys of its prompts' texts (a JSON
list, in order), and a run that ended keeps ``[]`` as its ``prompts`` when each of them is the
text of one of its own ``run_new_messages`` (the prompts it admitted): its records keep those
texts referenced, so the garbage collection of texts needs to look at no run's prompts. Runs
queued or running keep theirs (the service converts a run when it ends), and so does a run
whose prompts its records do not hold. Converted in batches of ``BATCH`` runs (keyset).

Downgrade puts each referenced text back into its row (context rows and runs), in batches,
makes ``body`` required again and drops ``prompt_keys``; the texts stay in ``message_texts``
(revision 0014 keeps the table).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: rows converted per batch
BATCH = 1000

_messages = sa.table(
    "context_messages",
    sa.column("tenant", sa.String()),
    sa.column("conversation_id", sa.String()),
    sa.column("position", sa.BigInteger()),
    sa.column("body", sa.Text()),
    sa.column("body_sha256", sa.String()),
)

_texts = sa.table(
    "message_texts",
    sa.column("tenant", sa.String()),
    sa.column("sha256", sa.String()),
    sa.column("body", sa.Text()),
)

_KEY = ("tenant", "conversation_id", "position")

_runs = sa.table(
    "runs",
    sa.column("tenant", sa.String()),
    sa.column("conversation_id", sa.String()),
    sa.column("run_id", sa.String()),
    sa.column("status", sa.String()),
    sa.column("prompts", sa.Text()),
    sa.column("prompt_keys", sa.Text()),
)

_news = sa.table(
    "run_new_messages",
    sa.column("tenant", sa.String()),
    sa.column("conversation_id", sa.String()),
    sa.column("run_id", sa.String()),
    sa.column("body_sha256", sa.String()),
)

_RUN_KEY = ("tenant", "conversation_id", "run_id")

#: runs still going: they keep their prompts (the service converts a run when it ends)
_GOING = ("queued", "running")


def _dump(value: Any) -> str:
    """A JSON value as ``JSONText`` stores it: compact, non-ASCII as it is."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _digest(text: str) -> str:
    """``app.store.integrity.body_sha256`` of a text."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _convert(conn: sa.Connection) -> None:
    """Move the sound rows' texts to ``message_texts``, ``BATCH`` rows at a time."""
    m = _messages.c
    pk = [m[k] for k in _KEY]
    base = (
        sa.select(*pk, m.body, m.body_sha256)
        .where(m.body.is_not(None), m.body_sha256.is_not(None))
        .order_by(*pk)
        .limit(BATCH)
    )
    write = (
        sa.update(_messages)
        .where(*(c == sa.bindparam(f"k_{c.name}") for c in pk))
        .values(body=None)
    )
    insert = pg_insert(_texts) if conn.dialect.name == "postgresql" else sqlite_insert(_texts)
    put = insert.on_conflict_do_nothing()
    after: tuple[Any, ...] | None = None
    while True:
        stmt = base if after is None else base.where(sa.tuple_(*pk) > sa.tuple_(*after))
        rows = conn.execute(stmt).all()
        texts: dict[tuple[str, str], str] = {}
        updates = []
        for row in rows:
            if _digest(row.body) != row.body_sha256:
                continue  # damaged: left as it is, reported by every read
            texts[(row.tenant, row.body_sha256)] = row.body
            updates.append({f"k_{k}": getattr(row, k) for k in _KEY})
        if texts:
            conn.execute(
                put,
                [{"tenant": t, "sha256": d, "body": b} for (t, d), b in sorted(texts.items())],
            )
            conn.execute(write, updates)
        if len(rows) < BATCH:
            return
        after = tuple(getattr(rows[-1], k) for k in _KEY)


def _convert_runs(conn: sa.Connection) -> None:
    """Reference the prompts of the runs that ended, ``BATCH`` runs at a time."""
    r, n = _runs.c, _news.c
    pk = [r[k] for k in _RUN_KEY]
    base = (
        sa.select(*pk, r.prompts)
        .where(r.prompt_keys.is_(None), r.status.not_in(_GOING))
        .order_by(*pk)
        .limit(BATCH)
    )
    write = (
        sa.update(_runs)
        .where(*(c == sa.bindparam(f"k_{c.name}") for c in pk))
        .values(prompts="[]", prompt_keys=sa.bindparam("k_keys"))
    )
    after: tuple[Any, ...] | None = None
    while True:
        stmt = base if after is None else base.where(sa.tuple_(*pk) > sa.tuple_(*after))
        rows = conn.execute(stmt).all()
        records: dict[tuple[str, str, str], set[str]] = {}
        if rows:
            found = conn.execute(
                sa.select(n.tenant, n.conversation_id, n.run_id, n.body_sha256).where(
                    sa.tuple_(n.tenant, n.conversation_id, n.run_id).in_(
                        [tuple(getattr(row, k) for k in _RUN_KEY) for row in rows]
                    ),
                    n.body_sha256.is_not(None),
                )
            )
            for t, c, run, digest in found:
                records.setdefault((t, c, run), set()).add(digest)
        updates = []
        for row in rows:
            try:
                prompts = json.loads(row.prompts)
            except ValueError:
                continue  # left as it is
            if not isinstance(prompts, list) or not prompts:
                continue
            keys = [_digest(_dump(p)) for p in prompts]
            if not set(keys) <= records.get((row.tenant, row.conversation_id, row.run_id), set()):
                continue  # its records do not hold them: it keeps its own
            updates.append({**{f"k_{k}": getattr(row, k) for k in _RUN_KEY}, "k_keys": _dump(keys)})
        if updates:
            conn.execute(write, updates)
        if len(rows) < BATCH:
            return
        after = tuple(getattr(rows[-1], k) for k in _RUN_KEY)


def _restore_runs(conn: sa.Connection) -> None:
    """Put the runs' prompts back into their rows, ``BATCH`` runs at a time."""
    r, t = _runs.c, _texts.c
    pk = [r[k] for k in _RUN_KEY]
    base = sa.select(*pk, r.prompt_keys).where(r.prompt_keys.is_not(None)).order_by(*pk)
    write = (
        sa.update(_runs)
        .where(*(c == sa.bindparam(f"k_{c.name}") for c in pk))
        .values(prompts=sa.bindparam("k_prompts"), prompt_keys=None)
    )
    while True:  # each batch clears its rows' keys, so the next read starts after them
        rows = conn.execute(base.limit(BATCH)).all()
        updates = []
        for row in rows:
            keys = json.loads(row.prompt_keys)
            texts = dict(
                conn.execute(
                    sa.select(t.sha256, t.body).where(t.tenant == row.tenant, t.sha256.in_(keys))
                ).all()
            )
            prompts = "[" + ",".join(texts[k] for k in keys) + "]"
            updates.append({**{f"k_{k}": getattr(row, k) for k in _RUN_KEY}, "k_prompts": prompts})
        if updates:
            conn.execute(write, updates)
        if len(rows) < BATCH:
            return


def _restore(conn: sa.Connection) -> None:
    """Put the referenced texts back into their rows, ``BATCH`` rows at a time."""
    m, t = _messages.c, _texts.c
    pk = [m[k] for k in _KEY]
    base = (
        sa.select(*pk, t.body)
        .select_from(
            _messages.join(_texts, sa.and_(t.tenant == m.tenant, t.sha256 == m.body_sha256))
        )
        .where(m.body.is_(None))
        .order_by(*pk)
        .limit(BATCH)
    )
    write = (
        sa.update(_messages)
        .where(*(c == sa.bindparam(f"k_{c.name}") for c in pk))
        .values(body=sa.bindparam("k_body"))
    )
    while True:  # each batch fills its rows, so the next read starts after them
        rows = conn.execute(base).all()
        if rows:
            conn.execute(
                write,
                [{**{f"k_{k}": getattr(r, k) for k in _KEY}, "k_body": r.body} for r in rows],
            )
        if len(rows) < BATCH:
            return


def _shape(*, upgraded: bool) -> sa.Table:
    """``context_messages`` before (or after) this revision, for ``--sql`` on SQLite, where
    batch mode cannot reflect it (online it reflects the live table)."""
    meta = sa.MetaData()
    sa.Table(
        "conversations",
        meta,
        sa.Column("tenant", sa.String(128), primary_key=True),
        sa.Column("id", sa.String(128), primary_key=True),
    )
    key = ["tenant", "conversation_id"]
    return sa.Table(
        "context_messages",
        meta,
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("conversation_id", sa.String(128), nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("body", sa.Text(), nullable=upgraded),
        sa.Column("body_sha256", sa.String(64), nullable=True),
        sa.PrimaryKeyConstraint(*key, "position"),
        sa.ForeignKeyConstraint(
            key,
            ["conversations.tenant", "conversations.id"],
            ondelete="CASCADE",
            name="fk_context_messages_conversation",
        ),
    )


def _batch(*, upgraded: bool) -> Any:
    """``op.batch_alter_table`` of ``context_messages`` (its ``body`` changes nullability)."""
    if context.is_offline_mode() and op.get_context().dialect.name == "sqlite":
        return op.batch_alter_table("context_messages", copy_from=_shape(upgraded=upgraded))
    return op.batch_alter_table("context_messages")


def upgrade() -> None:
    with _batch(upgraded=False) as batch:
        batch.alter_column("body", existing_type=sa.Text(), nullable=True)
    op.create_index("ix_context_messages_text", "context_messages", ["tenant", "body_sha256"])
    op.add_column("runs", sa.Column("prompt_keys", sa.Text(), nullable=True))
    if context.is_offline_mode():  # `--sql` prints the DDL: there are no rows to read
        return
    _convert(op.get_bind())
    _convert_runs(op.get_bind())


def downgrade() -> None:
    if not context.is_offline_mode():
        _restore(op.get_bind())
        _restore_runs(op.get_bind())
    # plain DROP COLUMN (as in 0009): batch mode would copy ``runs`` and, dropping the old
    # table, cascade-delete its records
    op.drop_column("runs", "prompt_keys")
    op.drop_index("ix_context_messages_text", table_name="context_messages")
    with _batch(upgraded=True) as batch:
        batch.alter_column("body", existing_type=sa.Text(), nullable=False)
