"""Every stored version of a context, reconstructible: ``context_versions`` records each
version a write makes (its system prompt and summary as references into ``message_texts``,
the range of positions of its messages, what made it and when), and writes stop deleting the
message rows they fold or replace (app/store/versions.py, docs/conversations.md "Versions").

The upgrade records each existing conversation's current version, in batches of ``BATCH``
conversations (keyset on the primary key), its system prompt and summary written to
``message_texts`` once per tenant; the versions before it were not kept and are not
reconstructible (410). The hash is repeated here so that the revision does not import the
application.

Downgrade deletes the message rows that only earlier versions hold (those below each
conversation's first position), in batches, and drops the table. The texts of system prompts
and summaries stay in ``message_texts``.

Revision ID: 0017
Revises: 0016
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

revision: str = "0017"
down_revision: str | Sequence[str] | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: conversations per batch
BATCH = 1000

_conversations = sa.table(
    "conversations",
    sa.column("tenant", sa.String()),
    sa.column("id", sa.String()),
    sa.column("version", sa.BigInteger()),
    sa.column("system_prompt", sa.Text()),
    sa.column("summary", sa.Text()),
    sa.column("next_position", sa.BigInteger()),
    sa.column("message_count", sa.Integer()),
    sa.column("updated_at", sa.DateTime(timezone=True)),
)

_versions = sa.table(
    "context_versions",
    sa.column("tenant", sa.String()),
    sa.column("conversation_id", sa.String()),
    sa.column("version", sa.BigInteger()),
    sa.column("next_position", sa.BigInteger()),
    sa.column("message_count", sa.Integer()),
    sa.column("system_sha256", sa.String()),
    sa.column("summary_sha256", sa.String()),
    sa.column("cause", sa.String()),
    sa.column("run_id", sa.String()),
    sa.column("created_at", sa.DateTime(timezone=True)),
)

_texts = sa.table(
    "message_texts",
    sa.column("tenant", sa.String()),
    sa.column("sha256", sa.String()),
    sa.column("body", sa.Text()),
)

_messages = sa.table(
    "context_messages",
    sa.column("tenant", sa.String()),
    sa.column("conversation_id", sa.String()),
    sa.column("position", sa.BigInteger()),
)


def _text(value: str) -> tuple[str, str]:
    """A string as ``JSONText`` stores it, and its key (``app.store.integrity.body_sha256``)."""
    dumped = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return dumped, hashlib.sha256(dumped.encode("utf-8", "surrogatepass")).hexdigest()


def _record(conn: sa.Connection) -> None:
    """Record each conversation's current version, ``BATCH`` conversations at a time."""
    c = _conversations.c
    base = (
        sa.select(
            c.tenant,
            c.id,
            c.version,
            c.system_prompt,
            c.summary,
            c.next_position,
            c.message_count,
            c.updated_at,
        )
        .order_by(c.tenant, c.id)
        .limit(BATCH)
    )
    insert = pg_insert(_texts) if conn.dialect.name == "postgresql" else sqlite_insert(_texts)
    put = insert.on_conflict_do_nothing()
    after: tuple[str, str] | None = None
    while True:
        stmt = base if after is None else base.where(sa.tuple_(c.tenant, c.id) > sa.tuple_(*after))
        rows = conn.execute(stmt).all()
        texts: dict[tuple[str, str], str] = {}
        records: list[dict[str, Any]] = []
        for row in rows:
            system, system_key = _text(row.system_prompt)
            summary, summary_key = _text(row.summary)
            texts[(row.tenant, system_key)] = system
            texts[(row.tenant, summary_key)] = summary
            records.append(
                {
                    "tenant": row.tenant,
                    "conversation_id": row.id,
                    "version": row.version,
                    "next_position": row.next_position,
                    "message_count": row.message_count,
                    "system_sha256": system_key,
                    "summary_sha256": summary_key,
                    "cause": "migrated",
                    "run_id": None,
                    "created_at": row.updated_at,
                }
            )
        if texts:
            conn.execute(
                put, [{"tenant": t, "sha256": d, "body": b} for (t, d), b in sorted(texts.items())]
            )
            conn.execute(sa.insert(_versions), records)
        if len(rows) < BATCH:
            return
        after = (rows[-1].tenant, rows[-1].id)


def _forget(conn: sa.Connection) -> None:
    """Delete the rows below each conversation's first position, ``BATCH`` conversations at a
    time."""
    c, m = _conversations.c, _messages.c
    base = sa.select(c.tenant, c.id, c.next_position, c.message_count).order_by(c.tenant, c.id)
    after: tuple[str, str] | None = None
    while True:
        stmt = base if after is None else base.where(sa.tuple_(c.tenant, c.id) > sa.tuple_(*after))
        rows = conn.execute(stmt.limit(BATCH)).all()
        for row in rows:
            conn.execute(
                sa.delete(_messages).where(
                    m.tenant == row.tenant,
                    m.conversation_id == row.id,
                    m.position < row.next_position - row.message_count,
                )
            )
        if len(rows) < BATCH:
            return
        after = (rows[-1].tenant, rows[-1].id)


def upgrade() -> None:
    op.create_table(
        "context_versions",
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("conversation_id", sa.String(128), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("next_position", sa.BigInteger(), nullable=False),
        sa.Column("message_count", sa.Integer(), nullable=False),
        sa.Column("system_sha256", sa.String(64), nullable=False),
        sa.Column("summary_sha256", sa.String(64), nullable=False),
        sa.Column("cause", sa.String(24), nullable=False),
        sa.Column("run_id", sa.String(36), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "conversation_id", "version"),
        sa.ForeignKeyConstraint(
            ["tenant", "conversation_id"],
            ["conversations.tenant", "conversations.id"],
            ondelete="CASCADE",
            name="fk_context_versions_conversation",
        ),
    )
    op.create_index("ix_context_versions_created_at", "context_versions", ["created_at"])
    op.create_index(
        "ix_context_versions_system_text", "context_versions", ["tenant", "system_sha256"]
    )
    op.create_index(
        "ix_context_versions_summary_text", "context_versions", ["tenant", "summary_sha256"]
    )
    if context.is_offline_mode():  # `--sql` prints the DDL: there are no rows to read
        return
    _record(op.get_bind())


def downgrade() -> None:
    if not context.is_offline_mode():
        _forget(op.get_bind())
    op.drop_index("ix_context_versions_summary_text", table_name="context_versions")
    op.drop_index("ix_context_versions_system_text", table_name="context_versions")
    op.drop_index("ix_context_versions_created_at", table_name="context_versions")
    op.drop_table("context_versions")
