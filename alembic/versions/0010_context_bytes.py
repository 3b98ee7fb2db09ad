"""The stored context's size (issue 10): ``conversations.context_bytes``.

The bytes of the context's JSON as GET context answers it (``app.agent.sizes``: the system
prompt and summary around the message texts as stored), written by every write of the context
— a run's save advances it by what it appended and folded, as the token tally — so that the
service never stores a context a PUT of it would refuse (``max_body_bytes``) without
serializing the whole context to know its size.

Existing rows are counted here from what is stored, in batches of conversations: the message
texts' bytes summed in SQL, the frame around them computed as the service does (the same JSON
dump, repeated here so that the revision does not import the application). A row the service
still finds null (none should remain) is counted when it is read.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: conversations counted per batch (their system prompt and summary are read whole)
BATCH = 200

_conversations = sa.table(
    "conversations",
    sa.column("tenant", sa.String()),
    sa.column("id", sa.String()),
    sa.column("system_prompt", sa.Text()),
    sa.column("summary", sa.Text()),
    sa.column("context_bytes", sa.BigInteger()),
)
_messages = sa.table(
    "context_messages",
    sa.column("tenant", sa.String()),
    sa.column("conversation_id", sa.String()),
    sa.column("body", sa.Text()),
)


def _frame_bytes(system_prompt: str, summary: str) -> int:
    """``app.agent.sizes.frame_bytes``: the context's JSON around its messages."""
    head = json.dumps(
        {"system_prompt": system_prompt, "summary": summary},
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return len(head.encode("utf-8", "surrogatepass")) - 1 + len(',"messages":[') + len("]}")


def _backfill() -> None:
    if context.is_offline_mode():  # `--sql` prints the DDL: there are no rows to read
        return
    conn = op.get_bind()
    c, m = _conversations.c, _messages.c
    length = (
        sa.func.octet_length(m.body)
        if conn.dialect.name == "postgresql"
        else sa.func.length(sa.cast(m.body, sa.LargeBinary))
    )
    key = sa.tuple_(c.tenant, c.id)
    message_key = sa.tuple_(m.tenant, m.conversation_id)
    write = (
        sa.update(_conversations)
        .where(c.tenant == sa.bindparam("b_tenant"), c.id == sa.bindparam("b_id"))
        .values(context_bytes=sa.bindparam("b_bytes"))
    )
    after: tuple[str, str] | None = None
    while True:
        batch = sa.select(c.tenant, c.id, c.system_prompt, c.summary).order_by(c.tenant, c.id)
        if after is not None:
            batch = batch.where(key > sa.tuple_(*after))
        rows = conn.execute(batch.limit(BATCH)).all()
        if not rows:
            return
        first, last = (rows[0].tenant, rows[0].id), (rows[-1].tenant, rows[-1].id)
        sums = {
            (r.tenant, r.conversation_id): (int(r.total or 0), int(r.count))
            for r in conn.execute(
                sa.select(
                    m.tenant,
                    m.conversation_id,
                    sa.func.sum(length).label("total"),
                    sa.func.count().label("count"),
                )
                .where(message_key >= sa.tuple_(*first), message_key <= sa.tuple_(*last))
                .group_by(m.tenant, m.conversation_id)
            )
        }
        values = []
        for row in rows:
            total, count = sums.get((row.tenant, row.id), (0, 0))
            size = _frame_bytes(row.system_prompt, row.summary) + total + max(count - 1, 0)
            values.append({"b_tenant": row.tenant, "b_id": row.id, "b_bytes": size})
        conn.execute(write, values)
        after = last


def upgrade() -> None:
    op.add_column("conversations", sa.Column("context_bytes", sa.BigInteger(), nullable=True))
    _backfill()


def downgrade() -> None:
    op.drop_column("conversations", "context_bytes")
