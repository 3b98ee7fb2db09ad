"""One classification of database errors, shared by every path that talks to the store.

:func:`classify` names what went wrong with the *database* (not with the request): the
connection was lost, the server is shutting down or cannot be reached, a transaction lost a
serialization race or a deadlock, a lock wait timed out, SQLite is busy. Anything else
(integrity errors, programming errors, our own refusals) is not a database fault and gives
``None``: the caller lets it through as it is.

Errors reach the store in many wrappings, so :func:`classify` walks the whole chain —
SQLAlchemy's ``DBAPIError`` (``InterfaceError``, ``InternalError``, ``OperationalError``, …),
its ``.orig`` (the dialect adapter's exception, which carries ``sqlstate``), the adapter's
``__cause__`` (asyncpg's own exception), ``__context__`` — and decides on the first link
that says something, preferring exception types and SQLSTATEs over message text:

======================  =========  ==========================================================
kind                    transient  what arrives
======================  =========  ==========================================================
``connection_lost``     yes        asyncpg ``ConnectionDoesNotExistError`` ("connection was
                                   closed in the middle of operation"), asyncpg
                                   ``InterfaceError`` "connection is closed",
                                   ``InternalClientError`` ("cannot switch to state 12;
                                   another operation (2) is in progress": the connection's
                                   protocol state is broken), SQLSTATE class 08, a
                                   ``DBAPIError`` with ``connection_invalidated``,
                                   ``ConnectionResetError`` / ``BrokenPipeError`` /
                                   ``ConnectionAbortedError``
``unavailable``         yes        ``ConnectionRefusedError``, any other ``OSError`` (a
                                   missing socket, an unreachable host, ``TimeoutError`` on
                                   connect — ``asyncio.TimeoutError`` is ``TimeoutError``),
                                   asyncpg ``CannotConnectNowError`` (57P03 "the database
                                   system is shutting down" / "is starting up"),
                                   ``AdminShutdownError`` (57P01 "terminating connection due
                                   to administrator command": a fast shutdown, or
                                   ``pg_terminate_backend``), ``CrashShutdownError`` (57P02),
                                   ``TooManyConnectionsError`` (53300: "too many
                                   connections for role / database", "sorry, too many
                                   clients already", "remaining connection slots are
                                   reserved"), SQLSTATE 08001/08004, SQLSTATE 55000 when it
                                   says the database "is not currently accepting
                                   connections" (``ALTER DATABASE … ALLOW_CONNECTIONS
                                   false``), SQLAlchemy's pool ``TimeoutError`` (every
                                   connection of the pool is in use)
``serialization``       yes        SQLSTATE 40001 (``SerializationError``)
``deadlock``            yes        SQLSTATE 40P01 (``DeadlockDetectedError``)
``lock_timeout``        yes        SQLSTATE 55P03 (``LockNotAvailableError``, ``lock_timeout``)
``busy``                yes        SQLite "database is locked" / "database table is locked"
                                   (``SQLITE_BUSY``, ``SQLITE_LOCKED``)
``misconfigured``       no         SQLSTATE class 28 (bad password, no such role), 3D000
                                   (no such database), 53100 (disk full), 42501 when it
                                   says "permission denied for database" (no ``CONNECT``
                                   privilege), 54000 "not accepting commands to avoid
                                   wraparound data loss"; SQLite
                                   ``SQLITE_CANTOPEN`` ("unable to open database file"),
                                   ``SQLITE_FULL``, ``SQLITE_READONLY``: the database is
                                   there but unusable until an operator acts
======================  =========  ==========================================================

Call it on what a database call raised: a bare ``OSError`` is read as the database's network
failing, which is only true there.

Transient faults are retried where that is safe (:func:`retry_transient`; the caller decides
what is safe: a write under its lease fence, a read); the rest, and transient ones that stay,
become ``503 database-unavailable`` with ``Retry-After`` (:attr:`DbFault.retry_after`).

What retrying a write means: a ``connection_lost`` during ``COMMIT`` leaves the outcome
unknown (the commit may have happened). Only retry writes that are idempotent — conditional
on a version or a lease, so a second application is refused or changes nothing.
"""

from __future__ import annotations

import asyncio
import random
import re
import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Literal, TypeVar

import asyncpg.exceptions as _pg  # type: ignore[import-untyped]
import sqlalchemy.exc

from .errors import StoreError

__all__ = [
    "DatabaseUnavailable",
    "DbFault",
    "FaultKind",
    "classify",
    "retry_transient",
]

FaultKind = Literal[
    "connection_lost",
    "unavailable",
    "serialization",
    "deadlock",
    "lock_timeout",
    "busy",
    "misconfigured",
]

_TRANSIENT: dict[FaultKind, bool] = {
    "connection_lost": True,
    "unavailable": True,
    "serialization": True,
    "deadlock": True,
    "lock_timeout": True,
    "busy": True,
    "misconfigured": False,
}

