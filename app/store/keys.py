"""API keys kept in the database (contract §6: ``carryover keys create --tenant NAME``).

A key is ``co_`` followed by 43 URL-safe characters from :func:`secrets.token_urlsafe` (256
random bits). It is shown once, when created; the table keeps only its SHA-256 (hex) and a
short prefix to recognise it by in ``carryover keys list``. A hash of a high-entropy random
value needs no salt or slow hash: there is nothing to guess from it. Authentication looks a
presented key up by its hash; revoking sets ``revoked_at`` and the row stays for the record.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, insert, select, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.clock import SYSTEM_CLOCK, Clock

from .db import make_engine, read_transaction, write_transaction
from .tables import api_keys

KEY_PREFIX = "co_"
#: characters of the key kept for display: ``co_`` and 8 of its random characters
DISPLAY_PREFIX_LEN = 11


def hash_key(key: str) -> str:
    """The stored form of a key: its SHA-256, hex."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class StoredKey:
    """A key as ``carryover keys list`` shows it: never the key itself."""

    id: str
    tenant: str
    prefix: str
    created_at: datetime
    revoked_at: datetime | None

    @property
    def active(self) -> bool:
        return self.revoked_at is None


@dataclass(frozen=True)
class CreatedKey:
    """A new key: ``key`` is the only copy there will ever be."""

    stored: StoredKey
    key: str


class KeyStore:
    """The ``api_keys`` table: create, list, revoke, and look a presented key up."""

    def __init__(self, engine: AsyncEngine, clock: Clock = SYSTEM_CLOCK) -> None:
        self.engine = engine
        self.clock = clock

    async def create(self, tenant: str) -> CreatedKey:
        key = new_key()
        stored = StoredKey(
            id="key_" + secrets.token_hex(8),
            tenant=tenant,
            prefix=key[:DISPLAY_PREFIX_LEN],
            created_at=self.clock.now(),
            revoked_at=None,
        )
        async with write_transaction(self.engine) as conn:
            await conn.execute(
                insert(api_keys).values(
                    id=stored.id,
                    tenant=tenant,
                    key_hash=hash_key(key),
                    prefix=stored.prefix,
                    created_at=stored.created_at,
                    revoked_at=None,
                )
            )
        return CreatedKey(stored, key)

    async def list_keys(self, tenant: str | None = None) -> list[StoredKey]:
        """Every key (revoked ones too), oldest first; only ``tenant``'s when given."""
        query = select(
            api_keys.c.id,
            api_keys.c.tenant,
            api_keys.c.prefix,
            api_keys.c.created_at,
            api_keys.c.revoked_at,
        )
        if tenant is not None:
            query = query.where(api_keys.c.tenant == tenant)
        async with read_transaction(self.engine) as conn:
            rows = (await conn.execute(query.order_by(api_keys.c.created_at, api_keys.c.id))).all()
        return [StoredKey(*row) for row in rows]

    async def revoke(self, key_id: str) -> tuple[StoredKey, bool] | None:
        """Revoke a key: the key and whether this call revoked it (a second revoke keeps the
        first time). ``None``: no such key."""
        async with write_transaction(self.engine) as conn:
            changed = await conn.execute(
                update(api_keys)
                .where(api_keys.c.id == key_id, api_keys.c.revoked_at.is_(None))
                .values(revoked_at=self.clock.now())
            )
            row = (
                await conn.execute(
                    select(
                        api_keys.c.id,
                        api_keys.c.tenant,
                        api_keys.c.prefix,
                        api_keys.c.created_at,
                        api_keys.c.revoked_at,
                    ).where(api_keys.c.id == key_id)
                )
            ).first()
        return (StoredKey(*row), changed.rowcount == 1) if row is not None else None

    async def tenant_for_hash(self, key_hash: str) -> str | None:
        """The tenant of the key with this :func:`hash_key`, unless it is revoked or unknown."""
        async with read_transaction(self.engine) as conn:
            tenant: str | None = (
                await conn.execute(
                    select(api_keys.c.tenant).where(
                        api_keys.c.key_hash == key_hash, api_keys.c.revoked_at.is_(None)
                    )
                )
            ).scalar_one_or_none()
        return tenant

    async def active_count(self) -> int:
        """How many keys are not revoked."""
        async with read_transaction(self.engine) as conn:
            count = (
                await conn.execute(
                    select(func.count())
                    .select_from(api_keys)
                    .where(api_keys.c.revoked_at.is_(None))
                )
            ).scalar_one()
        return int(count)


async def active_key_count(database_url: str) -> int:
    """Active keys in the database at ``database_url``, for ``carryover serve``'s check before
    it migrates: a SQLite file that does not exist, or a schema without the ``api_keys`` table,
    has none (and the file is not created). Other errors (unreachable server) propagate."""
    if _no_sqlite_file(database_url):
        return 0
    engine = make_engine(database_url)
    try:
        return await KeyStore(engine).active_count()
    except DBAPIError as exc:
        if _missing_table(exc):
            return 0
        raise
    finally:
        await engine.dispose()


def _no_sqlite_file(database_url: str) -> bool:
    url = make_url(database_url)
    if url.get_backend_name() != "sqlite":
        return False
    path = url.database or ""
    return not path or path == ":memory:" or not os.path.exists(path)


def _missing_table(exc: DBAPIError) -> bool:
    text = str(exc.orig).lower()
    return "no such table" in text or ("api_keys" in text and "does not exist" in text)


__all__ = ["CreatedKey", "KeyStore", "StoredKey", "active_key_count", "hash_key", "new_key"]
