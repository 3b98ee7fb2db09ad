"""What one provider request costs the process that sends it, on its own: the floor under a run
with a real provider.

docs/performance.md, "What a provider request costs the process that sends it". In one process,
``--requests`` streamed requests of a conversation of ``--messages`` (10) to a shared/bench
fake, each read to its end, counted in this process's CPU time (the fake runs in its own
process):

- ``transport``: the HTTP client both SDKs send through in Carryover (``httpx2`` over the
  aiohttp transport of ``app/agent/providers/_transport.py``) posting a body built
  once, its answer read line by line: sending and receiving alone;
- ``sdk``: the SDK's own call (``chat.completions.create`` / ``messages.create`` with the
  messages as dicts, ``stream=True``), its chunks iterated: what an application that calls
  the SDK itself pays;
- ``provider``: Carryover's provider (``OpenAIProvider`` / ``AnthropicProvider``) streaming
  one request whose messages are already encoded (as in every run after a conversation's
  first), its events consumed: the provider step of a run, without the rest of the run.

It then counts the floor app's CPU per request (shared/bench/floor_app.py, as
``provider_cost.py`` does) and prints each figure over it. A run with a provider costs its
provider step plus what a run without one costs, so a run at 2 x the floor app leaves
``2 x floor - provider step`` for everything else the run does.

    .venv/bin/python bench/sdk_cost.py                      # both providers, 2,000 requests
    .venv/bin/python bench/sdk_cost.py --providers openai --requests 500 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import _common as c  # bench/_common.py: a script's folder is on sys.path
import anthropic
import openai
from provider_cost import floor_cpu

from app.agent.messages import AnyMessage, AssistantMessage, TextBlock, UserMessage
from app.agent.providers._transport import ProviderHttpClient
from app.agent.providers.anthropic.client import AnthropicProvider
from app.agent.providers.base import ProviderRequest
from app.agent.providers.openai.client import OpenAIProvider

MESSAGES = 10  # the default --messages
KEY = "sk-fake"  # the fakes take any key
Step = Callable[[], Awaitable[None]]


def conversation(messages: int) -> list[dict[str, str]]:
    return [
        {"role": "user" if i % 2 == 0 else "assistant", "content": c.text(i)}
        for i in range(messages)
    ]


def typed(messages: list[dict[str, str]]) -> tuple[AnyMessage, ...]:
    return tuple(
        UserMessage.text(m["content"])
        if m["role"] == "user"
        else AssistantMessage(content=(TextBlock(text=m["content"]),))
        for m in messages
    )


class Steps:
    """The three ways to send one request to a fake; :meth:`aclose` closes their clients."""

    def __init__(self, kind: str, base_url: str, length: int) -> None:
        messages = conversation(length)
        history = typed(messages)
        self.http = ProviderHttpClient()
        if kind == "openai":
            self.url = f"{base_url}/chat/completions"
            self.headers = {"Authorization": f"Bearer {KEY}"}
            body: dict[str, Any] = {"stream": True, "stream_options": {"include_usage": True}}
            self.sdk: Any = openai.AsyncOpenAI(api_key=KEY, base_url=base_url, max_retries=0)
            self.provider: Any = OpenAIProvider(KEY, base_url=base_url, model="fake-model")
            self.create = self.sdk.chat.completions.create
        else:
            self.url = f"{base_url}/v1/messages"
            self.headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
            body = {"stream": True, "max_tokens": 1024}
            self.sdk = anthropic.AsyncAnthropic(api_key=KEY, base_url=base_url, max_retries=0)
            self.provider = AnthropicProvider(KEY, base_url=base_url, model="fake-model")
            self.create = self.sdk.messages.create
        self.body = {"model": "fake-model", "messages": messages, **body}
        self.raw = json.dumps(self.body).encode()
        self.request = ProviderRequest(
            system_prompt="",
            messages=history,
            model="fake-model",
            encoded=self.provider.wire.encode(history),
        )

    async def transport(self) -> None:
        async with self.http.stream(
            "POST",
            self.url,
            content=self.raw,
            headers={**self.headers, "Content-Type": "application/json"},
        ) as answer:
            answer.raise_for_status()
            async for _ in answer.aiter_lines():
                pass

    async def sdk_call(self) -> None:
        async for _ in await self.create(**self.body):
            pass

    async def provider_step(self) -> None:
        async for _ in self.provider.stream(self.request):
            pass

    async def aclose(self) -> None:
        await self.http.aclose()
        await self.sdk.close()
        await self.provider.aclose()


async def cpu_per_request(step: Step, requests: int, warm: int = 50) -> float:
    """This process's CPU milliseconds per ``step``."""
    for _ in range(warm):
        await step()
    before = time.process_time()
    for _ in range(requests):
        await step()
    return (time.process_time() - before) / requests * 1000


async def measure(kind: str, base_url: str, requests: int, length: int) -> dict[str, float]:
    steps = Steps(kind, base_url, length)
    try:
        return {
            "transport": await cpu_per_request(steps.transport, requests),
            "sdk": await cpu_per_request(steps.sdk_call, requests),
            "provider": await cpu_per_request(steps.provider_step, requests),
        }
    finally:
        await steps.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--providers", default="openai,anthropic")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--messages", type=int, default=MESSAGES)
    parser.add_argument("--floor-requests", type=int, default=1000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    c.on_sigterm()
    print(f"sdk_cost: {c.machine_note()}", flush=True)
    figures: dict[str, dict[str, float]] = {}
    with c.Procs() as procs:
        for kind in args.providers.split(","):
            fake = c.start_fake(procs, kind)
            figures[kind] = asyncio.run(measure(kind, fake.url, args.requests, args.messages))
            print(f"  {kind}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in figures[kind].items()))
        floor = floor_cpu(procs, args.floor_requests)
    print(f"\nfloor app (shared/bench/floor_app.py): {floor:.2f} ms CPU per request\n")
    rows = [
        [
            kind,
            *(f"{v:.2f} ({v / floor:.2f} x)" for v in row.values()),
            f"{max(0.0, 2 * floor - row['provider']):.2f}",
        ]
        for kind, row in figures.items()
    ]
    print(
        c.table(
            [
                "provider",
                "transport ms (÷ floor)",
                "SDK call ms (÷ floor)",
                "provider step ms (÷ floor)",
                "left of 2 x floor for the rest of a run, ms",
            ],
            rows,
        )
    )
    print(f"\n{c.machine_note()}")
    c.write_json(
        args.json,
        {
            "floor_ms": floor,
            "requests": args.requests,
            "messages": args.messages,
            "figures": figures,
        },
    )


if __name__ == "__main__":
    main()
