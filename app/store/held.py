"""Which statements a write transaction may hold for its next one, on either driver.

:func:`app.store.db.defer_inserts` asks the driver connection under a transaction to hold its
further plain inserts: SQLite's runs them in the next call into aiosqlite's thread
(:mod:`app.store.sqlite_driver`), PostgreSQL's as ``WITH`` clauses of the next statement
(:mod:`app.store.pg_driver`). The rule of what is offered is here, once: an ``INSERT`` without
``RETURNING`` (nobody reads its result; SQLAlchemy still processes its parameters and builds
its result, with no row count), offered to the connection's ``offer_insert(statement,
parameters, many) -> bool``, which holds it or says to run it now.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.util.concurrency import await_


class HoldsInserts:
    """A dialect (mixed in before SQLAlchemy's) whose ``do_execute`` and ``do_executemany``
    offer each plain insert to the driver connection before running it."""

    def do_execute(self, cursor: Any, statement: Any, parameters: Any, context: Any = None) -> None:
        if not held(cursor, statement, parameters, context, many=False):
            cursor.execute(statement, parameters)

    def do_executemany(
        self, cursor: Any, statement: Any, parameters: Any, context: Any = None
    ) -> None:
        if not held(cursor, statement, parameters, context, many=True):
            cursor.executemany(statement, parameters)


def held(cursor: Any, statement: str, parameters: Any, context: Any, *, many: bool) -> bool:
    """Whether the connection under ``cursor`` held this statement for later."""
    offer = getattr(getattr(cursor, "_adapt_connection", None), "offer_insert", None)
    if (
        offer is None
        or context is None
        or not context.isinsert
        or context.compiled.effective_returning
        or not offer(statement, parameters, many)
    ):
        return False
    # SQLAlchemy's async execute insists on one await per statement: a coroutine that returns
    # at once (no wait, no turn of the event loop)
    await_(_held_for_later())
    return True


async def _held_for_later() -> None:
    return None


__all__ = ["HoldsInserts", "held"]
