"""PostgreSQL on asyncpg, with a transaction's held inserts sent in one statement.

Each statement is a round trip to the server: on asyncpg through SQLAlchemy ~0.1-0.2 ms of this
process's CPU, and the server's own. A run's outcome writes ten tables whose rows nobody reads
back in the transaction (records, transcript, events, texts, the webhook outbox). On SQLite
they ride with the next call into the driver's thread (:mod:`app.store.sqlite_driver`); here the
same request, :func:`app.store.db.defer_inserts`, holds them on the connection
(:class:`KeepingConnection`) and sends them as data-modifying ``WITH`` clauses of one
statement: the transaction's next statement when that statement cannot see what they write,
else a statement of their own just before it, and at the latest just before the ``COMMIT``.
What they write, their order of effect for anything the transaction later reads, and their
errors (raised by the statement they ride with; the transaction then rolls back, as it would
have) are unchanged.

PostgreSQL runs the parts of one statement on one snapshot, so a part does not see the rows
another part writes. What rides together is therefore limited to what cannot tell:

- only ``INSERT … VALUES`` (no ``SELECT``, no ``RETURNING``): it reads nothing, but for its
  constraints, which PostgreSQL checks across the whole statement as it would one by one (a
  unique key taken twice fails either way);
- an ``INSERT … ON CONFLICT`` rides with no other write to its table (the conflict it looks for
  could be a sibling's row), and one of several rows ``DO UPDATE`` only when the rows' keys
  differ (one statement cannot update a row twice);
- the statement they ride with names none of their tables; otherwise they go just before it.

Only plain ``INSERT`` statements executed while inserts are held are concerned; everything else
(reads, updates, the ``BEGIN`` and ``COMMIT``, prepared-statement caching, error translation,
disconnect detection) is SQLAlchemy's ``postgresql+asyncpg`` unchanged. With a statement
listener on the engine or the connection (tracing, a test counting statements) nothing is held,
as on SQLite. A prepared statement reaches the connection from
:mod:`app.store.direct` without SQLAlchemy's execution (:meth:`KeepingConnection.execute_direct`),
and is held or run by the same cursor.

:func:`app.store.db.make_engine` uses it for every PostgreSQL URL; it relies on SQLAlchemy
2.1's asyncpg adapter classes, which ``pyproject.toml`` pins.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

from sqlalchemy.dialects import registry
from sqlalchemy.dialects.postgresql.asyncpg import (
    AsyncAdapt_asyncpg_connection,
    AsyncAdapt_asyncpg_cursor,
    AsyncAdapt_asyncpg_dbapi,
    PGDialect_asyncpg,
)
from sqlalchemy.util.concurrency import await_

from .held import HoldsInserts

#: the drivername :func:`app.store.db.make_engine` gives PostgreSQL URLs
DRIVERNAME = "postgresql+carryover_asyncpg"

#: the most bound values one statement carries with what rides on it (asyncpg's limit is 32,767)
MAX_PARAMETERS = 8192
#: the most rows of one ``executemany`` held: each count is a statement text of its own (a
#: prepared statement on the server), so a bulk insert goes on its own, as asyncpg pipelines it
MAX_HELD_ROWS = 64

#: a string literal (skipped) or a parameter ``$n``
_TOKEN = re.compile(r"'(?:[^']|'')*'|\$(\d+)")
_INSERT = re.compile(r'INSERT INTO ("[^"]+"|[A-Za-z_][A-Za-z0-9_.]*) ')
_VALUES = " VALUES "


@dataclass(frozen=True, slots=True)
class Held:
    """An ``INSERT`` held for the transaction's next statement: its text (one ``VALUES`` row per
    row of ``parameters``), its table, and whether it has an ``ON CONFLICT`` clause."""

    operation: str
    parameters: tuple[Any, ...]
    table: str
    on_conflict: bool


#: the statement texts of one process are few (SQLAlchemy compiles each once): what is worked
#: out of a text is kept, so that holding, renumbering and joining cost a lookup per statement
_cached = functools.lru_cache(maxsize=1024)


@_cached
def holdable(operation: str, rows: int) -> Held | None:
    """``operation`` with ``rows`` rows as a :class:`Held` with no parameters yet, or None when
    it may not ride with another statement (module docstring)."""
    if not _plain(operation) or "SELECT" in operation or "RETURNING" in operation:
        return None
    table = _INSERT.match(operation)
    if table is None:
        return None
    on_conflict = " ON CONFLICT " in operation
    if rows != 1:
        many = _many_rows(operation, rows)
        if many is None:
            return None
        operation = many
    return Held(operation, (), table.group(1), on_conflict)


_CONFLICT_KEYS = re.compile(r" ON CONFLICT \(([^()]*)\) DO UPDATE ")
_COLUMNS = re.compile(r"INSERT INTO \S+ \(([^()]*)\) VALUES ")


def distinct_keys(operation: str, rows: list[Any]) -> bool:
    """Whether the ``rows`` of an ``INSERT … ON CONFLICT (key columns) DO UPDATE`` name
    different keys: several rows of one statement may then each insert or update a row of
    their own, as they would one by one. False when it cannot tell."""
    keys = _CONFLICT_KEYS.search(operation)
    columns = _COLUMNS.match(operation)
    if keys is None or columns is None:
        return False
    names = [name.strip() for name in columns.group(1).split(",")]
    values = operation[columns.end() :]
    numbers = _numbers(values[: values.find(")") + 1])
    if numbers != list(range(1, len(names) + 1)):
        return False  # the values are not the columns' parameters in order
    try:
        at = [names.index(key.strip()) for key in keys.group(1).split(",")]
    except ValueError:
        return False
    try:
        seen = {tuple(row[i] for i in at) for row in rows}
    except (TypeError, IndexError):  # not positional rows, or unhashable values
        return False
    return len(seen) == len(rows)


def _many_rows(operation: str, rows: int) -> str | None:
    """``operation`` (one ``VALUES`` row of ``$1 … $n``) with ``rows`` rows, numbered on."""
    at = operation.find(_VALUES)
    if at < 0 or operation.count(_VALUES) != 1:
        return None
    start = at + len(_VALUES)
    if operation[start : start + 1] != "(":
        return None
    depth = 0
    for end in range(start, len(operation)):
        depth += {"(": 1, ")": -1}.get(operation[end], 0)
        if depth == 0:
            break
    else:
        return None
    row = operation[start : end + 1]
    width = len(_numbers(row))
    if width == 0 or width != len(_numbers(operation)):
        return None
    values = ", ".join(_shifted(row, width * i) for i in range(rows))
    return operation[:start] + values + operation[end + 1 :]


def _plain(operation: str) -> bool:
    """Whether :data:`_TOKEN` reads ``operation`` right: no dollar-quoted text and no backslash
    (which an ``E'…'`` literal, or one without standard-conforming strings, escapes with)."""
    return "$$" not in operation and "\\" not in operation


def _numbers(operation: str) -> list[int]:
    """The numbers of ``operation``'s parameters, in order, outside its string literals."""
    return [int(m.group(1)) for m in _TOKEN.finditer(operation) if m.group(1)]