# Seconds a client is told to wait (``Retry-After``) when the fault is not retried away.
_RETRY_AFTER: dict[FaultKind, int] = {
    "connection_lost": 1,
    "unavailable": 2,
    "serialization": 1,
    "deadlock": 1,
    "lock_timeout": 1,
    "busy": 1,
    "misconfigured": 30,
}


@dataclass(frozen=True)
class DbFault:
    """What went wrong with the database, and whether trying again can help."""

    kind: FaultKind
    detail: str
    sqlstate: str | None = None

    @property
    def transient(self) -> bool:
        return _TRANSIENT[self.kind]

    @property
    def retry_after(self) -> int:
        """Seconds for a ``Retry-After`` header (at least 1)."""
        return _RETRY_AFTER[self.kind]


class DatabaseUnavailable(Exception):
    """The database could not do what was asked (a :class:`DbFault`, retried or not).

    The API layer answers it with ``503 database-unavailable`` and ``Retry-After``.
    """

    def __init__(self, fault: DbFault) -> None:
        super().__init__(f"database {fault.kind.replace('_', ' ')}: {fault.detail}")
        self.fault = fault


# --- classification ---------------------------------------------------------------------------

_SQLSTATE_KIND: dict[str, FaultKind] = {
    "40001": "serialization",
    "40P01": "deadlock",
    "55P03": "lock_timeout",
    "57P01": "unavailable",  # admin_shutdown (fast shutdown, pg_terminate_backend)
    "57P02": "unavailable",  # crash_shutdown
    "57P03": "unavailable",  # cannot_connect_now (shutting down, starting up, recovery)
    "53300": "unavailable",  # too_many_connections
    "08001": "unavailable",  # sqlclient_unable_to_establish_sqlconnection
    "08004": "unavailable",  # sqlserver_rejected_establishment_of_sqlconnection
    "3D000": "misconfigured",  # invalid_catalog_name
    "53100": "misconfigured",  # disk_full
}

# Message text, for links that carry no type or SQLSTATE worth trusting (an adapter error
# whose ``sqlstate`` is None, a re-raised string). Only consulted on database exceptions.
_MESSAGE_PATTERNS: tuple[tuple[str, FaultKind], ...] = (
    (r"database (?:table )?is locked|database is busy", "busy"),
    (r"unable to open database file|database or disk is full", "misconfigured"),
    (r"could not serialize access", "serialization"),
    (r"deadlock detected", "deadlock"),
    (r"lock timeout|could not obtain lock", "lock_timeout"),
    (
        r"the database system is (?:shutting down|starting up|in recovery mode|not yet "
        r"accepting connections)|terminating connection due to administrator command|"
        r"too many (?:clients|connections)|connection refused|could not connect to server|"
        r"remaining connection slots are reserved|not currently accepting connections|"
        r"the database system is not accepting connections|no more connections allowed",
        "unavailable",
    ),
    (
        r"connection (?:was )?closed|connection is closed|connection reset|broken pipe|"
        r"server closed the connection|connection has been lost|"
        r"cannot switch to state|another operation (?:\(\d+\) )?is in progress|"
        r"connection was lost|unexpected connection_lost",
        "connection_lost",
    ),
)
_MESSAGES = tuple((re.compile(p, re.IGNORECASE), kind) for p, kind in _MESSAGE_PATTERNS)

