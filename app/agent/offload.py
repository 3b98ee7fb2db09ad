"""CPU work on long contexts, the one rule for when it leaves the event loop: :func:`offload`
runs a step whose cost grows with the context in a worker thread once it concerns
:data:`OFFLOAD_MESSAGES` messages. The agent's steps (counting a context, choosing a cut,
rendering and building a fold) and the steps outside it (the store's decoding and dumping, a
PUT's tally and checks, the check of what a run would store) all go through it; a step over
one long text (parsing and validating an answer against its schema) goes through
:func:`offload_text` from :data:`OFFLOAD_CHARS` characters."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import ParamSpec, TypeVar

#: From this many messages on, the steps whose cost grows with the context run in a thread.
OFFLOAD_MESSAGES = 2_000
#: From this many characters on, a step whose cost grows with one text runs in a thread.
OFFLOAD_CHARS = 64_000

_P = ParamSpec("_P")
_T = TypeVar("_T")


async def offload(size: int, fn: Callable[_P, _T], *args: _P.args, **kw: _P.kwargs) -> _T:
    """``fn(*args, **kw)``, in a worker thread when ``size`` (messages) makes it CPU-heavy."""
    if size >= OFFLOAD_MESSAGES:
        return await asyncio.to_thread(fn, *args, **kw)
    return fn(*args, **kw)


async def offload_text(chars: int, fn: Callable[_P, _T], *args: _P.args, **kw: _P.kwargs) -> _T:
    """``fn(*args, **kw)``, in a worker thread when ``chars`` (of the text it works on) make it
    CPU-heavy."""
    if chars >= OFFLOAD_CHARS:
        return await asyncio.to_thread(fn, *args, **kw)
    return fn(*args, **kw)


__all__ = ["OFFLOAD_CHARS", "OFFLOAD_MESSAGES", "offload", "offload_text"]