@_cached
def _shifted(operation: str, offset: int) -> str:
    """``operation`` with its parameters ``$n`` numbered from ``offset + 1`` (not within its
    string literals)."""
    if offset == 0:
        return operation
    return _TOKEN.sub(
        lambda m: f"${int(m.group(1)) + offset}" if m.group(1) else m.group(0), operation
    )


@_cached
def _names(operation: str, table: str) -> bool:
    """Whether ``operation`` names ``table`` (a word of it: a column of the same name counts,
    which only costs a statement of their own to what was held)."""
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(table)}(?![A-Za-z0-9_])", operation) is not None


def groups(held: list[Held]) -> list[list[Held]]:
    """``held`` in order, cut where one could see another (an ``ON CONFLICT`` insert beside
    another write to its table) or where the bound values would pass :data:`MAX_PARAMETERS`."""
    out: list[list[Held]] = []
    group: list[Held] = []
    tables: dict[str, bool] = {}  # table -> a write with ON CONFLICT to it is in the group
    size = 0
    for one in held:
        clash = one.table in tables and (one.on_conflict or tables[one.table])
        if group and (clash or size + len(one.parameters) > MAX_PARAMETERS):
            out.append(group)
            group, tables, size = [], {}, 0
        group.append(one)
        tables[one.table] = tables.get(one.table, False) or one.on_conflict
        size += len(one.parameters)
    if group:
        out.append(group)
    return out


