"""What a finished run contributes to the Prometheus metrics."""

from __future__ import annotations

from datetime import datetime

from app.agent.messages import AssistantMessage, ToolResultMessage
from app.agent.records import Result
from app.observability import (
    observe_compaction,
    observe_provider_attempt,
    observe_run,
    observe_tool_call,
)


def observe_result(
    status: str, result: Result, started: datetime, finished: datetime | None
) -> None:
    seconds = (finished - started).total_seconds() if finished is not None else 0.0
    observe_run(status, max(0.0, seconds))
    for message in result.new_messages:
        if isinstance(message, AssistantMessage):
            outcome = "ok" if message.error is None else message.error.kind
            observe_provider_attempt(message.provider, outcome)
        elif isinstance(message, ToolResultMessage):
            observe_tool_call(message.tool_name, "error" if message.is_error else "ok")
    for compaction in result.compactions:
        observe_compaction(compaction.reason)
