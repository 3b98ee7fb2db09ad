"""The whole store as one object: every aggregate's queries over one engine and one clock.

Each aggregate lives in its own module and can be used alone; :class:`Repository` only puts
them together for the service (and tests) to hold one handle:

- :mod:`.conversations`: conversations and their stored context;
- :mod:`.runs`: starting a run (lease, load) and recording its outcome;
- :mod:`.leases`: renewing leases and interrupting runs of dead processes;
- :mod:`.idempotency`: idempotency keys and their answers;
- :mod:`.records`: run records and the transcript;
- :mod:`.queue`: queued runs and fair waiting.
"""

from __future__ import annotations

from app.etag import IfMatch

from ._sql import DumpedContext, Loaded, StoredRows
from .conversations import ConversationStore
from .events import EventRow, EventStore
from .idempotency import IdempotencyClaim, IdempotencyStore, IdempotentReplay
from .leases import LeaseStore, Renewal
from .metadata import MetadataStore
from .portability import PortabilityStore
from .queue import Queued, QueueState, QueueStore
from .records import RecordStore, RunRecord
from .runs import OnFailure, RunOutcome, RunStatus, RunStore, StartedRun
from .webhooks import WebhookStore


class Repository(
    ConversationStore,
    RunStore,
    LeaseStore,
    IdempotencyStore,
    RecordStore,
    EventStore,
    WebhookStore,
    QueueStore,
    MetadataStore,
    PortabilityStore,
):
    """Every query of the store, each in its own transaction (``Repository(engine, clock)``)."""


__all__ = [
    "DumpedContext",
    "EventRow",
    "IdempotencyClaim",
    "IdempotentReplay",
    "IfMatch",
    "Loaded",
    "OnFailure",
    "QueueState",
    "Queued",
    "Renewal",
    "Repository",
    "RunOutcome",
    "RunRecord",
    "RunStatus",
    "StartedRun",
    "StoredRows",
]
