"""The console's browser tests: Playwright for Python driving Debian's Chromium.

One browser per module (``browser``); each test has a fresh context (empty sessionStorage, so no
API key carried over) and its page (``Browsing``), which records every request the page makes:
at the end of the test every one of them must have gone to the server's own origin (the
console loads nothing from elsewhere, and asks nothing of other origins).

Without ``/usr/bin/chromium`` the tests skip, saying so; ``.ci/run`` installs it
(``apt-get install chromium``), so CI runs them. Playwright's own browser downloads are never
used (``playwright install`` is not needed).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import httpx
import pytest
from playwright.sync_api import Browser, Locator, Page, expect, sync_playwright

from ..fakes.gated_http import GatedOpenAI, HeldRequest, StallAfter
from ..helpers import HANG_GUARD_SECONDS, served

CHROMIUM = Path(os.environ.get("CARRYOVER_TEST_CHROMIUM", "/usr/bin/chromium"))
#: without the background-networking flags Chromium calls out (updates, sync), and this closed
#: network refuses those connections
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
#: how long an expectation may wait before the test calls it a hang (nothing is timed)
PATIENCE_MS = 30_000


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.skip(
            f"no Chromium at {CHROMIUM}: install it (apt-get install chromium) to run the "
            "console's browser tests; .ci/run does"
        )
    expect.set_options(timeout=PATIENCE_MS)
    with sync_playwright() as playwright:
        found = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield found
        finally:
            found.close()


@dataclass
class Browsing:
    """A page and what it asked for."""

    page: Page
    origin: str
    requests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # what the Content Security Policy blocked
    #: the refusals a test expects (a part of each message): the policy doing its job
    expected_refusals: tuple[str, ...] = ()
    #: requests the browser stopped itself, by the page's policy: they never left it
    blocked: list[str] = field(default_factory=list)

    def elsewhere(self) -> list[str]:
        """The requests that left the server's origin (data: and blob: URLs never leave, nor
        does a request the page's Content Security Policy blocked: each of those is also a
        refusal, which the test must expect)."""
        out = []
        for url in self.requests:
            if url in self.blocked:
                continue
            parts = urlsplit(url)
            if parts.scheme in ("data", "blob"):
                continue
            if f"{parts.scheme}://{parts.netloc}" != self.origin:
                out.append(url)
        return out


@contextmanager
def browsing(browser: Browser, origin: str, **context: Any) -> Iterator[Browsing]:
    """A fresh browser context and page on ``origin``; checks at the end that every request
    went to that origin and that no script error happened."""
    ctx = browser.new_context(**{"viewport": {"width": 1280, "height": 860}, **context})
    ctx.set_default_timeout(PATIENCE_MS)
    page = ctx.new_page()
    seen = Browsing(page, origin)
    page.on("request", lambda request: seen.requests.append(request.url))
    page.on("pageerror", lambda error: seen.errors.append(str(error)))
    page.on(
        "requestfailed",
        lambda request: (
            seen.blocked.append(request.url)
            if (request.failure or "").lower() in ("csp", "net::err_blocked_by_csp")
            else None
        ),
    )
    page.on(
        "console",
        lambda message: (
            seen.refused.append(message.text) if "Content Security Policy" in message.text else None
        ),
    )
    try:
        yield seen
    finally:
        ctx.close()
    assert seen.requests, "the page made no request at all"
    assert seen.elsewhere() == []
    assert seen.errors == []
    assert [r for r in seen.refused if not any(e in r for e in seen.expected_refusals)] == []


# --- the server of the conversation tests ---------------------------------------------------


class StalledGate(StallAfter, GatedOpenAI):
    """Sends the role chunk and the first two pieces ('Gated: Y', 'ou said:'), then waits for
    ``stall.go``."""

    stall_after = 3


@dataclass
class Site:
    url: str
    gate: GatedOpenAI
    stalled: StalledGate
    api: httpx.Client

    def create(self, conversation_id: str | None = None, **body: Any) -> str:
        if conversation_id is not None:
            body["id"] = conversation_id
        answer = self.api.post("/conversations", json=body)
        assert answer.status_code == 201, answer.text
        return str(answer.json()["id"])

    def run(self, conversation_id: str, *prompts: str, **body: Any) -> dict[str, Any]:
        answer = self.api.post(
            f"/conversations/{conversation_id}/runs", json={"prompts": list(prompts), **body}
        )
        assert answer.status_code == 201, answer.text
        return dict(answer.json())

    def arrival(self, prompt: str) -> HeldRequest:
        """The gated model's request for ``prompt``, once it arrived (waited for in a thread
        of its own: Playwright's sync API holds this thread's event loop)."""
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, self.gate.arrival(prompt)).result()

    def open(self, page: Page, conversation_id: str) -> None:
        page.goto(f"{self.url}/console#/c/{quote(conversation_id, safe='')}")
        expect(page.get_by_role("heading", name=conversation_id, exact=True)).to_be_visible()


@pytest.fixture(scope="package")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    with (
        GatedOpenAI(hold=lambda prompt: prompt.startswith("held")) as gate,
        StalledGate(hold=lambda prompt: False) as stalled,
    ):
        agents = {
            **json.loads(gate.settings("gated")["agents"]),
            **json.loads(stalled.settings("stalled")["agents"]),
        }
        with (
            served(
                tmp_path_factory.mktemp("console"),
                CARRYOVER_APPROVAL_REQUIRED="wait",
                CARRYOVER_AGENTS=json.dumps(agents),
            ) as url,
            httpx.Client(base_url=url, timeout=HANG_GUARD_SECONDS) as client,
        ):
            yield Site(url, gate, stalled, client)


def answers(page: Page) -> Locator:
    return page.get_by_role("article", name="assistant message", exact=True)


def message_box(page: Page) -> Locator:
    return page.get_by_role("textbox", name="Message", exact=True)


def opened_id(page: Page) -> str:
    """The id of the conversation the page shows (from its address, #/c/<id>)."""
    return unquote(page.url.split("#/c/", 1)[1])


def expect_run_completed(page: Page) -> None:
    """The page says the run it followed completed: it says so on ``run.finished``, which the
    server sends once the run's outcome is stored (an answer is on the page before that)."""
    expect(page.get_by_role("status").filter(has_text="Run completed")).to_be_visible()
