"""A run's hot statements straight on the driver, without SQLAlchemy's per-statement path.

A statement built once at import (:func:`prepared`) is compiled once per set of parameter
names. On the engines :func:`app.store.db.make_engine` makes, executing it then binds its
parameters with the same type processors SQLAlchemy uses and hands it to the driver connection's
``execute_direct``:

- SQLite's one-hop driver (:mod:`app.store.sqlite_driver`: one call into aiosqlite's thread, or
  none for an insert that rides with the next call);
- PostgreSQL's (:mod:`app.store.pg_driver`): the adapter's cursor, as SQLAlchemy would call it
  (or the held inserts, for an insert while they are held).

The rows come back as a buffered :class:`sqlalchemy.engine.Result` through the result
processors SQLAlchemy would pick for the column types the driver reported (on PostgreSQL some
depend on them: a ``numeric`` column's, for one).

What SQLAlchemy does per statement besides (the compiled-cache lookup, an execution context, a
cursor result, a greenlet switch) costs more CPU than the database running the statement: about
0.1 ms per statement, 16 statements per run (docs/performance.md, "SQL straight on the driver").

Everything else takes SQLAlchemy's own path, unchanged: a statement not marked
:func:`prepared`; execution options; a statement that needs what only SQLAlchemy does (Python-side
column defaults, expanding ``IN`` parameters, escaped parameter names, ``RETURNING`` in an
``executemany``); and every statement while an event listener is on the engine or the connection
(tracing's SQLAlchemy instrumentation, a test counting statements), so listeners see every
statement as before. Errors are SQLAlchemy's: what the driver raises goes through the
connection's own exception handling (wrapping, disconnect detection, invalidation), so an
``IntegrityError`` or a fault (app/store/faults.py) reads the same on both paths.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from sqlalchemy.engine import Dialect
from sqlalchemy.engine.result import IteratorResult, SimpleResultMetaData
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.util.concurrency import greenlet_spawn

from . import pg_driver, sqlite_driver

#: the connection's execution options the driver applies when the transaction begins (the
#: same on either path); with any other, statements take SQLAlchemy's path
_AT_BEGIN = frozenset({"isolation_level", "postgresql_readonly", "postgresql_deferrable"})

#: the driver connections that run a statement from outside SQLAlchemy's execution
_Driver = sqlite_driver.OneHopConnection | pg_driver.KeepingConnection
_DRIVERS = (sqlite_driver.OneHopConnection, pg_driver.KeepingConnection)  # for isinstance

S = TypeVar("S", bound=Executable)

#: the attribute of a :func:`prepared` statement holding its compiled forms
_CACHE = "_carryover_direct"


def prepared(statement: S) -> S:
    """Mark ``statement`` (built once, kept for the process) to be executed straight on the
    driver where it can be (module docstring)."""
    setattr(statement, _CACHE, {})
    return statement


class DirectResult(IteratorResult[Any]):
    """A buffered result with the ``rowcount`` a DML statement's caller reads."""

    rowcount: int


#: (the parameter key a bound value reads, or None for a fixed value; the fixed value; its
#: bind processor), in the statement's positional order
_Bind = tuple[str | None, Any, Callable[[Any], Any] | None]


@dataclass(frozen=True)
class _Plan:
    sql: str
    binds: tuple[_Bind, ...]
    insert: bool  # a plain INSERT (no RETURNING): may ride with the next call
    #: the compiled statement's result columns, when rows come back
    columns: tuple[Any, ...] | None
    #: the result's keys and processors, by the column types the driver reported (None:
    #: none reported, as SQLite's driver)
    results: dict[tuple[Any, ...] | None, SimpleResultMetaData] = field(default_factory=dict)

    def metadata(self, dialect: Dialect, types: tuple[Any, ...] | None) -> SimpleResultMetaData:
        """The rows' keys and processors: each column's type's result processor for the
        type the driver reported for it, as SQLAlchemy's result does."""
        if self.columns is None:
            return _NO_ROWS
        found = self.results.get(types)
        if found is None:
            reported = types or (None,) * len(self.columns)
            found = self.results[types] = SimpleResultMetaData(
                [c.keyname for c in self.columns],
                extra=[c.objects for c in self.columns],
                _processors=[
                    c.type._cached_result_processor(dialect, coltype)
                    for c, coltype in zip(self.columns, reported, strict=True)
                ],
            )
        return found


