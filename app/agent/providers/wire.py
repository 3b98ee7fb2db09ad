"""A provider request built from encoded pieces, so a run costs O(what changed), not O(history).

The body a stateless provider is sent is as long as the context, so copying its bytes is
inherent; encoding every message again on every request is not. Each wire format (Chat
Completions, Messages) therefore encodes a message once, into the JSON bytes it has in the
request, and keeps those bytes in an :class:`Encoded` value: the encoding of one sequence of
messages (the provider view of a context, :mod:`app.agent.opaque`). ``extend`` gives the
encoding of that sequence with messages appended, in O(appended); a request's body is the
pieces with the request's other fields around them (:func:`splice`), written in one copy and
sent as bytes, so the SDK does not walk the history again.

:class:`Pieces` is the shared, append-only list under an encoding: every encoding derived from
it by appending shares it (it holds the first ``n`` pieces), so a run's appends never copy the
history; an encoding extended from an older point (a run that failed and is retried from the
stored context) copies its prefix once and goes on from there.

The JSON is written as the SDKs write it (``ensure_ascii=False``, compact separators,
``allow_nan=False``), UTF-8.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..messages import AnyMessage

_SDK_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def dumps(value: Any) -> bytes:
    """``value`` as the SDKs send JSON (``json.dumps`` with their arguments, its encoder
    built once)."""
    return _SDK_JSON.encode(value).encode()


class Pieces:
    """An append-only run of encoded pieces, shared by the encodings that hold a prefix of it.

    The pieces are kept already joined (comma-separated, in one buffer, with the offset where
    each ends), so a request's body is one copy of the buffer: not a join of thousands of
    objects, and no second copy of every piece in memory."""

    __slots__ = ("_buf", "_ends")

    def __init__(self, buf: bytearray | None = None, ends: array[int] | None = None) -> None:
        self._buf = buf if buf is not None else bytearray()
        self._ends = ends if ends is not None else array("q")

    def __len__(self) -> int:
        return len(self._ends)

    @property
    def nbytes(self) -> int:
        return len(self._buf) + self._ends.itemsize * len(self._ends)

    def at(self, n: int) -> Pieces:
        """These pieces if ``n`` is their end (appending is then safe), else a copy of the
        first ``n``: an encoding never sees pieces appended after its own end."""
        if n == len(self._ends):
            return self
        return Pieces(bytearray(self._buf[: self._end(n)]), self._ends[:n])

    def append(self, piece: bytes) -> None:
        if self._ends:
            self._buf += b","
        self._buf += piece
        self._ends.append(len(self._buf))

    def _end(self, n: int) -> int:
        return self._ends[n - 1] if n else 0

    def array(self, n: int, before: Sequence[bytes] = (), after: Sequence[bytes] = ()) -> bytes:
        """The JSON array of ``before``, the first ``n`` pieces and ``after``."""
        return splice_array(self, n, before, after, b"", b"")

    def write(self, n: int, out: list[bytes | memoryview]) -> None:
        """Add the first ``n`` pieces (comma-joined) to ``out``, as a view of the buffer (valid
        until the next append: join ``out`` first)."""
        if n:
            out.append(memoryview(self._buf)[: self._end(n)])


def splice_array(
    pieces: Pieces,
    n: int,
    before: Sequence[bytes],
    after: Sequence[bytes],
    head: bytes,
    tail: bytes,
) -> bytes:
    """``head``, the JSON array of ``before``, ``pieces``' first ``n`` and ``after``, then
    ``tail``, in one copy."""
    out: list[bytes | memoryview] = [head, b"["]
    if before:
        out.append(b",".join(before))
        if n or after:
            out.append(b",")
    pieces.write(n, out)
    if after:
        if n:
            out.append(b",")
        out.append(b",".join(after))
    out += (b"]", tail)
    try:
        return b"".join(out)
    finally:
        for part in out:
            if isinstance(part, memoryview):
                part.release()  # the buffer may grow again


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


def splice(params: dict[str, Any], key: str, encoded: Array) -> bytes:
    """The JSON object of ``params`` with ``key`` set to the JSON array ``encoded`` describes,
    built in one copy of its bytes."""
    head = dumps({k: v for k, v in params.items() if k != key})
    name = dumps(key)
    opening = b"{" + name + b":" if head == b"{}" else head[:-1] + b"," + name + b":"
    return splice_array(encoded.pieces, encoded.n, encoded.before, encoded.after, opening, b"}")


@dataclass(frozen=True, slots=True)
class Array:
    """A JSON array to write: ``before``, the first ``n`` of ``pieces``, then ``after``."""

    pieces: Pieces
    n: int
    before: Sequence[bytes] = ()
    after: Sequence[bytes] = ()

    def json(self) -> bytes:
        return self.pieces.array(self.n, self.before, self.after)
