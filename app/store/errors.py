"""What the store refuses, as small exceptions the API layer maps to problems (SPEC §4)."""

from __future__ import annotations


class StoreError(Exception):
    """Base of every refusal the repository raises on purpose."""


class NotFound(StoreError):
    """The conversation (or run) does not exist for this tenant."""


class AlreadyExists(StoreError):
    """A conversation with this id already exists for this tenant."""


class PreconditionFailed(StoreError):
    """An ``If-Match`` / ``If-None-Match: *`` condition did not hold; nothing was written."""

    def __init__(self, message: str, *, current_etag: str | None = None) -> None:
        super().__init__(message)
        self.current_etag = current_etag


class Conflict(StoreError):
    """A write lost against a concurrent change (e.g. the run row is no longer running)."""


class IdempotencyMismatch(StoreError):
    """The Idempotency-Key was used before with a different request body."""


class IdempotencyInFlight(StoreError):
    """The first request with this Idempotency-Key is still running."""

    def __init__(self, message: str, *, run_id: str | None) -> None:
        super().__init__(message)
        self.run_id = run_id
