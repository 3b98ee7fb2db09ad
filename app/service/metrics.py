"""What a finished run contributes to the Prometheus metrics, and the figures read from the
database when the metrics are scraped (the queue's depth)."""

from __future__ import annotations

import logging
from datetime import datetime

from app.agent.messages import AssistantMessage, ToolResultMessage, Usage
from app.agent.records import Result
from app.observability import (
    observe_compaction,
    observe_provider_attempt,
    observe_queued,
    observe_run,
    observe_tokens,
    observe_tool_call,
)
from app.store.queue import QueueStore

log = logging.getLogger(__name__)


async def observe_queue(queue: QueueStore) -> None:
    """Set ``carryover_queued_runs`` from the database, at scrape time: the queue is shared by
    every replica (a run queued by one is claimed by any), so only the database's count is
    right; it is one indexed COUNT over the queued runs. A database that does not answer leaves
    the last figure (the scrape itself still answers)."""
    try:
        background, waiting = await queue.count_queued()
    except Exception as exc:  # the database is away: /metrics still answers
        log.debug("counting queued runs failed (%s)", exc)
        return
    observe_queued(background, waiting)


def _tokens(provider: str, usage: Usage) -> None:
    observe_tokens(
        provider,
        input=usage.input_tokens,
        output=usage.output_tokens,
        cache_read=usage.cache_read_tokens,
        cache_write=usage.cache_write_tokens,
    )


def observe_result(
    status: str,
    result: Result,
    started: datetime,
    finished: datetime | None,
    agent: str = "default",
) -> None:
    seconds = (finished - started).total_seconds() if finished is not None else 0.0
    observe_run(status, max(0.0, seconds), agent)
    provider = ""
    for message in result.new_messages:
        if isinstance(message, AssistantMessage):
            outcome = "ok" if message.error is None else message.error.kind
            observe_provider_attempt(message.provider, outcome)
            _tokens(message.provider, message.usage)
            provider = message.provider
        elif isinstance(message, ToolResultMessage):
            observe_tool_call(message.tool_name, "error" if message.is_error else "ok")
    for compaction in result.compactions:
        observe_compaction(compaction.reason)
        # a compaction's summary request is made by the run's provider
        _tokens(provider or (result.final.provider if result.final else ""), compaction.usage)
