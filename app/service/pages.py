"""A page of results, as the services return them (the API turns ``more`` into a cursor)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Page(Generic[T]):
    items: list[T]
    more: bool  # there are items after the last of these

    @classmethod
    def of(cls, fetched: Sequence[T], size: int) -> Page[T]:
        """The page from ``size + 1`` items fetched: the extra one only says there are more."""
        return cls(list(fetched[:size]), len(fetched) > size)