def fused(
    group: list[Held], operation: str, parameters: tuple[Any, ...]
) -> tuple[str, tuple[Any, ...]]:
    """One statement: each held insert of ``group`` as a ``WITH`` clause, then ``operation``."""
    text = _fused_text(
        tuple(one.operation for one in group),
        tuple(len(one.parameters) for one in group),
        operation,
    )
    values = [value for one in group for value in one.parameters]
    return text, (*values, *parameters)


@_cached
def _fused_text(operations: tuple[str, ...], widths: tuple[int, ...], operation: str) -> str:
    clauses = []
    offset = 0
    for i, (held, width) in enumerate(zip(operations, widths, strict=True)):
        clauses.append(f"carryover_held_{i} AS ({_shifted(held, offset)})")
        offset += width
    return f"WITH {', '.join(clauses)} {_shifted(operation, offset)}"


def rides(group: list[Held], operation: str, parameters: tuple[Any, ...]) -> bool:
    """Whether ``group`` may ride with ``operation``: it starts no ``WITH`` of its own, its
    text reads plainly (:func:`_plain`), it names none of the group's tables, and the values
    stay within bounds."""
    if sum(len(one.parameters) for one in group) + len(parameters) > MAX_PARAMETERS:
        return False
    return _may_carry(operation) and not any(_names(operation, one.table) for one in group)


@_cached
def _may_carry(operation: str) -> bool:
    return operation.lstrip()[:4].upper() != "WITH" and _plain(operation)


class KeepingCursor(AsyncAdapt_asyncpg_cursor):
    """A cursor whose statement carries, or follows, what its connection holds."""

    __slots__ = ()

    async def _prepare_and_execute(self, operation: Any, parameters: Any) -> None:
        connection: KeepingConnection = self._adapt_connection  # type: ignore[assignment]
        if connection.held:
            parameters = tuple(parameters or ())
            last = connection.take_groups()
            await connection.send(last[:-1])
            if not self.server_side and rides(last[-1], operation, parameters):
                operation, parameters = fused(last[-1], operation, parameters)
            else:
                await connection.send(last[-1:])
        await super()._prepare_and_execute(operation, parameters)  # type: ignore[no-untyped-call]

    async def _executemany(self, operation: Any, seq_of_parameters: Any) -> Any:
        connection: KeepingConnection = self._adapt_connection  # type: ignore[assignment]
        if connection.held:
            await connection.send(connection.take_groups())
        return await super()._executemany(operation, seq_of_parameters)  # type: ignore[no-untyped-call]


