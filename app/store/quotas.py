"""Per-tenant quotas and usage (docs/operations.md "Quotas").

:func:`admit` runs inside the transaction that takes a run's lease — :meth:`RunStore.start_run`
for a direct start, the claim of a queued run (:mod:`.queue`) for a queued or background one:
on PostgreSQL it locks the tenant's quota row first, so the run starts of one tenant are
serialised across every replica and none can overspend with another; SQLite's write lock
serialises them anyway. A spent quota raises :class:`QuotaExceeded` (429 ``quota-exceeded``)
and the transaction rolls back: nothing runs, nothing is written (a claim asks
:func:`refusal` instead, and decides what becomes of the queued run). Admitted, the run counts
in the tenant's day (:func:`count_start`). :func:`settle` adds a run's tokens when it ends, in
the transaction that records its outcome — a run that overshoots the day's tokens is recorded;
the next one is refused.

The limits:

- ``runs_per_minute``: runs *started* in the last 60 seconds (a sliding window over the run
  rows' ``started_at``: a queued run counts from its claim, not its arrival; the count is at
  most the limit, so it costs O(limit));
- ``concurrent_runs``: runs of the tenant running with a live lease;
- ``tokens_per_day``: input + output tokens of runs ended this UTC day.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, delete, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.agent.messages import Usage
from app.clock import SYSTEM_CLOCK, Clock
from app.errors import CarryoverError

from .db import read_transaction, write_transaction
from .direct import prepared
from .tables import runs, tenant_quotas, tenant_usage

WINDOW = timedelta(seconds=60)
LIMITS = ("tokens_per_day", "runs_per_minute", "concurrent_runs")
#: the policy names of the RateLimit headers, by limit
POLICY = {
    "runs_per_minute": "runs-per-minute",
    "tokens_per_day": "tokens-per-day",
    "concurrent_runs": "concurrent-runs",
}


@dataclass(frozen=True)
class Quota:
    tenant: str
    tokens_per_day: int | None = None
    runs_per_minute: int | None = None
    concurrent_runs: int | None = None
    updated_at: datetime | None = None

    def limits(self) -> dict[str, int]:
        return {name: v for name in LIMITS if (v := getattr(self, name)) is not None}


@dataclass(frozen=True)
class QuotaState:
    """Where a tenant stands against its quota now."""

    quota: Quota | None
    runs_last_minute: int
    running: int
    tokens_today: int


class QuotaExceeded(CarryoverError):
    """A tenant's quota is spent: 429 ``quota-exceeded`` with ``Retry-After`` and the IETF
    ``RateLimit-Policy`` / ``RateLimit`` headers (draft-ietf-httpapi-ratelimit-headers)."""

    slug = "quota-exceeded"
    status = 429

    def __init__(self, tenant: str, limit: str, quota: Quota, used: int, retry_after: int) -> None:
        maximum = quota.limits()[limit]
        retry_after = max(1, retry_after)
        windows = {"runs_per_minute": 60, "tokens_per_day": 86_400}
        policies = ", ".join(
            f'"{POLICY[name]}";q={value}' + (f";w={windows[name]}" if name in windows else "")
            for name, value in quota.limits().items()
        )
        super().__init__(
            f"tenant {tenant!r} has spent its quota of {maximum} {limit.replace('_', ' ')} "
            f"({used} used); try again in {retry_after} s",
            headers={
                "Retry-After": str(retry_after),
                "RateLimit-Policy": policies,
                "RateLimit": f'"{POLICY[limit]}";r=0;t={retry_after}',
            },
            limit=limit,
            quota=maximum,
            used=used,
        )
        self.limit = limit


def day_of(moment: datetime) -> str:
    return moment.astimezone(UTC).date().isoformat()  # YYYY-MM-DD, without strftime's parsing


def _seconds_to_midnight(now: datetime) -> int:
    midnight = (now.astimezone(UTC) + timedelta(days=1)).replace(
        hour=0, minute=0, second=0, microsecond=0
    )
    return int((midnight - now).total_seconds()) + 1


def _upsert(conn: AsyncConnection) -> Any:
    return pg_insert if conn.dialect.name == "postgresql" else sqlite_insert


_COUNTS = ("runs", "input_tokens", "output_tokens", "cached_tokens")
_usage_upserts: dict[tuple[str, tuple[str, ...]], Any] = {}


def _usage_upsert(dialect: str, names: tuple[str, ...]) -> Any:
    """The upsert adding to ``names`` of a tenant's day, on bound parameters (``b_tenant``,
    ``b_day``, ``b_<count>`` and ``add_<count>``: SQLAlchemy reserves column names in an
    INSERT); built once per dialect and set of counts."""
    key = (dialect, names)
    stmt = _usage_upserts.get(key)
    if stmt is None:
        insert = pg_insert if dialect == "postgresql" else sqlite_insert
        stmt = (
            insert(tenant_usage)
            .values({name: bindparam(f"b_{name}") for name in ("tenant", "day", *_COUNTS)})
            .on_conflict_do_update(
                index_elements=["tenant", "day"],
                set_={name: tenant_usage.c[name] + bindparam(f"add_{name}") for name in names},
            )
        )
        _usage_upserts[key] = stmt = prepared(stmt)
    return stmt


async def _add_usage(conn: AsyncConnection, tenant: str, day: str, **counts: int) -> None:
    names = tuple(sorted(counts))
    parameters: dict[str, Any] = {"b_tenant": tenant, "b_day": day}
    parameters.update({f"b_{name}": counts.get(name, 0) for name in _COUNTS})
    parameters.update({f"add_{name}": value for name, value in counts.items()})
    await conn.execute(_usage_upsert(conn.dialect.name, names), parameters)


def _quota(row: Any) -> Quota:
    return Quota(
        tenant=row.tenant,
        tokens_per_day=row.tokens_per_day,
        runs_per_minute=row.runs_per_minute,
        concurrent_runs=row.concurrent_runs,
        updated_at=row.updated_at,
    )


async def _state(
    conn: AsyncConnection, tenant: str, now: datetime, quota: Quota | None
) -> tuple[int, int, int, datetime | None]:
    """Runs in the window, running runs, tokens today, and the window's oldest start."""
    since = now - WINDOW
    window = (
        await conn.execute(
            select(func.count(), func.min(runs.c.started_at)).where(
                runs.c.tenant == tenant, runs.c.started_at > since
            )
        )
    ).first()
    running = (
        await conn.execute(
            select(func.count()).where(
                runs.c.tenant == tenant,
                runs.c.status == "running",
                runs.c.lease_expires_at > now,
            )
        )
    ).scalar_one()
    usage = (
        await conn.execute(
            select(tenant_usage.c.input_tokens + tenant_usage.c.output_tokens).where(
                tenant_usage.c.tenant == tenant, tenant_usage.c.day == day_of(now)
            )
        )
    ).scalar()
    assert window is not None
    oldest = window[1]
    if oldest is not None and oldest.tzinfo is None:
        oldest = oldest.replace(tzinfo=UTC)
    return int(window[0]), int(running), int(usage or 0), oldest


