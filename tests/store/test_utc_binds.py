"""UTC timestamps bound on SQLite: SQLAlchemy's processing of one instant is done once and
remembered for the next rows that bind it (a transaction binds its one "now" in many rows);
what is bound is what the processing gives. Counts, never timings."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy.dialects import postgresql

from app.store.columns import UTCDateTime
from app.store.sqlite_driver import OneHopSQLiteDialect


def test_an_instant_is_processed_once_and_bound_the_same(monkeypatch: Any) -> None:
    calls = _counted(monkeypatch)
    bind = _bind(OneHopSQLiteDialect())
    assert bind is not None
    now = datetime(2026, 12, 6, 3, 4, 5, 678901, tzinfo=UTC)
    same_instant = now.astimezone(timezone(timedelta(hours=2)))
    first = bind(now)
    assert first == "2026-12-06 03:04:05.678901"
    assert [bind(now), bind(same_instant), bind(now)] == [first] * 3
    assert calls == [now]
    assert bind(None) is None
    later = now + timedelta(microseconds=1)
    assert bind(later) == "2026-12-06 03:04:05.678902"
    assert calls == [now, later]


def test_a_naive_timestamp_is_still_refused_every_time() -> None:
    bind = _bind(OneHopSQLiteDialect())
    assert bind is not None
    naive = datetime(2026, 12, 6, 3, 4, 5)
    bind(naive.replace(tzinfo=UTC))  # the same wall time, aware, remembered
    for _ in range(2):
        with pytest.raises(ValueError, match="naive"):
            bind(naive)


def test_postgresql_binds_are_not_remembered(monkeypatch: Any) -> None:
    calls = _counted(monkeypatch)
    bind = _bind(postgresql.dialect())
    now = datetime(2026, 12, 6, 3, 4, 5, tzinfo=UTC)
    if bind is None:  # asyncpg takes the datetime as it is: processed per call by SQLAlchemy
        return
    bind(now)
    bind(now)
    assert calls == [now, now]


def _bind(dialect: Any) -> Any:
    """The processor SQLAlchemy uses: that of the type as adapted to the dialect."""
    return UTCDateTime().dialect_impl(dialect).bind_processor(dialect)


def test_an_instant_is_processed_once_whichever_column_binds_it(monkeypatch: Any) -> None:
    calls = _counted(monkeypatch)
    dialect = OneHopSQLiteDialect()
    created, finished = _bind(dialect), _bind(dialect)  # two columns of the type
    now = datetime(2026, 12, 7, 3, 4, 5, 678901, tzinfo=UTC)
    assert created(now) == finished(now) == "2026-12-07 03:04:05.678901"
    assert calls == [now]
    other = _bind(OneHopSQLiteDialect())  # another engine's dialect: its own
    assert other(now) == "2026-12-07 03:04:05.678901"
    assert calls == [now, now]


def _counted(monkeypatch: Any) -> list[datetime]:
    """The values SQLAlchemy's processing of the type is called with, from now on."""
    calls: list[datetime] = []
    original = UTCDateTime.process_bind_param

    def counted(self: UTCDateTime, value: Any, dialect: Any) -> Any:
        calls.append(value)
        return original(self, value, dialect)

    monkeypatch.setattr(UTCDateTime, "process_bind_param", counted)
    return calls
