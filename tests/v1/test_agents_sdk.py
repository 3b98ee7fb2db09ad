"""OpenAI's Agents SDK (``openai-agents``), unmodified, runs agents on ``/v1`` of a live server:
with ``conversation_id=``, with ``OpenAIConversationsSession`` (history kept as items, each
model call stateless) and with ``previous_response_id=``, each through a function tool round
trip; an agent with an ``output_type`` gets the typed answer. Tracing is switched off: it
would export to OpenAI."""

from __future__ import annotations

import openai
import pytest
from agents import (
    Agent,
    OpenAIConversationsSession,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from pydantic import BaseModel

from .conftest import KEYS, Server

set_tracing_disabled(True)


class Forecast(BaseModel):
    city: str
    celsius: int
    windy: bool


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"cold in {city}"


@pytest.fixture
def client(server: Server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=KEYS["alpha"], max_retries=0)


@pytest.fixture
def agent(client: openai.AsyncOpenAI) -> Agent:
    model = OpenAIResponsesModel(model="default", openai_client=client)
    return Agent(name="weather", instructions="Be brief.", model=model, tools=[get_weather])


async def test_an_agent_on_a_conversation(server: Server, agent: Agent) -> None:
    conversation = server.client().conversations.create()
    hello = await Runner.run(agent, "Hi", conversation_id=conversation.id)
    assert hello.final_output == 'Echo: I saw 1 message. You said: "Hi"'
    tool = await Runner.run(
        agent, '/tool get_weather {"city": "Oslo"}', conversation_id=conversation.id
    )
    assert tool.final_output == 'Tool get_weather returned: "cold in Oslo"'
    kinds = [i.type for i in server.client().conversations.items.list(conversation.id, order="asc")]
    assert kinds == [
        "message",
        "message",
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]


async def test_an_agent_with_a_conversations_session(
    agent: Agent, client: openai.AsyncOpenAI
) -> None:
    session = OpenAIConversationsSession(openai_client=client)
    hello = await Runner.run(agent, "Hello session", session=session)
    assert hello.final_output == 'Echo: I saw 1 message. You said: "Hello session"'
    tool = await Runner.run(agent, '/tool get_weather {"city": "Rome"}', session=session)
    assert tool.final_output == 'Tool get_weather returned: "cold in Rome"'
    items = await session.get_items()
    assert [i.get("type", "message") for i in items][-3:] == [
        "function_call",
        "function_call_output",
        "message",
    ]


async def test_an_agent_chained_by_previous_response_id(agent: Agent) -> None:
    first = await Runner.run(agent, "Hi")
    tool = await Runner.run(
        agent, '/tool get_weather {"city": "Bern"}', previous_response_id=first.last_response_id
    )
    assert tool.final_output == 'Tool get_weather returned: "cold in Bern"'


async def test_an_agent_with_an_output_type_gets_the_typed_answer(
    client: openai.AsyncOpenAI,
) -> None:
    model = OpenAIResponsesModel(model="default", openai_client=client)
    typed = Agent(name="forecaster", model=model, output_type=Forecast)
    result = await Runner.run(typed, "/invalid")  # corrected on retry by the server
    assert result.final_output == Forecast(city="echo", celsius=0, windy=True)
