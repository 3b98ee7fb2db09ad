"""An in-process cache of stored contexts, so that a run on a long conversation does not read,
decode and validate its whole history again (issue 10).

Keyed by tenant and conversation; an entry is the :class:`~app.store.repository.Loaded` stored
at one ``(incarnation, version)``, and it is only served for exactly that pair, as read under
the run's lock (:meth:`RunStore.start_run` asks :meth:`ContextCache.lookup` once it holds the
conversation row). Anything that changed the stored context — a PUT, a delete and re-create,
another process's run, a compaction — changed the version or the incarnation, so it is simply
a miss; nothing has to be invalidated for correctness. Entries come from what this process
itself read (a miss) or stored (a run's own save: the Context the run returned is exactly what
the store wrote), never from a request body.

Bounded by the number of messages held (``CARRYOVER_CONTEXT_CACHE_MESSAGES``, 0 turns it off),
least recently used first out. A context longer than the whole bound is not kept.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from app.store.repository import Loaded, RunOutcome

Key = tuple[str, str]


class ContextCache:
    def __init__(self, max_messages: int) -> None:
        self.max_messages = max_messages
        self._entries: OrderedDict[Key, Loaded] = OrderedDict()
        self._held = 0  # messages held, over all entries
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def held_messages(self) -> int:
        return self._held

    def lookup(self, tenant: str, conv_id: str, incarnation: str, version: int) -> Loaded | None:
        """The context stored at exactly ``(incarnation, version)``, if this process has it."""
        key = (tenant, conv_id)
        found = self._entries.get(key)
        if found is None or found.incarnation != incarnation or found.version != version:
            if found is not None:  # outdated: it will never be served again
                self._drop(key)
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return found

    def keep(self, tenant: str, conv_id: str, loaded: Loaded) -> None:
        """Remember what is stored at ``loaded``'s version (replacing an older entry)."""
        key = (tenant, conv_id)
        if key in self._entries:
            self._drop(key)
        size = _size(loaded)
        if size > self.max_messages:
            return
        self._entries[key] = loaded
        self._held += size
        while self._held > self.max_messages:
            self._drop(next(iter(self._entries)))

    def saved(self, tenant: str, conv_id: str, outcome: RunOutcome) -> None:
        """A run's outcome was recorded: keep what it stored (a run that stored nothing left
        the stored context, and so a cached entry of it, as it was)."""
        if outcome.saved is not None:
            self.keep(tenant, conv_id, outcome.saved)

    def forget(self, tenant: str, conv_id: str) -> None:
        if (tenant, conv_id) in self._entries:
            self._drop((tenant, conv_id))

    def _drop(self, key: Key) -> None:
        self._held -= _size(self._entries.pop(key))


def _size(loaded: Loaded) -> int:
    return len(loaded.context.messages) + 1  # an empty context still takes an entry


class BodyCache:
    """GET context's body, kept per process: a stored context's message texts joined with
    commas, exactly as the database would join them (issue 10: GET context of a long
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
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Key, _Body] = OrderedDict()
        self._held = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def held_bytes(self) -> int:
        return self._held

    def lookup(self, tenant: str, conv_id: str, incarnation: str, version: int) -> bytes | None:
        """The joined texts stored at exactly ``(incarnation, version)``, if this process has
        them."""
        key = (tenant, conv_id)
        found = self._entries.get(key)
        if found is None or (found.incarnation, found.version) != (incarnation, version):
            if found is not None:
                self._drop(key)
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
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
        found = self._entries.get(key)
        if found is None or not outcome.stored:
            return  # nothing kept, or the stored context (and any entry of it) is as it was
        saved = outcome.saved
        if (found.incarnation, found.version) != base or saved is None or outcome.appended is None:
            self._drop(key)
            return
        added = b",".join(t.encode() for t in outcome.appended)
        self._drop(key)
        self._put(
            key,
            _Body(
                saved.incarnation,
                saved.version,
                [*found.parts, added],
                found.size + len(added) + (1 if found.size and added else 0),
            ),
        )

    def forget(self, tenant: str, conv_id: str) -> None:
        if (tenant, conv_id) in self._entries:
            self._drop((tenant, conv_id))

    def _put(self, key: Key, body: _Body) -> None:
        if key in self._entries:
            self._drop(key)
        if not self.max_bytes or body.size > self.max_bytes:
            return  # off, or longer than the whole bound
        self._entries[key] = body
        self._held += body.size
        while self._held > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: Key) -> None:
        self._held -= self._entries.pop(key).size


@dataclass
class _Body:
    incarnation: str
    version: int
    parts: list[bytes]  # b",".join of the non-empty parts is the joined texts
    size: int  # bytes of the joined texts


__all__ = ["BodyCache", "ContextCache"]
