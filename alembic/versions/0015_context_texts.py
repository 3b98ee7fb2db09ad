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

Downgrade puts each referenced text back into its row, in batches, and makes ``body`` required
again; the texts stay in ``message_texts`` (revision 0014 keeps the table).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06
"""

from __future__ import annotations

import hashlib
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
    if context.is_offline_mode():  # `--sql` prints the DDL: there are no rows to read
        return
    _convert(op.get_bind())


def downgrade() -> None:
    if not context.is_offline_mode():
        _restore(op.get_bind())
    op.drop_index("ix_context_messages_text", table_name="context_messages")
    with _batch(upgraded=True) as batch:
        batch.alter_column("body", existing_type=sa.Text(), nullable=False)
