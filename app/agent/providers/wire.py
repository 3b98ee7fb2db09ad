"""A provider request built from encoded pieces, so a run costs O(what changed), not O(history).

The body a stateless provider is sent is as long as the context, so the kernel's copy of its
bytes onto the connection is inherent; encoding every message again on every request is not,
and neither is a copy of the whole body per request. Each wire format (Chat Completions,
Messages, Responses) therefore encodes a message once, into the JSON bytes it has in the
request, and keeps those bytes in an :class:`Encoded` value: the encoding of one sequence of
messages (the provider view of a context, :mod:`app.agent.opaque`). ``extend`` gives the
encoding of that sequence with messages appended, in O(appended); a request's body is the
pieces with the request's other fields around them (:func:`splice`): joined into bytes when it
is short, else a :class:`Body` whose parts are the pieces' own closed chunks, so neither the
SDK nor Carryover walks or copies the history again.

:class:`Pieces` is the shared, append-only list under an encoding: every encoding derived from
it by appending shares it (it holds the first ``n`` pieces), so a run's appends never copy the
history; an encoding extended from an older point (a run that failed and is retried from the
stored context) shares the closed chunks of its prefix and copies at most one.

The JSON is written as the SDKs write it (``ensure_ascii=False``, compact separators,
``allow_nan=False``), UTF-8.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..messages import AnyMessage
from ._transport import LONG_BODY

_SDK_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def dumps(value: Any) -> bytes:
    """``value`` as the SDKs send JSON (``json.dumps`` with their arguments, its encoder
    built once)."""
    return _SDK_JSON.encode(value).encode()


#: the size at which the pieces' growing chunk is closed (:class:`Pieces`)
CHUNK = 256 * 1024


class Pieces:
    """An append-only run of encoded pieces, shared by the encodings that hold a prefix of it.

    The pieces are kept already joined (comma-separated, with the offset where each ends): in
    closed chunks of about :data:`CHUNK` bytes, immutable ``bytes``, then the growing chunk
    still appended to. A request's body is sent as the closed chunks themselves and one copy
    of the rest (:meth:`parts`): not a join of thousands of objects, and not a copy of the
    history per request (at 20,000 messages the body is megabytes, and a fresh copy of it was
    most of what a request cost a run)."""

    __slots__ = ("_base", "_chunks", "_ends", "_tail")

    def __init__(self) -> None:
        self._chunks: list[bytes] = []  # closed, never changed
        self._base = 0  # their bytes: where the growing chunk starts
        self._tail = bytearray()  # the growing chunk
        self._ends = array("q")  # where each piece ends, from the start of the first chunk

    def __len__(self) -> int:
        return len(self._ends)

    @property
    def nbytes(self) -> int:
        return self._base + len(self._tail) + self._ends.itemsize * len(self._ends)

    def at(self, n: int) -> Pieces:
        """These pieces if ``n`` is their end (appending is then safe), else the first ``n``
        (sharing the closed chunks they fill, copying at most one chunk): an encoding never
        sees pieces appended after its own end."""
        if n == len(self._ends):
            return self
        end = self._end(n)
        copy = Pieces()
        closed, rest = self._split(end)
        copy._chunks = closed
        copy._base = end - len(rest)
        copy._tail = bytearray(rest)
        rest.release()
        copy._ends = self._ends[:n]
        return copy

    def append(self, piece: bytes) -> None:
        if self._ends:
            self._tail += b","
        self._tail += piece
        self._ends.append(self._base + len(self._tail))
        if len(self._tail) >= CHUNK:  # closed after a piece: a chunk never splits one
            self._chunks.append(bytes(self._tail))
            self._base += len(self._tail)
            self._tail = bytearray()

    def _end(self, n: int) -> int:
        return self._ends[n - 1] if n else 0

    def _split(self, end: int) -> tuple[list[bytes], memoryview]:
        """The bytes before ``end``: the closed chunks they fill, and a view of the rest (of a
        closed chunk, or of the growing one: valid until the next append)."""
        closed: list[bytes] = []
        offset = 0
        for chunk in self._chunks:
            if offset + len(chunk) > end:
                return closed, memoryview(chunk)[: end - offset]
            closed.append(chunk)
            offset += len(chunk)
        return closed, memoryview(self._tail)[: end - offset]

    def parts(self, n: int) -> tuple[list[bytes], memoryview]:
        """The first ``n`` pieces, comma-joined: the closed chunks they fill (which never
        change) and a view of the rest, at most one chunk (valid until the next append: copy
        it, and release it, before then)."""
        return self._split(self._end(n))

    def array(self, n: int, before: Sequence[bytes] = (), after: Sequence[bytes] = ()) -> bytes:
        """The JSON array of ``before``, the first ``n`` pieces and ``after``."""
        return splice_array(self, n, before, after, b"", b"").join()


class Body:
    """A request body as the parts it is made of, in order: bytes that never change (the
    pieces' closed chunks are sent as they are, not joined into a copy of the whole). ``len``
    is its length in bytes; iterating it (``async for``) gives the parts, which is how it is
    handed to an SDK (``content=``, with its ``Content-Length``) and from the SDK to the
    transport (:mod:`._transport`)."""

    __slots__ = ("_length", "parts")

    def __init__(self, parts: Sequence[bytes]) -> None:
        self.parts = tuple(part for part in parts if part)
        self._length = sum(len(part) for part in self.parts)

    def __len__(self) -> int:
        return self._length

    def join(self) -> bytes:
        return b"".join(self.parts)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for part in self.parts:
            yield part


def splice_array(
    pieces: Pieces,
    n: int,
    before: Sequence[bytes],
    after: Sequence[bytes],
    head: bytes,
    tail: bytes,
) -> Body:
    """``head``, the JSON array of ``before``, ``pieces``' first ``n`` and ``after``, then
    ``tail``: the pieces' closed chunks as they are, what comes before them joined into one
    part, and what comes after them (a copy of at most one chunk, and the end) into another."""
    lead: list[bytes] = [head, b"["]
    if before:
        lead.append(b",".join(before))
        if n or after:
            lead.append(b",")
    closed, rest = pieces.parts(n)
    trail: list[bytes | memoryview] = [rest]
    if after:
        if n:
            trail.append(b",")
        trail.append(b",".join(after))
    trail += (b"]", tail)
    try:
        return Body([b"".join(lead), *closed, b"".join(trail)])
    finally:
        rest.release()  # the growing chunk may grow again


class Encoded(Protocol):
    """The wire encoding of a sequence of messages in one provider format."""

    @property
    def nbytes(self) -> int:
        """About how many bytes the encoding holds (for the caches' byte bounds)."""
        ...

    def extend(self, messages: Sequence[AnyMessage]) -> Encoded:
        """The encoding of the same sequence with ``messages`` appended, in O(appended)."""
        ...


class WireFormat(Protocol):
    """What a provider with a carried-over encoding declares (``Provider.wire``)."""

    #: one key per format: encodings are remembered by it
    key: str

    def encode(self, messages: Sequence[AnyMessage]) -> Encoded:
        """The encoding of ``messages`` (one walk)."""
        ...


def splice(params: dict[str, Any], key: str, encoded: Array) -> bytes | Body:
    """The JSON object of ``params`` with ``key`` set to the JSON array ``encoded`` describes:
    bytes when it is short, else a :class:`Body` of parts (no copy of the history)."""
    head = dumps({k: v for k, v in params.items() if k != key})
    name = dumps(key)
    opening = b"{" + name + b":" if head == b"{}" else head[:-1] + b"," + name + b":"
    body = splice_array(encoded.pieces, encoded.n, encoded.before, encoded.after, opening, b"}")
    return body if len(body) > LONG_BODY else body.join()  # the transport writes it as parts


@dataclass(frozen=True, slots=True)
class Array:
    """A JSON array to write: ``before``, the first ``n`` of ``pieces``, then ``after``."""

    pieces: Pieces
    n: int
    before: Sequence[bytes] = ()
    after: Sequence[bytes] = ()

    def json(self) -> bytes:
        return self.pieces.array(self.n, self.before, self.after)
