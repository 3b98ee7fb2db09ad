"""The store as the service is given it: one object per aggregate, over one engine and one clock.

Each aggregate's queries live in its own module; :class:`Stores` only builds them on the same
engine and clock, and every call names its owner (``stores.runs.start_run(...)``,
``stores.conversations.get_conversation(...)``):

- ``conversations`` (:mod:`.conversations`, :mod:`.listing`): conversations and their stored
  context; list, search, sweep; run summaries;
- ``metadata`` (:mod:`.metadata`), ``portability`` (:mod:`.portability`): a conversation's
  metadata; export and import;
- ``runs`` (:mod:`.runs`, :mod:`.outcomes`): starting a run (lease, load), cancel, its outcome;
- ``queue`` (:mod:`.queue`, :mod:`.claims`): queued runs and fair waiting;
- ``leases`` (:mod:`.leases`): renewing leases, interrupting runs (dead processes, unstored
  outcomes);
- ``idempotency`` (:mod:`.idempotency`): idempotency keys and their answers;
- ``records`` (:mod:`.records`): run records and the transcript;
- ``events`` (:mod:`.events`), ``webhooks`` (:mod:`.webhooks`): run events; webhook endpoints and
  the outbox of deliveries.
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from app.clock import SYSTEM_CLOCK, Clock
from app.etag import IfMatch

from ._sql import DumpedContext, Loaded, StoredRows
from .conversations import ConversationStore
from .events import EventRow, EventStore
from .idempotency import IdempotencyClaim, IdempotencyStore, IdempotentReplay
from .leases import LeaseStore, Renewal
from .metadata import MetadataStore
from .portability import PortabilityStore
from .queue import Queued, QueueState, QueueStore
from .quotas import QuotaStore
from .records import RecordStore, RunRecord
from .runs import OnFailure, RunOutcome, RunStatus, RunStore, StartedRun
from .versions import VersionStore
from .webhooks import WebhookStore


class Stores:
    """Every aggregate's store on one engine and clock (``Stores(engine, clock)``); each query
    runs in its own transaction."""

    def __init__(self, engine: AsyncEngine, clock: Clock = SYSTEM_CLOCK) -> None:
        self.engine = engine
        self.clock = clock
        self.conversations = ConversationStore(engine, clock)
        self.metadata = MetadataStore(engine, clock)
        self.portability = PortabilityStore(engine, clock)
        self.runs = RunStore(engine, clock)
        self.queue = QueueStore(engine, clock)
        self.quotas = QuotaStore(engine, clock)
        self.leases = LeaseStore(engine, clock)
        self.idempotency = IdempotencyStore(engine, clock)
        self.records = RecordStore(engine, clock)
        self.events = EventStore(engine, clock)
        self.webhooks = WebhookStore(engine, clock)
        self.versions = VersionStore(engine, clock)


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
    "RunOutcome",
    "RunRecord",
    "RunStatus",
    "StartedRun",
    "StoredRows",
    "Stores",
]