def _plan(statement: Executable, dialect: Dialect, keys: list[str], many: bool) -> _Plan | None:
    compiled = cast(
        SQLCompiler,
        statement.compile(dialect=dialect, column_keys=keys, for_executemany=many),  # type: ignore[attr-defined]
    )
    if (
        not compiled.positional
        or compiled.positiontup is None
        or compiled.insert_prefetch
        or compiled.update_prefetch
        or compiled.post_compile_params
        or compiled.literal_execute_params
        or compiled.escaped_bind_names
        or (many and compiled.effective_returning)
    ):
        return None
    processors = compiled._bind_processors
    binds: list[_Bind] = []
    for name in compiled.positiontup:
        bind = compiled.binds[name]
        if bind.callable is not None:
            return None
        processor = cast("Callable[[Any], Any] | None", processors.get(name))
        if bind.key in keys:
            binds.append((bind.key, None, processor))
        elif bind.required:  # SQLAlchemy's path raises its error
            return None
        else:
            binds.append((None, bind.value, processor))
    return _Plan(
        sql=compiled.string,
        binds=tuple(binds),
        insert=bool(compiled.isinsert and not compiled.effective_returning),
        columns=tuple(compiled._result_columns) if compiled._result_columns else None,
    )


def _bound(plan: _Plan, parameters: Mapping[str, Any]) -> tuple[Any, ...]:
    values = []
    for key, fixed, processor in plan.binds:
        value = parameters.get(key) if key is not None else fixed
        values.append(processor(value) if processor is not None else value)
    return tuple(values)


class DirectConnection(AsyncConnection):
    """An :class:`AsyncConnection` that runs :func:`prepared` statements straight on the
    driver connection when it can (module docstring)."""

    __slots__ = ()

    async def execute(
        self,
        statement: Executable,
        parameters: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        *,
        execution_options: Mapping[str, Any] | None = None,
    ) -> Any:
        cache: dict[Any, _Plan | None] | None = getattr(statement, _CACHE, None)
        driver = self._direct_driver() if cache is not None and not execution_options else None
        rows: Sequence[Mapping[str, Any]] = (
            ()
            if parameters is None
            else (parameters,)
            if type(parameters) is dict or isinstance(parameters, Mapping)
            else parameters
        )
        many = len(rows) > 1
        plan = None
        if driver is not None and cache is not None:
            # the compiled form depends on the dialect (one SQLite library, one PostgreSQL
            # adapter per process: one per driver) and the parameter names alone; they are
            # taken in the order the caller gives them (one entry per order a caller uses), not
            # sorted for every statement
            keys = tuple(rows[0]) if rows else ()
            cache_key = (type(driver), keys, many)
            try:
                plan = cache[cache_key]
            except KeyError:
                plan = cache[cache_key] = _plan(statement, self.dialect, list(keys), many)
            if many and any(r.keys() != rows[0].keys() for r in rows):
                plan = None  # SQLAlchemy's path decides what rows of other shapes mean
        if driver is None or plan is None:
            return await super().execute(statement, parameters, execution_options=execution_options)
        bound: Any = (
            [_bound(plan, r) for r in rows] if many else _bound(plan, rows[0] if rows else {})
        )
        try:
            found, rowcount, types = await driver.execute_direct(
                plan.sql, bound, many=many, insert=plan.insert
            )
        except BaseException as error:
            await self._raise_as_sqlalchemy(driver, error, plan.sql, bound)
            raise  # not reached: the above raises
        metadata = _NO_ROWS if plan.columns is None else plan.metadata(self.dialect, types)
        result = DirectResult(metadata, iter(found or ()))
        result.rowcount = rowcount
        return result

    def _direct_driver(self) -> _Driver | None:
        """The driver connection when it may run a prepared statement itself: no listener,
        no other execution options, and a transaction open (SQLAlchemy's, or one begun on
        SQLite's driver itself: :func:`app.store.db.write_transaction`)."""
        sync = self.sync_connection
        if (
            sync is None
            or sync._has_events
            or sync.engine._has_events
            or not _AT_BEGIN.issuperset(sync._execution_options)
        ):
            return None
        # the pool's connection, read as ``sync.connection`` reads it (None: closed or
        # invalidated, and SQLAlchemy's path revalidates it or raises)
        proxied = sync._dbapi_connection
        if proxied is None:
            return None
        driver = proxied.dbapi_connection
        if not isinstance(driver, _DRIVERS):
            return None
        if sync._transaction is None or not sync._transaction.is_active:
            if not isinstance(driver, sqlite_driver.OneHopConnection) or not driver.direct:
                return None
        return driver

    async def _raise_as_sqlalchemy(
        self, driver: _Driver, error: BaseException, sql: str, bound: Any
    ) -> None:
        """Raise ``error`` as SQLAlchemy's own path would: the adapter's translation, then the
        connection's exception handling (in a greenlet: it may invalidate the connection)."""
        sync = self.sync_connection
        assert sync is not None
        translated: BaseException = error
        if isinstance(error, Exception):
            try:
                driver._handle_exception(error)
            except Exception as raised:
                translated = raised
        await greenlet_spawn(sync._handle_dbapi_exception, translated, sql, bound, None, None)


_NO_ROWS = SimpleResultMetaData([])


__all__ = ["DirectConnection", "DirectResult", "prepared"]
