"""A run's answer as JSON: built in one call when its message lists are a piece's worth (most
runs), in pieces with the event loop running between them when they are longer; the same
values either way, those of ``body()`` (what a ``JSONResponse`` of it would send)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from app.agent.codec import CHUNK
from app.agent.messages import AssistantMessage, Context, TextBlock, Usage, UserMessage
from app.api.schemas import Run as RunBody
from app.api.views import RunView


def view(new_messages: int) -> RunView:
    prompt = UserMessage(content=(TextBlock(text='héllo — ünïcode \u2028 "quoted" \\ end'),))
    answer = AssistantMessage(
        content=(TextBlock(text="Echo: ✓ 0.1 + 0.2"),), usage=Usage(input_tokens=3)
    )
    messages = [prompt, answer] * (new_messages // 2)
    return RunView(
        RunBody(
            run_id="r1",
            conversation_id="c1",
            agent="default",
            status="completed",
            stored=True,
            etag='"e-2"',
            base_etag='"e-1"',
            on_failure="keep",
            prompts=[prompt],
            context=Context(system_prompt="sys ✓", summary="", messages=tuple(messages)),
            new_messages=messages,
            final=answer,
            compactions=[],
            usage=Usage(input_tokens=3, output_tokens=2),
            error=None,
            output_parsed={"ratio": 0.1, "big": 12345678901234567, "nested": [1.5, None, "ü"]},
            required_action=None,
            created_at=datetime(2026, 12, 7, 12, 0, 0, 123456, tzinfo=UTC),
            started_at=datetime(2026, 12, 7, 12, 0, 1, tzinfo=UTC),
            finished_at=datetime(2026, 12, 7, 12, 0, 2, tzinfo=UTC),
            duration_ms=1000,
            trace_id=None,
        )
    )


@pytest.mark.parametrize("count", [2, CHUNK + 2], ids=["one call", "in pieces"])
@pytest.mark.parametrize("minimal", [True, False], ids=["minimal", "whole"])
async def test_the_answer_is_the_json_of_its_body(count: int, minimal: bool) -> None:
    run = view(count)
    rendered = await run.render(minimal=minimal)
    expected: dict[str, Any] = run.body(minimal=minimal)
    assert json.loads(rendered) == expected
    assert list(json.loads(rendered)) == list(expected)  # the fields in the same order
    assert "ü".encode() in rendered  # UTF-8 as it is, not escaped


async def test_one_call_and_pieces_give_the_same_values() -> None:
    short, long = view(2), view(CHUNK + 2)
    one = json.loads(await short.render(minimal=True))
    pieces = json.loads(await long.render(minimal=True))
    assert pieces["new_messages"][:2] == one["new_messages"]
    del one["new_messages"], pieces["new_messages"]
    assert one == pieces
