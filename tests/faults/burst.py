"""Clients of the fault-injection bursts, and what they saw (docs/faults.md).

Each :class:`BurstClient` owns one conversation and sends runs one after the other, each with a
prompt of its own (``c<client>-<n>``), over one keep-alive ``httpx.AsyncClient`` per server,
alternating servers. It records every answer in a :class:`Tally`: 201s (the prompts
*acknowledged* are those of a 201 that says ``stored: true``; a 201 that says ``stored: false``
promised nothing and is listed apart), 503 problems (and whether they carried ``Retry-After``),
anything else, and transport errors. After a 503 it waits what ``Retry-After`` says, as a
client should.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from ..helpers import user_texts
from ..lifecycle.harness import Server, all_runs, all_transcript, stored_context

#: the longest a burst client waits after a 503, whatever Retry-After says (the bursts are
#: bounded in time)
MAX_BACKOFF = 2.0


@dataclass
class Tally:
    requests: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    slugs: Counter[str] = field(default_factory=Counter)
    transport_errors: list[str] = field(default_factory=list)
    without_retry_after: list[str] = field(default_factory=list)
    others: list[str] = field(default_factory=list)  # answers neither 201 nor a 503 problem
    run_statuses: Counter[str] = field(default_factory=Counter)
    #: conv -> prompts of the 201s that said ``stored: true`` (the run's context, its prompt
    #: in it, became the stored state: the promise the bursts check)
    acknowledged: dict[str, list[str]] = field(default_factory=dict)
    #: 201s that said ``stored: false`` (e.g. a run that lost its lease: ``interrupted``)
    unstored: list[str] = field(default_factory=list)
    refused: dict[str, list[str]] = field(default_factory=dict)  # conv -> prompts (503)
    created_at: list[float] = field(default_factory=list)  # when each 201 arrived
    problems: Counter[str] = field(default_factory=Counter)

    def created_since(self, moment: float) -> int:
        return sum(1 for t in self.created_at if t >= moment)

    def first_created_after(self, moment: float) -> float | None:
        later = [t for t in self.created_at if t >= moment]
        return min(later) if later else None

    def record(self, conv: str, prompt: str, answer: httpx.Response) -> None:
        self.requests += 1
        self.statuses[answer.status_code] += 1
        if answer.status_code == 201:
            body = answer.json()
            self.run_statuses[body["status"]] += 1
            if body["stored"]:
                self.acknowledged.setdefault(conv, []).append(prompt)
            else:
                self.unstored.append(f"{prompt}: run {body['run_id']} {body['status']}")
            self.created_at.append(time.monotonic())
            return
        is_problem = answer.headers.get("content-type") == "application/problem+json"
        slug = answer.json()["type"].rsplit("/", 1)[-1] if is_problem else "?"
        self.slugs[slug] += 1
        if answer.status_code == 503 and is_problem:
            self.refused.setdefault(conv, []).append(prompt)
            if "retry-after" not in answer.headers:
                self.without_retry_after.append(f"{prompt}: {answer.text}")
        else:
            self.others.append(f"{prompt}: {answer.status_code} {answer.text[:300]}")

    def figures(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "201": self.statuses[201],
            "503": self.statuses[503],
            "500": self.statuses[500],
            "other": len(self.others),
            "transport errors": len(self.transport_errors),
            "problem types": dict(self.slugs),
            "run statuses": dict(self.run_statuses),
            "201 not stored": len(self.unstored),
        }


class BurstClient:
    def __init__(self, index: int, conv: str, servers: list[Server], tally: Tally) -> None:
        self.index = index
        self.conv = conv
        self.tally = tally
        self.https = [httpx.AsyncClient(base_url=s.url, timeout=60.0) for s in servers]
        self.sent = 0

    async def aclose(self) -> None:
        for http in self.https:
            await http.aclose()

    async def one(self) -> httpx.Response | None:
        prompt = f"c{self.index}-{self.sent}"
        http = self.https[(self.index + self.sent) % len(self.https)]
        self.sent += 1
        try:
            answer = await http.post(
                f"/conversations/{self.conv}/runs",
                json={"prompts": [prompt]},
                headers={"Prefer": "return=minimal"},
            )
        except httpx.TransportError as exc:
            self.tally.requests += 1
            self.tally.transport_errors.append(f"{prompt}: {type(exc).__name__}: {exc}")
            return None
        self.tally.record(self.conv, prompt, answer)
        if answer.status_code == 503:
            wait = float(answer.headers.get("retry-after", "1"))
            await asyncio.sleep(min(wait, MAX_BACKOFF))
        return answer

    async def run(self, stop: asyncio.Event, *, at_most: int) -> None:
        """Send runs until ``stop`` is set (bounded by ``at_most`` requests)."""
        while not stop.is_set() and self.sent < at_most:
            await self.one()


async def check_stored_exactly_once(http: httpx.AsyncClient, tally: Tally, conv: str) -> int:
    """Every acknowledged prompt of ``conv`` (a 201 with ``stored: true``) is in its context and
    its transcript exactly once, in order, and no refused (503) prompt is; every acknowledged
    prompt has its completed run record. Returns
    how many runs of ``conv`` ended ``interrupted``."""
    acknowledged = tally.acknowledged.get(conv, [])
    refused = set(tally.refused.get(conv, []))
    context, _ = await stored_context(http, conv)
    assert user_texts(context["messages"]) == acknowledged, conv
    entries = await all_transcript(http, conv)
    transcript = [e["body"]["content"][0]["text"] for e in entries if e["kind"] == "prompt"]
    assert transcript == acknowledged, conv
    assert not refused & set(transcript), f"{conv}: a 503 'not stored' prompt was stored"
    runs = await all_runs(http, conv)
    assert all(r["status"] in ("completed", "interrupted") for r in runs), runs
    completed = [user_texts(r["prompts"])[0] for r in runs if r["status"] == "completed"]
    assert completed == acknowledged, conv
    return sum(1 for r in runs if r["status"] == "interrupted")
