"""What the store refuses (contract §4). Each error carries its problem type (``slug``, ``status``):
the API's one exception handler answers it, no route translates it."""

from __future__ import annotations

from app.errors import CarryoverError


class StoreError(CarryoverError):
    """Base of every refusal the store raises on purpose."""


class NotFound(StoreError):
    """The conversation (or run) does not exist for this tenant."""

    slug = "not-found"
    status = 404


class AlreadyExists(StoreError):
    """A conversation with this id already exists for this tenant."""

    slug = "conversation-exists"
    status = 409


class PreconditionFailed(StoreError):
    """An ``If-Match`` / ``If-None-Match: *`` condition did not hold; nothing was written."""

    slug = "precondition-failed"
    status = 412

    def __init__(self, message: str, *, current_etag: str | None = None) -> None:
        super().__init__(message, current_etag=current_etag)
        self.current_etag = current_etag


class Conflict(StoreError):
    """A write lost against a concurrent change (e.g. the run row is no longer running)."""

    slug = "run-not-active"
    status = 409


class ActiveRun(StoreError):
    """A conversation cannot be deleted while a run holds it: 409 naming the run."""

    slug = "run-in-progress"
    status = 409

    def __init__(self, active_run_id: str) -> None:
        super().__init__(
            f"run {active_run_id} is in progress on this conversation: cancel it "
            f"(POST …/runs/{active_run_id}/cancel) or let it end, then delete",
            headers={"Retry-After": "1"},
            active_run_id=active_run_id,
        )
        self.active_run_id = active_run_id


class IdempotencyMismatch(StoreError):
    """The Idempotency-Key was used before with a different request body."""

    slug = "idempotency-key-mismatch"
    status = 422


class IdempotencyInFlight(StoreError):
    """The first request with this Idempotency-Key is still running."""

    slug = "idempotency-key-in-flight"
    status = 409

    def __init__(self, message: str, *, run_id: str | None) -> None:
        super().__init__(message, headers={"Retry-After": "1"}, run_id=run_id)
        self.run_id = run_id


def conversation_not_found(conv_id: str) -> NotFound:
    return NotFound(f"conversation {conv_id!r} not found")


def run_not_found(conv_id: str, run_id: str) -> NotFound:
    return NotFound(f"run {run_id!r} not found in conversation {conv_id!r}")


class LimitExceeded(StoreError):
    """A configured limit (e.g. ``max_metadata_keys``) would be exceeded; nothing was written."""

    slug = "limit-exceeded"
    status = 422

    def __init__(
        self, limit: str, maximum: int, actual: int | None = None, *, detail: str | None = None
    ) -> None:
        got = f" (got {actual})" if actual is not None else ""
        super().__init__(
            detail or f"{limit} is {maximum}{got}", limit=limit, maximum=maximum, actual=actual
        )


class CutPastTheEnd(StoreError):
    """A fork's ``messages`` is more than the source context holds: 422 on ``body.messages``."""

    slug = "validation-error"
    status = 422

    def __init__(self, messages: int, total: int) -> None:
        message = f"messages is {messages} but the context has only {total} messages"
        super().__init__(
            f"body.messages: {message}", errors=[{"path": "body.messages", "message": message}]
        )


class UnsafeCut(StoreError):
    """A fork's ``messages`` would cut between a tool call and its result."""

    slug = "unsafe-cut"
    status = 422

    def __init__(self, message: str, *, messages: int) -> None:
        super().__init__(message, messages=messages)


class StoredDataDamaged(StoreError):
    """A stored message is not what was written (its checksum does not match, or it does not
    decode): nothing of the conversation is served, copied or run (app/store/integrity.py).
    409: the stored state stands in the way of the request, and the client can replace it
    (PUT …/context with ``current_etag`` as If-Match); a retry as it is would fail the same way."""

    slug = "stored-data-damaged"
    status = 409

    def __init__(self, conv_id: str, message_index: int, etag: str, reason: str) -> None:
        super().__init__(
            f"message {message_index} of conversation {conv_id!r} is damaged as stored "
            f"({reason}); nothing was served or run. Replace the context with PUT "
            f"/conversations/{conv_id}/context and If-Match: {etag}, or delete the "
            "conversation",
            conversation_id=conv_id,
            message_index=message_index,
            current_etag=etag,
        )
        self.conversation_id = conv_id
        self.message_index = message_index
        self.etag = etag


class StoredRecordDamaged(StoreError):
    """A stored JSON value other than a context message (a transcript entry, a run record, a
    conversation's bookkeeping) does not decode, or a message text a run record or transcript
    entry references is missing or does not match its key (app/store/texts.py): the read that
    met it is refused with the same problem as a damaged message, without an index."""

    slug = "stored-data-damaged"
    status = 409

    def __init__(self, reason: str) -> None:
        super().__init__(
            f"a stored record this request reads is damaged ({reason}); nothing was served. "
            "`carryover check` lists damaged messages; a damaged transcript entry or run "
            "record goes with its conversation (DELETE it, or restore it from an export)"
        )