#: the tenant's quota row, built once (a run's start pays no statement construction)
_QUOTA = prepared(select(tenant_quotas).where(tenant_quotas.c.tenant == bindparam("tenant")))
_QUOTA_LOCKED = prepared(
    select(tenant_quotas).where(tenant_quotas.c.tenant == bindparam("tenant")).with_for_update()
)


async def refusal(
    conn: AsyncConnection,
    tenant: str,
    now: datetime,
    *,
    limits: Sequence[str] = LIMITS,
    lock: bool = True,
) -> QuotaExceeded | None:
    """Why a run of ``tenant`` may not start now (the first of ``limits`` that is spent), or
    None. With ``lock`` (a start: inside the lease's transaction) the tenant's quota row is
    locked on PostgreSQL, so one tenant's starts are decided one at a time on every replica."""
    # one tenant's starts, one at a time, on every replica: the row locked on PostgreSQL
    stmt = _QUOTA_LOCKED if lock and conn.dialect.name == "postgresql" else _QUOTA
    row = (await conn.execute(stmt, {"tenant": tenant})).first()
    if row is None:
        return None
    quota = _quota(row)
    in_window, running, tokens, oldest = await _state(conn, tenant, now, quota)
    if "tokens_per_day" in limits and quota.tokens_per_day is not None:
        if tokens >= quota.tokens_per_day:
            return QuotaExceeded(tenant, "tokens_per_day", quota, tokens, _seconds_to_midnight(now))
    if "runs_per_minute" in limits and quota.runs_per_minute is not None:
        if in_window >= quota.runs_per_minute:
            wait = (oldest + WINDOW - now).total_seconds() if oldest is not None else 1
            return QuotaExceeded(tenant, "runs_per_minute", quota, in_window, int(wait) + 1)
    if "concurrent_runs" in limits and quota.concurrent_runs is not None:
        if running >= quota.concurrent_runs:
            return QuotaExceeded(tenant, "concurrent_runs", quota, running, 1)
    return None


async def count_start(conn: AsyncConnection, tenant: str, now: datetime) -> None:
    """An admitted run counts in the tenant's day (inside the lease's transaction)."""
    await _add_usage(conn, tenant, day_of(now), runs=1)


