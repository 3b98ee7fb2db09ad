"""Initial schema: conversations, context messages, runs and their audit tables, transcript,
idempotency keys, API keys.

Revision ID: 0001
Revises:
Create Date: 2025-01-01

Written by hand to read as the schema; ``app/store/tables.py`` describes the same tables and
``tests/store/test_migrations.py`` checks that the two agree on both engines.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _tenant() -> sa.Column[str]:
    return sa.Column("tenant", sa.String(128), nullable=False)


def _conversation_id() -> sa.Column[str]:
    return sa.Column("conversation_id", sa.String(128), nullable=False)


def _run_id() -> sa.Column[str]:
    return sa.Column("run_id", sa.String(36), nullable=False)


def _timestamp(name: str, *, nullable: bool = False) -> sa.Column[datetime]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def _conversation_fk(name: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        ["tenant", "conversation_id"],
        ["conversations.tenant", "conversations.id"],
        name=name,
        ondelete="CASCADE",
    )


def _run_fk(name: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        ["tenant", "conversation_id", "run_id"],
        ["runs.tenant", "runs.conversation_id", "runs.run_id"],
        name=name,
        ondelete="CASCADE",
    )


def upgrade() -> None:
    op.create_table(
        "conversations",
        _tenant(),
        sa.Column("id", sa.String(128), nullable=False),
        sa.Column("incarnation", sa.String(32), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("system_prompt", sa.Text(), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("next_position", sa.BigInteger(), nullable=False),
        sa.Column("message_count", sa.Integer(), nullable=False),
        sa.Column("transcript_seq", sa.BigInteger(), nullable=False),
        _timestamp("created_at"),
        _timestamp("updated_at"),
        sa.Column("active_run_id", sa.String(36), nullable=True),
        sa.PrimaryKeyConstraint("tenant", "id"),
    )

    op.create_table(
        "context_messages",
        _tenant(),
        _conversation_id(),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "conversation_id", "position"),
        _conversation_fk("fk_context_messages_conversation"),
    )

    op.create_table(
        "runs",
        _tenant(),
        _conversation_id(),
        _run_id(),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("stored", sa.Boolean(), nullable=False),
        sa.Column("on_failure", sa.String(16), nullable=False),
        sa.Column("agent", sa.String(128), nullable=False),
        sa.Column("base_etag", sa.String(80), nullable=False),
        sa.Column("result_etag", sa.String(80), nullable=True),
        sa.Column("prompts", sa.Text(), nullable=False),
        sa.Column("usage", sa.Text(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        _timestamp("created_at"),
        _timestamp("finished_at", nullable=True),
        sa.Column("lease_owner", sa.String(128), nullable=True),
        _timestamp("lease_expires_at", nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "conversation_id", "run_id"),
        _conversation_fk("fk_runs_conversation"),
    )
    op.create_index(
        "ix_runs_conversation_created", "runs", ["tenant", "conversation_id", "created_at"]
    )
    op.create_index("ix_runs_run_id", "runs", ["run_id"])
    op.create_index("ix_runs_status_lease", "runs", ["status", "lease_expires_at"])

    op.create_table(
        "run_new_messages",
        _tenant(),
        _conversation_id(),
        _run_id(),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "conversation_id", "run_id", "seq"),
        _run_fk("fk_run_new_messages_run"),
    )

    op.create_table(
        "run_finals",
        _tenant(),
        _conversation_id(),
        _run_id(),
        sa.Column("body", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "conversation_id", "run_id"),
        _run_fk("fk_run_finals_run"),
    )

    op.create_table(
        "run_compactions",
        _tenant(),
        _conversation_id(),
        _run_id(),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("reason", sa.String(16), nullable=False),
        sa.Column("previous_summary", sa.Text(), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("folded", sa.Text(), nullable=False),
        sa.Column("tokens_before", sa.Integer(), nullable=False),
        sa.Column("tokens_after", sa.Integer(), nullable=False),
        sa.Column("usage", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "conversation_id", "run_id", "seq"),
        _run_fk("fk_run_compactions_run"),
    )

    op.create_table(
        "transcript",
        _tenant(),
        _conversation_id(),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("run_id", sa.String(36), nullable=True),
        sa.Column("kind", sa.String(24), nullable=False),
        sa.Column("failed", sa.Boolean(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        _timestamp("created_at"),
        sa.PrimaryKeyConstraint("tenant", "conversation_id", "seq"),
        _conversation_fk("fk_transcript_conversation"),
    )

    op.create_table(
        "idempotency_keys",
        _tenant(),
        _conversation_id(),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("request_hash", sa.String(128), nullable=False),
        sa.Column("run_id", sa.String(36), nullable=True),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("response", sa.Text(), nullable=True),
        _timestamp("created_at"),
        _timestamp("expires_at"),
        sa.PrimaryKeyConstraint("tenant", "conversation_id", "key"),
        _conversation_fk("fk_idempotency_keys_conversation"),
    )
    op.create_index("ix_idempotency_keys_expires_at", "idempotency_keys", ["expires_at"])

    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("key_hash", sa.String(128), nullable=False),
        sa.Column("prefix", sa.String(16), nullable=False),
        _timestamp("created_at"),
        _timestamp("revoked_at", nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("key_hash", name="uq_api_keys_key_hash"),
    )
    op.create_index("ix_api_keys_tenant", "api_keys", ["tenant"])


def downgrade() -> None:
    op.drop_index("ix_api_keys_tenant", table_name="api_keys")
    op.drop_table("api_keys")
    op.drop_index("ix_idempotency_keys_expires_at", table_name="idempotency_keys")
    op.drop_table("idempotency_keys")
    op.drop_table("transcript")
    op.drop_table("run_compactions")
    op.drop_table("run_finals")
    op.drop_table("run_new_messages")
    op.drop_index("ix_runs_status_lease", table_name="runs")
    op.drop_index("ix_runs_run_id", table_name="runs")
    op.drop_index("ix_runs_conversation_created", table_name="runs")
    op.drop_table("runs")
    op.drop_table("context_messages")
    op.drop_table("conversations")
