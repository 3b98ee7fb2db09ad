"""The console's other views, in a browser: the transcript (failed attempts flagged,
compactions with their summary and what they folded), runs, details and metadata, versions;
search and the list's views; export and delete. The server is the one of
test_console_flows.py (``site``, conftest.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from playwright.sync_api import Browser, expect

from .conftest import Site, browsing


def test_transcript_runs_and_details_show_what_happened(browser: Browser, site: Site) -> None:
    conversation = site.create("views-history", metadata={"topic": "editors"})
    for prompt in ("What is nvim?", "/fail", "/tool time_now {}"):
        site.run(conversation, prompt)
    compacted = site.api.post(f"/conversations/{conversation}/compact")
    assert compacted.json()["status"] == "completed", compacted.text
    site.run(conversation, "after the summary")
    with browsing(browser, site.url) as seen:
        page = seen.page
        site.open(page, conversation)
        # the context: the summary first, as a compaction, then what the model sees next
        context = page.get_by_role("feed", name="Context")
        expect(context.get_by_role("article", name="compaction")).to_contain_text("What is nvim?")
        expect(context.get_by_role("article", name="user message").last).to_contain_text(
            "after the summary"
        )

        tabs = page.get_by_role("tab", name="Context")
        tabs.focus()
        page.keyboard.press("ArrowRight")  # the tabs follow the arrow keys
        expect(page.get_by_role("tab", name="Transcript")).to_have_attribute(
            "aria-selected", "true"
        )
        transcript = page.get_by_role("feed", name="Transcript")
        failed = transcript.get_by_role("article", name="assistant message").filter(
            has_text="simulated"
        )
        expect(failed).to_contain_text("failed")
        call = transcript.get_by_role("article", name="tool call")
        expect(call).to_contain_text("time_now")
        expect(call.get_by_label("arguments")).to_have_text("{}")  # raw, as the model wrote it
        compaction = transcript.get_by_role("article", name="compaction")
        expect(compaction).to_contain_text(re.compile(r"Folded \d+ messages"))
        expect(compaction).to_contain_text("manual")

        page.get_by_role("tab", name="Runs").click()
        runs = page.get_by_role("list", name="Runs").get_by_role("listitem")
        expect(runs).to_have_count(5)
        expect(runs.nth(1)).to_contain_text("failed")
        expect(runs.nth(1)).to_contain_text("simulated fatal server error")
        expect(runs.nth(0)).to_contain_text("Duration")
        expect(runs.nth(0)).to_contain_text("tokens")

        page.get_by_role("tab", name="Details").click()
        metadata = page.get_by_role("table", name="Metadata")
        expect(metadata).to_contain_text("editors")
        page.get_by_role("textbox", name="Key").fill("owner")
        page.get_by_role("textbox", name="Value").fill("ana")
        page.get_by_role("button", name="Set").click()
        expect(metadata).to_contain_text("ana")
        page.get_by_role("button", name="Remove topic").click()
        expect(metadata).not_to_contain_text("editors")
    assert site.api.get(f"/conversations/{conversation}").json()["metadata"] == {"owner": "ana"}


def test_search_by_metadata_and_by_id_and_the_pending_view(browser: Browser, site: Site) -> None:
    for name, topic in (("search-a", "billing"), ("search-b", "billing"), ("search-c", "other")):
        site.create(name, metadata={"topic": topic, "suite": "console-search"})
    site.create("search-waiting")
    assert site.run("search-waiting", '/tool wait {"seconds": 0}')["status"] == "requires_action"
    with browsing(browser, site.url) as seen:
        page = seen.page
        page.goto(f"{site.url}/console")
        listed = page.get_by_role("list", name="Conversations")
        links = listed.get_by_role("link")
        page.get_by_role("searchbox", name="Metadata filters").fill(
            "topic=billing suite=console-search"
        )
        page.get_by_role("button", name="Search", exact=True).click()
        expect(links).to_have_count(2)
        expect(listed).to_contain_text("search-a")
        expect(listed).to_contain_text("search-b")

        page.get_by_role("button", name="Clear").click()
        page.get_by_role("searchbox", name="Conversation id").fill("search-c")
        page.get_by_role("searchbox", name="Conversation id").press("Enter")
        expect(links).to_have_count(1)
        expect(links.first).to_contain_text("search-c")

        page.get_by_role("button", name="Clear").click()
        page.get_by_role("radio", name="Pending action").check()
        expect(listed.get_by_role("link").filter(has_text="search-waiting")).to_have_count(1)
        expect(listed.get_by_role("link").filter(has_text="search-a")).to_have_count(0)
        listed.get_by_role("link").filter(has_text="search-waiting").click()
        expect(page.get_by_role("button", name="Approve")).to_be_visible()


def test_export_downloads_it_and_delete_asks_first(
    browser: Browser, site: Site, tmp_path: Path
) -> None:
    conversation = site.create("views-doomed")
    site.run(conversation, "remember me")
    with browsing(browser, site.url) as seen:
        page = seen.page
        site.open(page, conversation)
        with page.expect_download() as download:
            page.get_by_role("button", name="Export").click()
        saved = tmp_path / "export.json"
        download.value.save_as(saved)
        document = json.loads(saved.read_text(encoding="utf-8"))
        assert document["format"] == "carryover.conversation"
        assert document["conversation"]["id"] == conversation
        assert len(document["context"]["messages"]) == 2
        assert download.value.suggested_filename == f"{conversation}.json"

        page.get_by_role("button", name="Delete").click()
        dialog = page.get_by_role("dialog")
        expect(dialog).to_contain_text("cannot be undone")
        dialog.get_by_role("button", name="Cancel").click()
        expect(dialog).to_have_count(0)
        assert site.api.get(f"/conversations/{conversation}").status_code == 200

        page.get_by_role("button", name="Delete").click()
        page.get_by_role("dialog").get_by_role("button", name="Delete").click()
        expect(page.get_by_role("heading", name="No conversation open")).to_be_visible()
        listed = page.get_by_role("list", name="Conversations")
        expect(listed.get_by_role("link").filter(has_text=conversation)).to_have_count(0)
    assert site.api.get(f"/conversations/{conversation}").status_code == 404


def test_the_versions_view_follows_what_the_server_keeps(browser: Browser, site: Site) -> None:
    conversation = site.create("views-versions")
    site.run(conversation, "first")
    site.run(conversation, "second")
    kept = site.api.get(f"/conversations/{conversation}/versions")
    with browsing(browser, site.url) as seen:
        page = seen.page
        site.open(page, conversation)
        tab = page.get_by_role("tab", name="Versions")
        assert kept.status_code == 200, kept.text
        newest = kept.json()["items"][0]
        tab.click()
        versions = page.get_by_role("list", name="Versions").get_by_role("listitem")
        expect(versions.first).to_contain_text(f"Version {newest['version']}")
        older = versions.filter(has_text=f"{2} messages").first
        older.get_by_role("button", name="View").click()
        shown = page.get_by_role("feed", name="Context of this version")
        expect(shown.get_by_role("article", name="user message")).to_have_count(1)
        expect(shown.get_by_role("article", name="user message")).to_contain_text("first")
        older.get_by_role("button", name="Fork this version").click()
        page.wait_for_url(lambda url: "#/c/" in url and conversation not in url)
        expect(page.get_by_role("article", name="assistant message", exact=True)).to_have_count(1)
