"""An in-process cache of stored contexts, so that a run on a long conversation does not read,
decode and validate its whole history again.

Keyed by tenant and conversation; an entry is the :class:`~app.store.stores.Loaded` stored
at one ``(incarnation, version)``, and it is only served for exactly that pair, as read under
the run's lock (:meth:`RunStore.start_run` asks :meth:`ContextCache.lookup` once it holds the
conversation row). Anything that changed the stored context — a PUT, a delete and re-create,
another process's run, a compaction — changed the version or the incarnation, so it is simply
a miss; nothing has to be invalidated for correctness. Entries come from what this process
itself read (a miss) or stored (a run's own save: the Context the run returned is exactly what
the store wrote), never from a request body.

Bounded in bytes (``CARRYOVER_CONTEXT_CACHE_BYTES``) and in messages
(``CARRYOVER_CONTEXT_CACHE_MESSAGES``), least recently used first out; 0 for either turns it
off. A context larger than a whole bound is not kept. An entry's bytes are an estimate made when
it is kept, in O(1): the context's JSON size (kept as a running total by the store and the
run), a fixed allowance per message for its parsed objects, and the provider encodings
carried with it (:mod:`app.agent.opaque`).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, TypeVar

from app.agent.opaque import held_bytes
from app.store.stores import Loaded, RunOutcome

Key = tuple[str, str]
E = TypeVar("E")


#: what one parsed message costs in memory beyond its JSON text (its model objects), for the
#: context cache's byte bound: measured with tracemalloc on short messages, rounded up
MESSAGE_OVERHEAD_BYTES = 1_024


class _Versioned(Generic[E]):
    """What both caches share: entries keyed by ``(tenant, conversation)``, each holding what
    is stored at one ``(incarnation, version)`` and served only for exactly that pair (an
    outdated entry is dropped on sight), least recently used first out, bounded by the sums of
    the entries' sizes (``bounds``, one per measure; 0 keeps nothing). An entry's sizes are
    taken when it is kept."""

    def __init__(self, *bounds: int) -> None:
        self.bounds = bounds
        self._entries: OrderedDict[Key, tuple[E, tuple[int, ...]]] = OrderedDict()
        self._held = [0] * len(bounds)  # the entries' sizes, summed per measure
        self.hits = 0
        self.misses = 0

    def _sizes(self, entry: E) -> tuple[int, ...]:
        raise NotImplementedError

    def _stored_at(self, entry: E) -> tuple[str, int]:
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self._entries)

    def _get(self, key: Key) -> E | None:
        found = self._entries.get(key)
        return None if found is None else found[0]

    def _lookup(self, key: Key, incarnation: str, version: int) -> E | None:
        found = self._get(key)
        if found is None or self._stored_at(found) != (incarnation, version):
            if found is not None:  # outdated: it will never be served again
                self._drop(key)
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return found

    def _put(self, key: Key, entry: E) -> None:
        """Keep ``entry`` (replacing the key's older one) unless it alone passes a bound."""
        if key in self._entries:
            self._drop(key)
        sizes = self._sizes(entry)
        if any(not bound or size > bound for size, bound in zip(sizes, self.bounds, strict=True)):
            return
        self._entries[key] = (entry, sizes)
        for i, size in enumerate(sizes):
            self._held[i] += size
        while any(held > bound for held, bound in zip(self._held, self.bounds, strict=True)):
            self._drop(next(iter(self._entries)))

    def holds(self, tenant: str, conv_id: str) -> bool:
        """Whether an entry of the conversation is kept, at whatever version."""
        return (tenant, conv_id) in self._entries

    def forget(self, tenant: str, conv_id: str) -> None:
        if (tenant, conv_id) in self._entries:
            self._drop((tenant, conv_id))

    def _drop(self, key: Key) -> None:
        _, sizes = self._entries.pop(key)
        for i, size in enumerate(sizes):
            self._held[i] -= size


class ContextCache(_Versioned[Loaded]):
    """Parsed contexts (this module's docstring), bounded in messages and in bytes."""

    def __init__(self, max_messages: int, max_bytes: int = 256 * 1024 * 1024) -> None:
        super().__init__(max_messages, max_bytes)

    @property
    def held_messages(self) -> int:
        return self._held[0]

    @property
    def held_bytes(self) -> int:
        return self._held[1]

    def _sizes(self, entry: Loaded) -> tuple[int, int]:
        context = entry.context
        count = len(context.messages)
        if entry.size is not None:
            text = entry.size.bytes
        else:  # not tracked (no size bounds): the texts' share of the estimate is the allowance
            text = len(context.system_prompt) + len(context.summary) + count * 256
        estimate = text + count * MESSAGE_OVERHEAD_BYTES + held_bytes(context)
        return count + 1, estimate + 1  # an empty context still takes an entry

    def _stored_at(self, entry: Loaded) -> tuple[str, int]:
        return entry.incarnation, entry.version

    def lookup(self, tenant: str, conv_id: str, incarnation: str, version: int) -> Loaded | None:
        """The context stored at exactly ``(incarnation, version)``, if this process has it."""
        return self._lookup((tenant, conv_id), incarnation, version)

    def keep(self, tenant: str, conv_id: str, loaded: Loaded) -> None:
        """Remember what is stored at ``loaded``'s version (replacing an older entry)."""
        self._put((tenant, conv_id), loaded)

    def saved(self, tenant: str, conv_id: str, outcome: RunOutcome) -> None:
        """A run's outcome was recorded: keep what it stored (a run that stored nothing left
        the stored context, and so a cached entry of it, as it was)."""
        if outcome.saved is not None:
            self.keep(tenant, conv_id, outcome.saved)


class BodyCache(_Versioned["_Body"]):
    """GET context's body, kept per process: a stored context's message texts joined with
    commas, exactly as the database would join them (GET context of a long
    conversation must not read and send megabytes from the database every time).

    Keyed like :class:`ContextCache` and served only for the ``(incarnation, version)`` read
    in GET context's own transaction, so a write anywhere (PUT, delete and re-create, another
    process's run, a compaction) is simply a miss. An entry comes from what this process read
    (a GET that missed) or wrote: a run's save that only appended (:attr:`RunOutcome.appended`)
    extends the entry of its base version with the texts it inserted, the very strings it
    stored. The texts are kept encoded, as pieces joined on the next read, so a run's save
    costs O(what it appended).

    Bounded by the bytes held (``CARRYOVER_CONTEXT_BODY_CACHE_BYTES``; 0 turns it off), least
    recently used first out.
    """

    def __init__(self, max_bytes: int) -> None:
        super().__init__(max_bytes)

    @property
    def held_bytes(self) -> int:
        return self._held[0]

    def _sizes(self, entry: _Body) -> tuple[int]:
        return (entry.size,)

    def _stored_at(self, entry: _Body) -> tuple[str, int]:
        return entry.incarnation, entry.version

    def lookup(self, tenant: str, conv_id: str, incarnation: str, version: int) -> bytes | None:
        """The joined texts stored at exactly ``(incarnation, version)``, if this process has
        them."""
        found = self._lookup((tenant, conv_id), incarnation, version)
        if found is None:
            return None
        if len(found.parts) > 1:  # join once; later reads take the joined text as it is
            found.parts = [b",".join(p for p in found.parts if p)]
        return found.parts[0]

    def keep(
        self, tenant: str, conv_id: str, incarnation: str, version: int, joined: bytes
    ) -> None:
        """Remember the texts stored at ``(incarnation, version)``, joined with commas."""
        self._put((tenant, conv_id), _Body(incarnation, version, [joined], len(joined)))

    def saved(self, tenant: str, conv_id: str, base: tuple[str, int], outcome: RunOutcome) -> None:
        """A run on the context stored at ``base`` (incarnation, version) recorded its
        outcome: extend the entry of ``base`` with what the save appended, or forget it."""
        key = (tenant, conv_id)
        found = self._get(key)
        if found is None or not outcome.stored:
            return  # nothing kept, or the stored context (and any entry of it) is as it was
        saved = outcome.saved
        if self._stored_at(found) != base or saved is None or outcome.appended is None:
            self._drop(key)
            return
        added = b",".join(t.encode() for t in outcome.appended)
        self._put(
            key,
            _Body(
                saved.incarnation,
                saved.version,
                [*found.parts, added],
                found.size + len(added) + (1 if found.size and added else 0),
            ),
        )


@dataclass
class _Body:
    incarnation: str
    version: int
    parts: list[bytes]  # b",".join of the non-empty parts is the joined texts
    size: int  # bytes of the joined texts


__all__ = ["BodyCache", "ContextCache"]
