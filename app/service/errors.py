"""What the service refuses, beside the store's refusals: each error carries its problem type
(``slug``, ``status``), as every :class:`~app.errors.CarryoverError` does."""

from __future__ import annotations

from app.errors import CarryoverError


class Busy(CarryoverError):
    """Another run holds the conversation (``if_busy: reject``, or waiting timed out)."""

    slug = "run-in-progress"
    status = 409

    def __init__(self, active_run_id: str, retry_after: float) -> None:
        super().__init__(
            f"run {active_run_id} is in progress on this conversation",
            headers={"Retry-After": str(max(1, int(retry_after)))},
            active_run_id=active_run_id,
        )
        self.active_run_id = active_run_id
        self.retry_after = retry_after


class ShuttingDown(CarryoverError):
    """The process is stopping: it starts no new run."""

    slug = "not-ready"
    status = 503

    def __init__(self) -> None:
        super().__init__(
            "this server is stopping and starts no new run; try another replica or again shortly",
            headers={"Retry-After": "1"},
        )


class UnreplayableContext(CarryoverError):
    """A context that no provider could be sent (contract §1): 422, naming the message."""

    slug = "unreplayable-context"
    status = 422

    def __init__(self, message_index: int | None, detail: str) -> None:
        super().__init__(detail, message_index=message_index)


__all__ = ["Busy", "ShuttingDown", "UnreplayableContext"]
