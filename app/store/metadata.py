"""Conversation metadata and retention: the ``conversation_metadata`` rows and
``conversations.expires_at`` (docs/conversations.md).

Metadata is a flat ``str → str`` map beside the conversation, never part of its Context: a
change bumps ``updated_at`` but not the version, so the context's ETag stays as it was.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from ._sql import StoreBase, child_key, conversation_key
from .db import read_transaction, write_transaction
from .errors import LimitExceeded, conversation_not_found
from .tables import Conversation, conversation_metadata, conversations

#: ``expires_at`` left as it is by a patch
KEEP: Any = object()


async def read_metadata(
    conn: AsyncConnection, tenant: str, conv_ids: Sequence[str]
) -> dict[str, dict[str, str]]:
    """The metadata of each of these conversations (one statement), keys in order."""
    if not conv_ids:
        return {}
    rows = (
        await conn.execute(
            select(
                conversation_metadata.c.conversation_id,
                conversation_metadata.c.key,
                conversation_metadata.c.value,
            )
            .where(
                conversation_metadata.c.tenant == tenant,
                conversation_metadata.c.conversation_id.in_(list(conv_ids)),
            )
            .order_by(conversation_metadata.c.conversation_id, conversation_metadata.c.key)
        )
    ).all()
    found: dict[str, dict[str, str]] = {c: {} for c in conv_ids}
    for row in rows:
        found[row.conversation_id][row.key] = row.value
    return found


async def write_metadata(
    conn: AsyncConnection, tenant: str, conv_id: str, values: Mapping[str, str]
) -> None:
    if values:
        await conn.execute(
            insert(conversation_metadata),
            [
                {"tenant": tenant, "conversation_id": conv_id, "key": k, "value": v}
                for k, v in values.items()
            ],
        )


@dataclass(frozen=True)
class Patched:
    conversation: Conversation
    metadata: dict[str, str]


class MetadataStore(StoreBase):
    async def get_metadata(self, tenant: str, conv_ids: Sequence[str]) -> dict[str, dict[str, str]]:
        async with read_transaction(self.engine) as conn:
            return await read_metadata(conn, tenant, conv_ids)

    async def patch_conversation(
        self,
        tenant: str,
        conv_id: str,
        metadata: Mapping[str, str | None] | None,
        *,
        expires_at: datetime | None = KEEP,
        max_keys: int,
    ) -> Patched:
        """Apply an RFC 7396 merge patch of the metadata (a ``None`` value removes its key;
        ``metadata`` ``None`` removes every key) and set
        ``expires_at`` (``None`` clears it; :data:`KEEP` leaves it), in one transaction.

        Bumps ``updated_at``, never the version. :class:`LimitExceeded` (nothing written) when
        the result has more than ``max_keys`` keys.
        """
        values: dict[str, Any] = {"updated_at": self.clock.now()}
        if expires_at is not KEEP:
            values["expires_at"] = expires_at
        async with write_transaction(self.engine) as conn:
            row = (
                (
                    await conn.execute(
                        update(conversations)
                        .where(*conversation_key(tenant, conv_id))
                        .values(values)
                        .returning(*conversations.c)
                    )
                )
                .mappings()
                .first()
            )
            if row is None:
                raise conversation_not_found(conv_id)
            if metadata is None:
                await conn.execute(
                    delete(conversation_metadata).where(
                        *child_key(conversation_metadata, tenant, conv_id)
                    )
                )
            elif metadata:
                await conn.execute(
                    delete(conversation_metadata).where(
                        *child_key(conversation_metadata, tenant, conv_id),
                        conversation_metadata.c.key.in_(list(metadata)),
                    )
                )
                kept = {k: v for k, v in metadata.items() if v is not None}
                await write_metadata(conn, tenant, conv_id, kept)
                count = (
                    await conn.execute(
                        select(func.count()).where(
                            *child_key(conversation_metadata, tenant, conv_id)
                        )
                    )
                ).scalar_one()
                if count > max_keys:
                    raise LimitExceeded("max_metadata_keys", max_keys, int(count))
            found = await read_metadata(conn, tenant, [conv_id])
        return Patched(Conversation.model_construct(**row), found[conv_id])


__all__ = ["KEEP", "MetadataStore", "Patched", "read_metadata", "write_metadata"]
