"""Who sees what: with API keys configured the console asks for one (a field labelled "API
key"), keeps it for the browser session only, and shows nothing of any tenant without it; the
API's own viewers (Swagger UI at /docs, ReDoc at /redoc) load from the server alone; and the
console reads well at a phone's width."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from playwright.sync_api import Browser, expect

from ..helpers import HANG_GUARD_SECONDS, served
from .conftest import browsing

KEY = "console-test-key-acme-0001"
OTHER_KEY = "console-test-key-globex-01"


@dataclass
class Site:
    url: str
    api: httpx.Client


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    keys = f"acme:{KEY},globex:{OTHER_KEY}"
    with (
        served(tmp_path_factory.mktemp("console-keys"), CARRYOVER_API_KEYS=keys) as url,
        httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=HANG_GUARD_SECONDS
        ) as api,
    ):
        for conversation in ("acme-secret-plans", "acme-roadmap"):
            assert api.post("/conversations", json={"id": conversation}).status_code == 201
        yield Site(url, api)


def test_with_keys_configured_the_page_shows_nothing_without_one(
    browser: Browser, site: Site
) -> None:
    with browsing(browser, site.url) as seen:
        page = seen.page
        page.goto(f"{site.url}/console")
        key = page.get_by_role("textbox", name="API key")
        expect(key).to_be_visible()
        expect(page.get_by_role("list", name="Conversations")).to_have_count(0)
        expect(page.get_by_role("button", name="New conversation")).to_have_count(0)
        expect(page.get_by_text("acme-secret-plans")).to_have_count(0)

        key.fill("not-a-key-of-this-server")
        page.get_by_role("button", name="Open the console").click()
        expect(page.get_by_role("alert")).to_contain_text("refused")
        expect(page.get_by_role("list", name="Conversations")).to_have_count(0)

        page.get_by_role("textbox", name="API key").fill(KEY)
        page.get_by_role("button", name="Open the console").click()
        listed = page.get_by_role("list", name="Conversations")
        expect(listed).to_contain_text("acme-secret-plans")
        expect(listed).to_contain_text("acme-roadmap")

        # kept for the browser session: a reload stays in, without asking again
        page.reload()
        expect(page.get_by_role("list", name="Conversations")).to_contain_text("acme-roadmap")
        stored = page.evaluate("() => Object.entries(sessionStorage)")
        assert [value for _, value in stored] == [KEY]
        assert page.evaluate("() => Object.keys(localStorage).length") == 0
        assert page.context.cookies() == []

        # another tenant's key sees another tenant's conversations (none)
        page.get_by_role("button", name="Forget key").click()
        page.get_by_role("textbox", name="API key").fill(OTHER_KEY)
        page.get_by_role("button", name="Open the console").click()
        expect(page.get_by_role("status").filter(has_text="No conversations")).to_be_visible()
        expect(page.get_by_text("acme-secret-plans")).to_have_count(0)

        # before a key was given, no data was asked for but the one refused probe per try
        before_key = [u for u in seen.requests if "/conversations" in u]
        assert before_key  # the probes, answered 401 until the right key came

    # a new browser session (a fresh context) asks again
    with browsing(browser, site.url) as seen:
        seen.page.goto(f"{site.url}/console#/c/acme-secret-plans")
        expect(seen.page.get_by_role("textbox", name="API key")).to_be_visible()
        expect(seen.page.get_by_text("acme-secret-plans")).to_have_count(0)


def test_swagger_ui_and_redoc_load_from_the_server_alone(browser: Browser, site: Site) -> None:
    with browsing(browser, site.url) as seen:
        page = seen.page
        page.goto(f"{site.url}/docs")
        expect(page.locator(".swagger-ui .info .title")).to_contain_text("Carryover")
        expect(page.get_by_text("/conversations/{conversation_id}/runs").first).to_be_visible()
        assert f"{site.url}/docs/assets/swagger-ui-bundle.js" in seen.requests
        assert f"{site.url}/openapi.json" in seen.requests
    with browsing(browser, site.url) as seen:
        # ReDoc's script asks for the Redocly logo on a CDN; the page's policy refuses it, so
        # the browser never sends that request (and ReDoc leaves the image out)
        seen.expected_refusals = ("https://cdn.redoc.ly/redoc/logo-mini.svg",)
        page = seen.page
        page.goto(f"{site.url}/redoc")
        expect(page.get_by_role("heading", name="Carryover").first).to_be_visible()
        assert f"{site.url}/docs/assets/redoc.standalone.js" in seen.requests


def test_at_a_phone_s_width_one_pane_shows_at_a_time(browser: Browser, site: Site) -> None:
    phone = {"viewport": {"width": 390, "height": 844}, "is_mobile": True, "has_touch": True}
    with browsing(browser, site.url, **phone) as seen:
        page = seen.page
        page.goto(f"{site.url}/console")
        page.get_by_role("textbox", name="API key").fill(KEY)
        page.get_by_role("button", name="Open the console").click()
        listed = page.get_by_role("list", name="Conversations")
        expect(listed).to_be_visible()
        listed.get_by_role("link").filter(has_text="acme-roadmap").click()
        expect(page.get_by_role("heading", name="acme-roadmap")).to_be_visible()
        expect(listed).to_be_hidden()  # the conversation takes the screen
        message = page.get_by_role("textbox", name="Message", exact=True)
        expect(message).to_be_visible()
        # nothing wider than the screen: no sideways scrolling
        assert page.evaluate("() => document.documentElement.scrollWidth") <= 390
        message.fill("from a phone")
        page.get_by_role("button", name="Send", exact=True).click()
        expect(page.get_by_role("article", name="assistant message", exact=True)).to_contain_text(
            'You said: "from a phone"'
        )
        page.get_by_role("button", name="Back to conversations").click()
        expect(listed).to_be_visible()
