"""The base of every error Carryover refuses a request with, in any layer.

Each error carries its problem type: ``slug`` (a key of ``app.api.problems.PROBLEM_TYPES``, the
end of its RFC 9457 type URI) and ``status``; ``detail``, ``headers`` and ``extras`` (extension
members) complete the answer. One exception handler in ``app.api.problems`` renders them all,
so no route translates errors itself. This module is below every layer: it imports nothing of
``app``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class CarryoverError(Exception):
    """A refusal, answered as the problem ``slug`` with ``status``."""

    slug: str = "internal"
    status: int = 500

    def __init__(
        self, detail: str, *, headers: Mapping[str, str] | None = None, **extras: Any
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.headers = dict(headers or {})
        self.extras = extras


__all__ = ["CarryoverError"]
