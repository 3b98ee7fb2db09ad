"""Each message's text stored once: ``message_texts`` (tenant, SHA-256 of the text, the
text), and run records, the transcript and message events referencing it (app/store/texts.py).

``run_new_messages``, ``run_finals`` and the transcript's message entries (kinds prompt,
attempt, tool_result, client_result) get ``body_sha256``, the key of their text, and a
nullable ``body``; ``run_events`` gets ``data_sha256`` for its ``message`` events. Existing
rows are converted here in batches of ``BATCH`` rows (keyset on the primary key): each text
is hashed exactly as stored (the digest ``context_messages.body_sha256`` uses), written to
``message_texts`` once per tenant, and the row's text is set NULL. A row whose text does not
parse as a JSON object keeps its text and no reference, so every read still reports it
damaged. (The hash is repeated here so that
the revision does not import the application.)

SQLite keeps the freed pages in the file until ``VACUUM`` (docs/operations.md, "Storage").

Downgrade puts each referenced text back into its row, in batches, and drops the table.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01
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

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: rows converted per batch
BATCH = 1000

#: the transcript entries that hold one message
MESSAGE_KINDS = ("prompt", "attempt", "tool_result", "client_result")

#: each referencing table and its primary key after (tenant, conversation_id)
KEYS: dict[str, tuple[str, ...]] = {
    "run_new_messages": ("run_id", "seq"),
    "run_finals": ("run_id",),
    "transcript": ("seq",),
    "run_events": ("run_id", "seq"),
}

#: the column holding the text in each (its key: ``<column>_sha256``)
COLUMN = {
    "run_new_messages": "body",
    "run_finals": "body",
    "transcript": "body",
    "run_events": "data",
}

_texts = sa.table(
    "message_texts",
    sa.column("tenant", sa.String()),
    sa.column("sha256", sa.String()),
    sa.column("body", sa.Text()),
)


def _table(name: str) -> sa.TableClause:
    """The table, its text column as ``body`` and its key as ``digest``."""
    columns: list[sa.ColumnClause[Any]] = [
        sa.column(k) for k in ("tenant", "conversation_id", *KEYS[name])
    ]
    extra: dict[str, list[sa.ColumnClause[Any]]] = {
        "transcript": [sa.column("kind", sa.String())],
        "run_events": [sa.column("event", sa.String())],
    }
    table = sa.table(
        name,
        *columns,
        *extra.get(name, []),
        sa.column(COLUMN[name], sa.Text()),
        sa.column(f"{COLUMN[name]}_sha256", sa.String()),
    )
    return table


def _body(table: sa.TableClause) -> sa.ColumnClause[str]:
    return table.c[COLUMN[table.name]]


def _digest_column(table: sa.TableClause) -> sa.ColumnClause[str]:
    return table.c[f"{COLUMN[table.name]}_sha256"]


def _digest(text: str) -> str | None:
    """The SHA-256 (hex) of a text that parses as a JSON object, else None."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _batches(conn: sa.Connection, table: sa.TableClause, where: sa.ColumnElement[bool]) -> None:
    """Convert the rows of ``table`` matching ``where``, ``BATCH`` at a time."""
    pk = [table.c[k] for k in ("tenant", "conversation_id", *KEYS[table.name])]
    key = sa.tuple_(*pk)
    base = sa.select(*pk, _body(table).label("body")).where(where).order_by(*pk).limit(BATCH)
    names = [c.name for c in pk]
    write = (
        sa.update(table)
        .where(*(c == sa.bindparam(f"k_{c.name}") for c in pk))
        .values({_body(table): None, _digest_column(table): sa.bindparam("k_digest")})
    )
    insert = pg_insert(_texts) if conn.dialect.name == "postgresql" else sqlite_insert(_texts)
    put = insert.on_conflict_do_nothing()
    after: tuple[object, ...] | None = None
    while True:
        stmt = base if after is None else base.where(key > sa.tuple_(*after))
        rows = conn.execute(stmt).all()
        texts: dict[tuple[str, str], str] = {}
        updates = []
        for row in rows:
            digest = _digest(row.body)
            if digest is None:
                continue  # left as it is: reported damaged by every read
            texts[(row.tenant, digest)] = row.body
            updates.append({**{f"k_{n}": getattr(row, n) for n in names}, "k_digest": digest})
        if texts:
            conn.execute(
                put,
                [{"tenant": t, "sha256": d, "body": b} for (t, d), b in sorted(texts.items())],
            )
            conn.execute(write, updates)
        if len(rows) < BATCH:
            return
        after = tuple(getattr(rows[-1], n) for n in names)