_MAX_CHAIN = 16


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and everything it wraps, each once: ``.orig`` and ``__cause__`` always, and
    ``__context__`` of database exceptions only — an exception of ours raised while handling
    a database error (a ``Conflict`` after a busy retry) is not that error."""
    seen: set[int] = set()
    todo = [exc]
    while todo and len(seen) < _MAX_CHAIN:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        nexts = [getattr(current, "orig", None), current.__cause__]
        if _is_database_exception(current) or isinstance(current, OSError):
            nexts.append(current.__context__)
        for nxt in nexts:
            if isinstance(nxt, BaseException) and id(nxt) not in seen:
                todo.append(nxt)


def _detail(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__


def _sqlstate(exc: BaseException) -> str | None:
    value = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
    return value if isinstance(value, str) and len(value) == 5 else None


def _is_database_exception(exc: BaseException) -> bool:
    if isinstance(exc, sqlalchemy.exc.DBAPIError | sqlite3.Error):
        return True
    module = type(exc).__module__
    return module.startswith(("asyncpg", "sqlalchemy", "aiosqlite"))


def _by_type(exc: BaseException) -> FaultKind | None:
    if isinstance(exc, _pg.InternalClientError):
        return "connection_lost"  # the connection's protocol state is broken
    if isinstance(exc, _pg.InterfaceError):
        message = str(exc).lower()
        if "closed" in message or "in progress" in message or "lost" in message:
            return "connection_lost"
        return None
    if isinstance(exc, ConnectionRefusedError):
        return "unavailable"
    if isinstance(exc, sqlalchemy.exc.TimeoutError):  # the pool has no connection to give
        return "unavailable"
    if isinstance(exc, ConnectionResetError | BrokenPipeError | ConnectionAbortedError):
        return "connection_lost"
    if isinstance(exc, OSError):  # no socket, no route, TimeoutError on connect, gaierror
        return "unavailable"
    if isinstance(exc, sqlite3.OperationalError):
        code = getattr(exc, "sqlite_errorcode", None)
        if code is None:
            return None
        primary = code & 0xFF  # extended codes (SQLITE_BUSY_SNAPSHOT, …) keep the primary
        if primary in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            return "busy"
        if primary in (sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_FULL, sqlite3.SQLITE_READONLY):
            return "misconfigured"
    return None


_CONNECT = re.compile(r"permission denied for database|CONNECT privilege", re.I)
# SQLSTATEs that are a refusal of the connection only when their message says so (55000 and
# 42501 are also what many statements raise for reasons of their own)
_SQLSTATE_MESSAGE_KIND: tuple[tuple[str, re.Pattern[str], FaultKind], ...] = (
    ("55000", re.compile(r"not currently accepting connections", re.I), "unavailable"),
    ("42501", _CONNECT, "misconfigured"),
    ("54000", re.compile(r"not accepting commands", re.I), "misconfigured"),
)


def _by_sqlstate(state: str, exc: BaseException | None = None) -> FaultKind | None:
    if state in _SQLSTATE_KIND:
        return _SQLSTATE_KIND[state]
    for qualified, pattern, kind in _SQLSTATE_MESSAGE_KIND:
        if state == qualified and exc is not None and pattern.search(str(exc)):
            return kind
    if state.startswith("08"):
        return "connection_lost"
    if state.startswith("28"):
        return "misconfigured"
    return None


def classify(exc: BaseException) -> DbFault | None:
    """The database fault ``exc`` reports, or ``None`` when it is not one (see module doc)."""
    if isinstance(exc, DatabaseUnavailable):
        return exc.fault
    if isinstance(exc, StoreError):
        return None  # a refusal of ours, whatever it was raised from
    links = list(_chain(exc))
    # 1. types and SQLSTATEs, the innermost (most specific) link first
    for link in reversed(links):
        kind = _by_type(link)
        state = _sqlstate(link)
        if kind is None and state is not None:
            kind = _by_sqlstate(state, link)
        if kind is not None:
            return DbFault(kind, _detail(link), state)
    # 2. SQLAlchemy saw the connection die (its is_disconnect): a lost connection
    for link in links:
        if isinstance(link, sqlalchemy.exc.DBAPIError) and link.connection_invalidated:
            orig: BaseException = link.orig if link.orig is not None else link
            return DbFault("connection_lost", _detail(orig), _sqlstate(orig))
    # 3. message text, on database exceptions only
    for link in reversed(links):
        if not _is_database_exception(link):
            continue
        text = str(link)
        for pattern, kind in _MESSAGES:
            if pattern.search(text):
                return DbFault(kind, _detail(link), _sqlstate(link))
    return None


# --- retrying ---------------------------------------------------------------------------------

T = TypeVar("T")


async def retry_transient(
    fn: Callable[[], Awaitable[T]],
    *,
    attempts: int | None = None,
    deadline: float | None = None,
    base_delay: float = 0.05,
    max_delay: float = 2.0,
    jitter: float = 0.2,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    rng: Callable[[], float] = random.random,
    on_retry: Callable[[DbFault, int, float], object] | None = None,
) -> T:
    """``await fn()``, again after each transient database fault, with exponential backoff.

    Bounded by ``attempts`` (calls of ``fn`` in all) and/or ``deadline`` (seconds from now on
    ``clock``; no retry is started whose wait would end past it). At least one bound is
    required. The waits are ``base_delay``, doubling up to ``max_delay``, each scaled by a
    random factor in ``[1 - jitter, 1 + jitter]`` (so many clients retrying after the same
    restart spread out). Anything that is not a transient fault is raised at once; when the
    bound is reached, the last fault's exception is raised. ``on_retry(fault, attempt, delay)``
    is called before each wait (for logs and metrics). Cancellation is never caught.
    """
    if attempts is None and deadline is None:
        raise ValueError("retry_transient needs attempts= or deadline=")
    if attempts is not None and attempts < 1:
        raise ValueError("attempts must be at least 1")
    give_up_at = None if deadline is None else clock() + deadline
    delay = base_delay
    attempt = 0
    while True:
        attempt += 1
        try:
            return await fn()
        except Exception as exc:
            fault = classify(exc)
            if fault is None or not fault.transient:
                raise
            if attempts is not None and attempt >= attempts:
                raise
            wait = min(delay, max_delay) * (1.0 + jitter * (2.0 * rng() - 1.0))
            wait = max(0.0, wait)
            if give_up_at is not None and clock() + wait > give_up_at:
                raise
            if on_retry is not None:
                on_retry(fault, attempt, wait)
            await sleep(wait)
            delay = min(delay * 2.0, max_delay)
