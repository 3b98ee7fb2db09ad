"""The tests' one handle on the store: ``Repository(engine, clock)`` is the app's
:class:`~app.store.stores.Stores`, and answers a query by the aggregate's store that owns it
(``repo.start_run`` is ``repo.runs.start_run``), so a test reads as it did when the store was
one class. The app itself always names the owner. Patch a query on its owner
(``monkeypatch.setattr(repo.runs, "finish_run", ...)``): that is the object the app calls."""

from __future__ import annotations

from typing import Any

from app.store.stores import Stores

#: the stores a query is looked up in, in this order (no two of them share a method name)
_OWNERS = (
    "conversations",
    "metadata",
    "portability",
    "runs",
    "queue",
    "leases",
    "idempotency",
    "records",
    "events",
    "webhooks",
    "versions",
)


class Repository(Stores):
    def __getattr__(self, name: str) -> Any:
        if not name.startswith("_"):
            for owner in _OWNERS:
                store = self.__dict__.get(owner)
                if store is not None and hasattr(type(store), name):
                    return getattr(store, name)
        raise AttributeError(f"no store has {name!r}")

    @classmethod
    def of(cls, stores: Stores) -> Repository:
        """The tests' handle on an app's stores (same engine and clock)."""
        return cls(stores.engine, stores.clock)


__all__ = ["Repository"]