class KeepingConnection(AsyncAdapt_asyncpg_connection):
    """The driver connection, with the inserts it holds (module docstring)."""

    __slots__ = ("held", "holding")
    _cursor_cls = KeepingCursor

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        #: plain inserts are held until the transaction's next statement (set by
        #: :func:`app.store.db.defer_inserts`, cleared when the transaction ends)
        self.holding = False
        self.held: list[Held] = []

    def offer_insert(self, operation: str, parameters: Any, many: bool) -> bool:
        """Hold a plain insert while inserts are held (:mod:`app.store.held`) and it may ride
        (:meth:`hold`); False: run it now."""
        return self.holding and self.hold(operation, parameters, many)

    def hold(self, operation: str, parameters: Any, many: bool) -> bool:
        """Hold ``operation`` when it may ride (:func:`holdable`); False: run it now."""
        rows = list(parameters) if many else [parameters]
        if len(rows) > MAX_HELD_ROWS:
            return False
        if len(rows) > 1 and " DO UPDATE " in operation and not distinct_keys(operation, rows):
            return False  # one statement cannot update a row twice: they go one by one
        found = holdable(operation, len(rows))
        if found is None:
            return False
        values = tuple(value for row in rows for value in (row or ()))
        if len(values) > MAX_PARAMETERS:
            return False
        self.held.append(Held(found.operation, values, found.table, found.on_conflict))
        return True

    async def execute_direct(
        self, operation: str, parameters: Any, *, many: bool, insert: bool
    ) -> tuple[Any, int, tuple[Any, ...] | None]:
        """A statement from outside SQLAlchemy's execution (app/store/direct.py), run as the
        adapter's cursor runs SQLAlchemy's: a plain ``INSERT`` (``insert``) while inserts are
        held is held (:meth:`offer_insert`, as SQLAlchemy's are); anything
        else goes through the cursor (what is held rides with it or goes first, the
        transaction starts if it has not, errors come out translated). Its rows, if any,
        its row count (-1 when held or for several rows) and its columns' types as the
        server reported them (their result processing may depend on them)."""
        if insert and self.offer_insert(operation, parameters, many):
            return None, -1, None
        cursor: KeepingCursor = self.cursor()
        if many:
            await cursor._executemany(operation, parameters)
            return None, -1, None
        await cursor._prepare_and_execute(operation, parameters)
        described = cursor.description
        types = tuple(column[1] for column in described) if described else None
        return cursor._rows, cursor.rowcount, types

    def take_groups(self) -> list[list[Held]]:
        held, self.held = self.held, []
        return groups(held)

    async def send(self, groups: list[list[Held]]) -> None:
        """Each group as one statement of its own: its last insert with the others riding."""
        for group in groups:
            last = group[-1]
            operation, parameters = (
                fused(group[:-1], last.operation, last.parameters)
                if len(group) > 1
                else (last.operation, last.parameters)
            )
            async with self._execute_mutex:
                if self._transaction is None:
                    await self._start_transaction()  # type: ignore[no-untyped-call]
                try:
                    prepared, _ = await self._prepare(operation, self._invalidate_schema_cache_asof)  # type: ignore[no-untyped-call]
                    await prepared.fetch(*parameters)
                except Exception as error:
                    self._handle_exception(error)

    def cursor(self, server_side: bool = False) -> Any:
        if server_side and self.held:  # a streamed result: what is held goes first
            await_(self.send(self.take_groups()))
        return super().cursor(server_side)

    def commit(self) -> None:
        self.holding = False
        if self.held:  # what is held, then the COMMIT (not reached if it fails)
            await_(self.send(self.take_groups()))
        super().commit()  # type: ignore[no-untyped-call]

    def rollback(self) -> None:
        self.holding, self.held = False, []
        super().rollback()  # type: ignore[no-untyped-call]


class KeepingDBAPI(AsyncAdapt_asyncpg_dbapi):
    def connect(self, *arg: Any, **kw: Any) -> KeepingConnection:
        creator_fn = kw.pop("async_creator_fn", self.asyncpg.connect)
        cache_size = kw.pop("prepared_statement_cache_size", 100)
        name_func = kw.pop("prepared_statement_name_func", None)
        return await_(
            KeepingConnection.create(
                self,
                creator_fn(*arg, **kw),
                prepared_statement_cache_size=cache_size,
                prepared_statement_name_func=name_func,
            )
        )


class KeepingPGDialect(HoldsInserts, PGDialect_asyncpg):
    driver = "carryover_asyncpg"
    supports_statement_cache = True

    @classmethod
    def import_dbapi(cls) -> Any:
        return KeepingDBAPI(__import__("asyncpg"))  # type: ignore[no-untyped-call]


registry.register("postgresql.carryover_asyncpg", __name__, "KeepingPGDialect")

dialect = KeepingPGDialect

__all__ = ["DRIVERNAME", "KeepingPGDialect"]