def _restore(conn: sa.Connection, table: sa.TableClause) -> None:
    """Put the referenced texts back into the rows of ``table``, ``BATCH`` at a time."""
    pk = [table.c[k] for k in ("tenant", "conversation_id", *KEYS[table.name])]
    names = [c.name for c in pk]
    t = _texts.c
    base = (
        sa.select(*pk, t.body)
        .select_from(
            table.join(
                _texts, sa.and_(t.tenant == table.c.tenant, t.sha256 == _digest_column(table))
            )
        )
        .where(_body(table).is_(None))
        .order_by(*pk)
        .limit(BATCH)
    )
    write = (
        sa.update(table)
        .where(*(c == sa.bindparam(f"k_{c.name}") for c in pk))
        .values({_body(table): sa.bindparam("k_body")})
    )
    while True:  # each batch fills its rows, so the next read starts after them
        rows = conn.execute(base).all()
        if rows:
            conn.execute(
                write,
                [{**{f"k_{n}": getattr(r, n) for n in names}, "k_body": r.body} for r in rows],
            )
        if len(rows) < BATCH:
            return


def _shape(name: str, *, upgraded: bool) -> sa.Table:
    """The table as it is before (or after) this revision, for ``--sql`` on SQLite, where
    batch mode cannot reflect it (online it reflects the live table)."""
    meta = sa.MetaData()
    sa.Table(
        "conversations",
        meta,
        sa.Column("tenant", sa.String(128), primary_key=True),
        sa.Column("id", sa.String(128), primary_key=True),
    )
    sa.Table(
        "runs",
        meta,
        sa.Column("tenant", sa.String(128), primary_key=True),
        sa.Column("conversation_id", sa.String(128), primary_key=True),
        sa.Column("run_id", sa.String(36), primary_key=True),
    )
    key = ["tenant", "conversation_id"]
    columns: list[Any] = [
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("conversation_id", sa.String(128), nullable=False),
    ]
    if name == "transcript":
        columns += [
            sa.Column("seq", sa.BigInteger(), nullable=False),
            sa.Column("run_id", sa.String(36), nullable=True),
            sa.Column("kind", sa.String(24), nullable=False),
            sa.Column("failed", sa.Boolean(), nullable=False),
            sa.Column("body", sa.Text(), nullable=upgraded),
            sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
            sa.PrimaryKeyConstraint(*key, "seq"),
            sa.ForeignKeyConstraint(
                key,
                ["conversations.tenant", "conversations.id"],
                ondelete="CASCADE",
                name="fk_transcript_conversation",
            ),
        ]
    else:
        seq: list[Any] = (
            [sa.Column("seq", sa.Integer(), nullable=False)] if name == "run_new_messages" else []
        )
        columns += [
            sa.Column("run_id", sa.String(36), nullable=False),
            *seq,
            sa.Column("body", sa.Text(), nullable=upgraded),
            sa.PrimaryKeyConstraint(*key, "run_id", *(["seq"] if seq else [])),
            sa.ForeignKeyConstraint(
                [*key, "run_id"],
                ["runs.tenant", "runs.conversation_id", "runs.run_id"],
                ondelete="CASCADE",
                name=f"fk_{name}_run",
            ),
        ]
    if upgraded:
        columns.append(sa.Column("body_sha256", sa.String(64), nullable=True))
    return sa.Table(name, meta, *columns)


def _batch(name: str, *, upgraded: bool) -> Any:
    """``op.batch_alter_table`` of a table whose ``body`` changes nullability."""
    if context.is_offline_mode() and op.get_context().dialect.name == "sqlite":
        return op.batch_alter_table(name, copy_from=_shape(name, upgraded=upgraded))
    return op.batch_alter_table(name)


def upgrade() -> None:
    op.create_table(
        "message_texts",
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "sha256"),
    )
    for name in KEYS:
        column = COLUMN[name]
        if name == "run_events":  # its data is nullable already: a column only
            op.add_column(name, sa.Column("data_sha256", sa.String(64), nullable=True))
        else:
            with _batch(name, upgraded=False) as batch:
                batch.add_column(sa.Column("body_sha256", sa.String(64), nullable=True))
                batch.alter_column("body", existing_type=sa.Text(), nullable=True)
        op.create_index(f"ix_{name}_text", name, ["tenant", f"{column}_sha256"])
    if context.is_offline_mode():  # `--sql` prints the DDL: there are no rows to read
        return
    conn = op.get_bind()
    for name in KEYS:
        table = _table(name)
        where: sa.ColumnElement[bool] = _body(table).is_not(None)
        if name == "transcript":
            where = sa.and_(where, table.c.kind.in_(MESSAGE_KINDS))
        if name == "run_events":
            where = sa.and_(where, table.c.event == "message")
        _batches(conn, table, where)


def downgrade() -> None:
    if not context.is_offline_mode():
        conn = op.get_bind()
        for name in KEYS:
            _restore(conn, _table(name))
    for name in KEYS:
        op.drop_index(f"ix_{name}_text", table_name=name)
        if name == "run_events":
            with op.batch_alter_table(name) as batch:
                batch.drop_column("data_sha256")
            continue
        with _batch(name, upgraded=True) as batch:
            batch.drop_column("body_sha256")
            batch.alter_column("body", existing_type=sa.Text(), nullable=False)
    op.drop_table("message_texts")
