"""A run's last events in one row (app/store/events.py): ``run_events`` gets ``first_seq``. A
row with it holds the events ``first_seq`` … ``seq`` of its run (its ``data`` a JSON array of
them, a message event naming its text by key); a row without it is one event, as before. The
events a run writes with its outcome are such a row when the run's records reference every
message text among them, so a run's events cost one row, not one per event.

Plain ADD/DROP COLUMN on both engines (as in 0018). The downgrade first writes each row of
several events as a row per event (a message event referencing its text by key, as the code
before this revision writes it), in batches, then drops the column: nothing is lost either way.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-07
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | Sequence[str] | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("run_events", sa.Column("first_seq", sa.Integer(), nullable=True))


#: rows of several events expanded per statement on downgrade
BATCH = 500

_events = sa.table(
    "run_events",
    sa.column("tenant", sa.String),
    sa.column("conversation_id", sa.String),
    sa.column("run_id", sa.String),
    sa.column("seq", sa.Integer),
    sa.column("event", sa.String),
    sa.column("data", sa.Text),
    sa.column("created_at", sa.DateTime(timezone=True)),
    sa.column("data_sha256", sa.String),
    sa.column("first_seq", sa.Integer),
)


def _expanded(row: sa.Row[tuple[object, ...]]) -> list[dict[str, object]]:
    """A row of several events as the rows of its events (``[seq, event, data]`` each, a
    message event ``[seq, "message", null, key]``)."""
    out = []
    for item in json.loads(str(row.data)):
        seq, event, data = item[0], item[1], item[2]
        key = item[3] if len(item) == 4 else None
        out.append(
            {
                "tenant": row.tenant,
                "conversation_id": row.conversation_id,
                "run_id": row.run_id,
                "seq": seq,
                "event": event,
                "data": None
                if key is not None or data is None
                else json.dumps(data, ensure_ascii=False, separators=(",", ":")),
                "created_at": row.created_at,
                "data_sha256": key,
            }
        )
    return out


def downgrade() -> None:
    conn = op.get_bind()
    e = _events.c
    key = (e.tenant, e.conversation_id, e.run_id, e.seq)
    while True:
        rows = conn.execute(
            sa.select(_events).where(e.first_seq.is_not(None)).order_by(*key).limit(BATCH)
        ).all()
        if not rows:
            break
        for row in rows:
            conn.execute(
                _events.delete().where(
                    e.tenant == row.tenant,
                    e.conversation_id == row.conversation_id,
                    e.run_id == row.run_id,
                    e.seq == row.seq,
                )
            )
            # an event also stored in a row of its own (written twice) is kept once
            have = set(
                conn.execute(
                    sa.select(e.seq).where(
                        e.tenant == row.tenant,
                        e.conversation_id == row.conversation_id,
                        e.run_id == row.run_id,
                    )
                ).scalars()
            )
            events = [event for event in _expanded(row) if event["seq"] not in have]
            if events:
                conn.execute(_events.insert(), events)
    op.drop_column("run_events", "first_seq")
