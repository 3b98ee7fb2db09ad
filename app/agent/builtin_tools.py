"""Example tools shipped with Carryover (contract §6): ``time_now``, ``wait`` and ``fail``."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime


async def time_now() -> str:
    """The current time in UTC, as ISO 8601."""
    return datetime.now(UTC).isoformat()


async def wait(seconds: float) -> str:
    """Sleep for ``seconds`` (at most 3600), then say so. Useful to try cancellation."""
    seconds = max(0.0, min(float(seconds), 3600.0))
    await asyncio.sleep(seconds)
    return f"waited {seconds:g} seconds"


async def fail(reason: str = "requested failure") -> str:
    """Always raises: shows how a failing tool becomes an is_error result."""
    raise RuntimeError(reason)