async def admit(conn: AsyncConnection, tenant: str, now: datetime, *, quota: bool = True) -> None:
    """Admit a run of ``tenant`` (inside the lease's transaction) or raise QuotaExceeded;
    an admitted run counts in the tenant's day. ``quota`` False: the transaction has read
    already that the tenant has no quota row (a run's start reads it with the conversation's
    row), so there is nothing to read or to lock."""
    if quota:
        refused = await refusal(conn, tenant, now)
        if refused is not None:
            raise refused
    await count_start(conn, tenant, now)


async def settle(conn: AsyncConnection, tenant: str, now: datetime, usage: Usage) -> None:
    """Add an ended run's tokens to the tenant's day (inside the outcome's transaction)."""
    if usage.input_tokens or usage.output_tokens or usage.cache_read_tokens:
        await _add_usage(
            conn,
            tenant,
            day_of(now),
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cached_tokens=usage.cache_read_tokens,
        )


@dataclass(frozen=True)
class DayUsage:
    day: str
    runs: int
    input_tokens: int
    output_tokens: int
    cached_tokens: int


class QuotaStore:
    """Quotas and usage outside a run: the CLI and ``GET /usage``."""

    def __init__(self, engine: AsyncEngine, clock: Clock = SYSTEM_CLOCK) -> None:
        self.engine = engine
        self.clock = clock

    async def set(self, tenant: str, **limits: int | None) -> Quota:
        """Set the given limits (others kept); a limit of 0 or less removes it."""
        now = self.clock.now()
        async with write_transaction(self.engine) as conn:
            row = (
                await conn.execute(select(tenant_quotas).where(tenant_quotas.c.tenant == tenant))
            ).first()
            values = {name: getattr(row, name) if row is not None else None for name in LIMITS}
            for name, value in limits.items():
                if value is not None:
                    values[name] = value if value > 0 else None
            insert = _upsert(conn)
            stmt = insert(tenant_quotas).values(tenant=tenant, updated_at=now, **values)
            await conn.execute(
                stmt.on_conflict_do_update(
                    index_elements=["tenant"], set_={**values, "updated_at": now}
                )
            )
        return Quota(tenant=tenant, updated_at=now, **values)

    async def get(self, tenant: str) -> Quota | None:
        async with read_transaction(self.engine) as conn:
            row = (
                await conn.execute(select(tenant_quotas).where(tenant_quotas.c.tenant == tenant))
            ).first()
        return _quota(row) if row is not None else None

    async def all(self) -> Sequence[Quota]:
        async with read_transaction(self.engine) as conn:
            rows = (
                await conn.execute(select(tenant_quotas).order_by(tenant_quotas.c.tenant))
            ).all()
        return [_quota(r) for r in rows]

    async def admit_unstored(self, tenant: str) -> None:
        """Admit a response that stores nothing (``store: false`` on ``/v1``) or raise
        QuotaExceeded, as a run's start: it counts in the tenant's day. It has no run row, so
        ``runs_per_minute`` and ``concurrent_runs`` see the stored runs only."""
        now = self.clock.now()
        async with write_transaction(self.engine) as conn:
            await admit(conn, tenant, now)

    async def settle_unstored(self, tenant: str, usage: Usage) -> None:
        """Add an unstored response's tokens to the tenant's day."""
        async with write_transaction(self.engine) as conn:
            await settle(conn, tenant, self.clock.now(), usage)

    async def clear(self, tenant: str) -> bool:
        async with write_transaction(self.engine) as conn:
            done = await conn.execute(delete(tenant_quotas).where(tenant_quotas.c.tenant == tenant))
        return bool(done.rowcount)

    async def usage(self, tenant: str, days: int) -> tuple[list[DayUsage], QuotaState]:
        """The tenant's last ``days`` days (newest first, days without runs left out) and
        where it stands now."""
        now = self.clock.now()
        first = day_of(now - timedelta(days=days - 1))
        async with read_transaction(self.engine) as conn:
            rows = (
                await conn.execute(
                    select(tenant_usage)
                    .where(tenant_usage.c.tenant == tenant, tenant_usage.c.day >= first)
                    .order_by(tenant_usage.c.day.desc())
                )
            ).all()
            quota_row = (
                await conn.execute(select(tenant_quotas).where(tenant_quotas.c.tenant == tenant))
            ).first()
            quota = _quota(quota_row) if quota_row is not None else None
            in_window, running, tokens, _ = await _state(conn, tenant, now, quota)
        days_found = [
            DayUsage(r.day, r.runs, r.input_tokens, r.output_tokens, r.cached_tokens) for r in rows
        ]
        return days_found, QuotaState(quota, in_window, running, tokens)
