"""The agent layer's own CPU per run, without HTTP or a database (echo provider).

Prints CPU milliseconds (``time.process_time``, so a busy machine skews it less than wall time)
per ``Agent.run`` at 10 / 1,000 / 4,000 / 20,000 messages of 200 characters, with the agent
counting the context and with a running tally given (``Input.tokens``), then the CPU of one
threshold compaction of 9,000 messages of 57 characters::

    .venv/bin/python bench/agent_cost.py
    PYTHONPATH=/path/to/older/checkout .venv/bin/python bench/agent_cost.py   # "before"

The tally column needs :mod:`app.agent.tokens` to have ``tally_of`` (left out otherwise).
"""

from __future__ import annotations

import asyncio
import time

from app.agent import AssistantMessage, Context, Input, TextBlock, UserMessage
from app.agent.providers.echo import EchoProvider
from app.agent.run import Agent, AgentConfig


def context(n: int, chars: int = 200) -> Context:
    out: list[UserMessage | AssistantMessage] = []
    for i in range(n):
        text = f"message {i} "
        text += "x" * (chars - len(text))
        out.append(
            UserMessage.text(text)
            if i % 2 == 0
            else AssistantMessage(content=(TextBlock(text=text),))
        )
    return Context(system_prompt="You are concise.", messages=tuple(out))


async def cpu_ms(agent: Agent, inp: Input, times: int) -> float:
    await agent.run(inp)  # warm
    began = time.process_time()
    for _ in range(times):
        await agent.run(inp)
    return (time.process_time() - began) / times * 1000


async def main() -> None:
    try:
        from app.agent.tokens import tally_of
    except ImportError:
        tally_of = None
    agent = Agent(AgentConfig(provider=EchoProvider(), context_window=100_000_000))
    prompt = (UserMessage.text("hi"),)
    print("| messages | agent CPU ms/run | with Input.tokens |")
    print("|---|---|---|")
    for n in (10, 1_000, 4_000, 20_000):
        ctx = context(n)
        times = 10 if n < 20_000 else 4
        counted = await cpu_ms(agent, Input(context=ctx, prompts=prompt), times)
        tallied = "—"
        if tally_of is not None:
            given = Input(context=ctx, prompts=prompt, tokens=tally_of(ctx.messages))
            tallied = f"{await cpu_ms(agent, given, times):.2f}"
        print(f"| {n:,} | {counted:.2f} | {tallied} |")
    long = context(9_000, 57)
    began = time.process_time()
    result = await Agent(AgentConfig(provider=EchoProvider())).run(
        Input(context=long, prompts=prompt)
    )
    took = (time.process_time() - began) * 1000
    folded = sum(len(c.folded) for c in result.compactions)
    print(f"\nthreshold compaction of 9,000 messages: {took:.0f} ms CPU, folded {folded}")


if __name__ == "__main__":
    asyncio.run(main())
