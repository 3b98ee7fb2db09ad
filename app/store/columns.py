"""The column types of the tables (``app/store/tables.py``): JSON values stored as JSON *text*
(``JSONText``), not as a database JSON type (PostgreSQL's ``jsonb`` would reorder keys and
normalise numbers, and the store gives back exactly what it was given), and timezone-aware UTC
timestamps on both engines (``UTCDateTime``)."""

from __future__ import annotations

import json
import weakref
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import DateTime as _DateTime
from sqlalchemy import Dialect, Text, TypeDecorator

from app.agent.codec import compact_json
from app.clock import SYSTEM_CLOCK

from .errors import StoredRecordDamaged


class Dumped(str):
    """JSON text already dumped as :class:`JSONText` would dump it: bound as it is (so a
    writer that needs the text's size dumps a value once)."""

    __slots__ = ()


def dump_json(value: Any) -> str:
    """``value`` as :class:`JSONText` stores it: compact JSON text (a :class:`Dumped` as it is)."""
    if isinstance(value, Dumped):
        return str(value)
    return compact_json(value)


class JSONText(TypeDecorator[Any]):
    """Any JSON value, stored as compact JSON text and given back decoded."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> str | None:
        if value is None:
            return None
        return dump_json(value)

    def process_result_value(self, value: str | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        try:
            return json.loads(value)
        except ValueError as exc:  # written around the service: refused, never a 500
            raise StoredRecordDamaged(f"it is not JSON: {exc}") from None


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp (SQLite keeps no zone; it is put back on read)."""

    impl = _DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)

    def bind_processor(self, dialect: Dialect) -> _BindProcessor | None:
        """On SQLite: SQLAlchemy's processing (:meth:`process_bind_param`, then SQLite's
        ``DATETIME`` text), remembered for the last few timestamps bound. A transaction binds
        its one "now" in many rows (the run row, the lease, the transcript's entries, the
        events, the usage) and columns; each is formatted once, whichever column binds it
        first (every column of this type gives the same text on one dialect). Aware
        timestamps at the same instant are equal and give the same UTC text; a naive one is
        never remembered (it is refused)."""
        process = super().bind_processor(dialect)
        if process is None or dialect.name != "sqlite":
            return process
        memo = _memos.get(dialect)
        if memo is None:
            memo = _memos[dialect] = {}
        return _remembered(process, memo)


_BindProcessor = Callable[[Any], Any]
_REMEMBERED = 32
#: per dialect, the text of the last instants bound, shared by every column of the type
_memos: weakref.WeakKeyDictionary[Dialect, dict[datetime, Any]] = weakref.WeakKeyDictionary()


def _remembered(process: _BindProcessor, memo: dict[datetime, Any]) -> _BindProcessor:

    def bind(value: Any) -> Any:
        if value is None:
            return None
        try:
            return memo[value]
        except KeyError:
            pass
        bound = process(value)
        if value.tzinfo is not None:  # (a naive one was refused by process)
            if len(memo) >= _REMEMBERED:
                memo.clear()
            memo[value] = bound
        return bound

    return bind


def utcnow() -> datetime:
    """The system clock's time (tests and tools; the store reads its injected clock)."""
    return SYSTEM_CLOCK.now()
