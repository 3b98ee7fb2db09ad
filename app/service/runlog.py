"""One log line per run end, and lines for cancels, takeovers and refusals (docs/operations.md
"Log lines").

Every line goes to the ``carryover.runs`` logger with its fields twice: as ``key=value`` pairs
in the message (the text format shows only the message) and as ``extra=`` fields (the JSON
format gives each as a key of the line's object). Values are ids, names, counts and statuses:
never a message's text, never a secret.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from app.agent.messages import AssistantMessage
from app.agent.records import Result

log = logging.getLogger("carryover.runs")

#: statuses whose end line is a warning (the operator may want to look)
WARN_STATUSES = frozenset({"failed", "conflicted", "interrupted"})

#: any character ``str.isspace`` calls whitespace (``\s`` of a str pattern is the same set)
_SPACE = re.compile(r"\s")


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    text = str(value)
    return repr(text) if not text or _SPACE.search(text) else text


def emit(level: int, event: str, fields: Mapping[str, Any]) -> None:
    """``event key=value …``, with the fields as ``extra`` (``event`` among them); nothing is
    formatted when the logger would drop the line (a level above it)."""
    if not log.isEnabledFor(level):
        return
    pairs = " ".join(f"{key}={_text(value)}" for key, value in fields.items())
    log.log(level, "%s %s", event, pairs, extra={"event": event, **fields})


def attempts_of(result: Result) -> int:
    """Provider requests the run made (each recorded attempt; compactions not counted)."""
    return sum(isinstance(m, AssistantMessage) for m in result.new_messages)


def run_ended(
    *,
    run_id: str,
    conversation_id: str,
    tenant: str,
    agent: str,
    status: str,
    seconds: float,
    result: Result,
    problem: str | None,
    trace_id: str | None = None,
) -> None:
    usage = result.usage
    emit(
        logging.WARNING if status in WARN_STATUSES else logging.INFO,
        "run.ended",
        {
            "run_id": run_id,
            "conversation_id": conversation_id,
            "tenant": tenant,
            "agent": agent,
            "status": status,
            "duration_seconds": round(max(0.0, seconds), 3),
            "attempts": attempts_of(result),
            "compactions": len(result.compactions),
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "cache_read_tokens": usage.cache_read_tokens,
            "problem": problem,
            "trace_id": trace_id,
        },
    )


def run_cancel_requested(
    *, run_id: str, conversation_id: str, tenant: str, here: bool, trace_id: str | None = None
) -> None:
    emit(
        logging.INFO,
        "run.cancel_requested",
        {
            "run_id": run_id,
            "conversation_id": conversation_id,
            "tenant": tenant,
            # whether this process runs it (else the process that does stops it at its next
            # lease renewal)
            "here": here,
            "trace_id": trace_id,
        },
    )


def run_taken_over(
    *,
    interrupted_run_id: str,
    run_id: str,
    conversation_id: str,
    tenant: str,
    trace_id: str | None = None,
) -> None:
    emit(
        logging.WARNING,
        "run.taken_over",
        {
            "interrupted_run_id": interrupted_run_id,
            "run_id": run_id,
            "conversation_id": conversation_id,
            "tenant": tenant,
            "status": "interrupted",
            "trace_id": trace_id,
        },
    )


def run_refused(
    *,
    conversation_id: str,
    tenant: str,
    agent: str,
    problem: str,
    http_status: int,
    detail: str,
    trace_id: str | None = None,
    run_id: str | None = None,
) -> None:
    """A request refused before its run started — or, with ``run_id``, a background queued run
    refused when its turn came (it ended ``failed``; docs/runs.md "Queued runs")."""
    fields: dict[str, Any] = {"run_id": run_id} if run_id is not None else {}
    fields.update(
        {
            "conversation_id": conversation_id,
            "tenant": tenant,
            "agent": agent,
            "problem": problem,
            "http_status": http_status,
            "detail": detail,
            "trace_id": trace_id,
        }
    )
    emit(logging.INFO, "run.refused", fields)
