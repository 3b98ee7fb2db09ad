"""Conversations as managed objects: metadata, retention (expires_at), listing indexes.

Revision ID: 0007
Revises: 0004
Create Date: 2026-12-01

- ``conversation_metadata`` (tenant, conversation_id, key) → value, cascading with its
  conversation, indexed on (tenant, key, value, conversation_id) for search;
- ``conversations.expires_at`` and indexes for listings ordered by ``updated_at`` (keyset on
  ``(tenant, updated_at, id)``) and for the retention sweeper.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "conversation_metadata",
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("conversation_id", sa.String(128), nullable=False),
        sa.Column("key", sa.String(128), nullable=False),
        sa.Column("value", sa.String(1024), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant", "conversation_id"],
            ["conversations.tenant", "conversations.id"],
            name="fk_conversation_metadata_conversation",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant", "conversation_id", "key"),
    )
    op.create_index(
        "ix_conversation_metadata_lookup",
        "conversation_metadata",
        ["tenant", "key", "value", "conversation_id"],
    )
    with op.batch_alter_table("conversations") as batch:
        batch.add_column(sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        "ix_conversations_tenant_updated", "conversations", ["tenant", "updated_at", "id"]
    )
    op.create_index("ix_conversations_expires_at", "conversations", ["expires_at"])
    op.create_index("ix_conversations_updated_at", "conversations", ["updated_at"])


def downgrade() -> None:
    op.drop_index("ix_conversations_updated_at", table_name="conversations")
    op.drop_index("ix_conversations_expires_at", table_name="conversations")
    op.drop_index("ix_conversations_tenant_updated", table_name="conversations")
    with op.batch_alter_table("conversations") as batch:
        batch.drop_column("expires_at")
    op.drop_index("ix_conversation_metadata_lookup", table_name="conversation_metadata")
    op.drop_table("conversation_metadata")
