"""Structured outputs through the official ``openai`` package, unmodified, on a live server
(echo provider): ``responses.parse(text_format=…)`` gives back the parsed pydantic model, on a
stored conversation and with ``store: false``; a natively typed run reads back the same."""

from __future__ import annotations

from typing import Literal

import openai
import pytest
from pydantic import BaseModel, Field

from .conftest import Server


class Step(BaseModel):
    title: str
    minutes: int = Field(ge=5, le=90)


class Plan(BaseModel):
    city: str
    kind: Literal["trip", "stay"]
    steps: list[Step]
    budget: float | None


def test_responses_parse_returns_the_parsed_model(server: Server) -> None:
    client = server.client()
    conversation = client.conversations.create()
    parsed = client.responses.parse(
        model="default", input="plan a day", text_format=Plan, conversation=conversation.id
    )
    assert parsed.status == "completed"
    plan = parsed.output_parsed
    assert isinstance(plan, Plan)
    assert plan.kind == "trip"
    assert plan.steps and plan.steps[0].minutes == 5
    # the response read back natively as a run: the same parsed answer
    run_id = parsed.id.removeprefix("resp_")
    with server.native() as native:
        record = native.get(f"/conversations/{conversation.id}/runs/{run_id}").json()
    assert Plan.model_validate(record["output_parsed"]) == plan
    # stateless, and with an answer first corrected on retry
    again = client.responses.parse(model="default", input="/invalid", text_format=Plan, store=False)
    assert isinstance(again.output_parsed, Plan)


def test_an_answer_that_never_validates_is_a_failed_response(server: Server) -> None:
    client = server.client()
    failed = client.responses.parse(model="default", input="/invalid always", text_format=Plan)
    assert failed.status == "failed"
    assert failed.output_parsed is None
    assert failed.error is not None and "does not match the output schema" in failed.error.message


def test_a_per_run_setting_the_profile_refuses_is_a_400(server: Server) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        server.client().responses.create(model="default", input="hi", temperature=0.3)
    assert caught.value.param == "temperature"


@pytest.mark.parametrize("store", [True, False])
def test_the_streaming_helper_parses_only_the_matching_answer(server: Server, store: bool) -> None:
    client = server.client()
    with client.responses.stream(
        model="default", input="/invalid", text_format=Plan, store=store
    ) as stream:
        done = [e for e in stream if e.type == "response.output_text.done"]
        final = stream.get_final_response()
    assert len(done) == 1  # the answer corrected on retry was never streamed
    assert isinstance(done[0].parsed, Plan)
    assert final.output_parsed == done[0].parsed
    if store:  # a resumed stream of the stored response: the same
        events = list(client.responses.retrieve(final.id, stream=True))
        texts = [e for e in events if e.type == "response.output_text.done"]
        assert [Plan.model_validate_json(e.text) for e in texts] == [final.output_parsed]
