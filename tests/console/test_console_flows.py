"""The console in a browser (docs/console.md, SPEC §13), against a live ``carryover serve``:
conversations created and continued from the page, answers streaming in, runs started
elsewhere appearing, approvals and client calls answered, forks, long conversations drawn a
window at a time. Every page checks at the end that it asked nothing of another origin
(``browsing`` in conftest.py).

The server's profiles: ``default`` (echo, with ``wait`` gated by approval), ``gated`` (a fake
model that holds prompts starting with "held" until the test releases them) and ``stalled`` (a
fake model that sends the start of its answer, then waits for the test)."""

from __future__ import annotations

import threading
from typing import Any

from playwright.sync_api import Browser, expect

from ..helpers import HANG_GUARD_SECONDS, user, user_texts
from .conftest import Site, answers, browsing, expect_run_completed, message_box, opened_id


def test_a_new_conversation_is_carried_over_two_messages_typed_into_the_page(
    browser: Browser, site: Site
) -> None:
    with browsing(browser, site.url) as seen:
        page = seen.page
        page.goto(f"{site.url}/console")
        page.get_by_role("button", name="New conversation").click()
        page.wait_for_url(lambda url: "#/c/" in url)
        message_box(page).fill("What is nvim?")
        page.get_by_role("button", name="Send", exact=True).click()
        expect(answers(page)).to_have_count(1)
        expect(answers(page).first).to_contain_text('I saw 1 message. You said: "What is nvim?"')
        message_box(page).fill("How does it differ from vim?")
        message_box(page).press("Enter")  # Enter sends too
        expect(answers(page)).to_have_count(2)
        # the second run saw the first one's two messages: the conversation carried over
        expect(answers(page).nth(1)).to_contain_text(
            'I saw 3 messages. You said: "How does it differ from vim?"'
        )
        expect(page.get_by_role("article", name="user message", exact=True)).to_have_count(2)
        conversation = opened_id(page)
        expect(page.get_by_role("list", name="Conversations")).to_contain_text(conversation)
        expect_run_completed(page)

    stored = site.api.get(f"/conversations/{conversation}/context").json()
    assert user_texts(stored["messages"]) == ["What is nvim?", "How does it differ from vim?"]


def test_an_answer_streams_in_while_the_model_still_writes_it(browser: Browser, site: Site) -> None:
    conversation = site.create()
    with browsing(browser, site.url) as seen:
        page = seen.page
        site.open(page, conversation)
        page.get_by_role("combobox", name="Agent").select_option("stalled")
        message_box(page).fill("stream it")
        page.get_by_role("button", name="Send", exact=True).click()
        assert site.stalled.stall.stalled.wait(HANG_GUARD_SECONDS)
        answer = answers(page)
        # the first pieces are on the page while the model holds the rest
        expect(answer).to_contain_text("Gated: You said:")
        assert not site.stalled.stall.ended.is_set()
        expect(answer).not_to_contain_text("stream it")
        expect(page.get_by_role("button", name="Cancel run")).to_be_visible()
        site.stalled.stall.go.set()
        expect(answer).to_contain_text('Gated: You said: "stream it"')
        expect(page.get_by_role("button", name="Cancel run")).to_be_hidden()
        expect_run_completed(page)

    runs = site.api.get(f"/conversations/{conversation}/runs").json()["items"]
    assert [(r["agent"], r["status"]) for r in runs] == [("stalled", "completed")]


def test_a_run_started_elsewhere_appears_while_the_page_is_open(
    browser: Browser, site: Site
) -> None:
    conversation = site.create()
    with browsing(browser, site.url) as seen:
        page = seen.page
        site.open(page, conversation)
        expect(page.get_by_text("No messages yet")).to_be_visible()
        # another client starts a run, held by the model
        outcome: dict[str, Any] = {}

        def elsewhere() -> None:
            outcome.update(site.run(conversation, "held from elsewhere", agent="gated"))

        thread = threading.Thread(target=elsewhere)
        thread.start()
        held = site.arrival("held from elsewhere")
        # the page found the run and reads its stored events: the prompt is there already
        prompt = page.get_by_role("article", name="user message", exact=True)
        expect(prompt).to_contain_text("held from elsewhere")
        expect(page.get_by_role("button", name="Cancel run")).to_be_visible()
        held.release()
        expect(answers(page)).to_contain_text('Gated: You said: "held from elsewhere"')
        thread.join(HANG_GUARD_SECONDS)
        assert outcome["status"] == "completed"
        expect(page.get_by_role("button", name="Cancel run")).to_be_hidden()


def test_a_run_is_cancelled_from_the_page(browser: Browser, site: Site) -> None:
    conversation = site.create()
    with browsing(browser, site.url) as seen:
        page = seen.page
        site.open(page, conversation)
        page.get_by_role("combobox", name="Agent").select_option("gated")
        message_box(page).fill("held until cancelled")
        page.get_by_role("button", name="Send", exact=True).click()
        held = site.arrival("held until cancelled")
        page.get_by_role("button", name="Cancel run").click()
        expect(page.get_by_role("status").filter(has_text="Run cancelled")).to_be_visible()
        held.release()
    runs = site.api.get(f"/conversations/{conversation}/runs").json()["items"]
    assert [r["status"] for r in runs] == ["cancelled"]


def test_a_pending_call_is_approved_and_another_denied_from_the_page(
    browser: Browser, site: Site
) -> None:
    conversation = site.create()
    with browsing(browser, site.url) as seen:
        page = seen.page
        site.open(page, conversation)
        message_box(page).fill('/tool wait {"seconds": 0}')
        page.get_by_role("button", name="Send", exact=True).click()
        call = page.get_by_role("article", name="tool call", exact=True)
        expect(call).to_contain_text('{"seconds": 0}')  # the raw arguments
        expect(page.get_by_role("button", name="Send", exact=True)).to_be_disabled()
        page.get_by_role("button", name="Approve").click()
        expect(answers(page).last).to_contain_text('Tool wait returned: "waited 0 seconds"')
        expect(page.get_by_role("button", name="Approve")).to_have_count(0)

        message_box(page).fill('/tool wait {"seconds": 5}')
        page.get_by_role("button", name="Send", exact=True).click()
        page.get_by_role("textbox", name="Reason (optional)").fill("not now")
        page.get_by_role("button", name="Deny").click()
        expect(answers(page).last).to_contain_text("denied: not now")
        result = page.get_by_role("article", name="tool result", exact=True).last
        expect(result).to_contain_text("denied: not now")
        expect(page.get_by_role("button", name="Deny")).to_have_count(0)
        expect_run_completed(page)

    transcript = site.api.get(f"/conversations/{conversation}/transcript").json()["items"]
    decisions = [e["body"] for e in transcript if e["kind"] == "approval"]
    assert [(d["approve"], d.get("reason") or None) for d in decisions] == [
        (True, None),
        (False, "not now"),
    ]


def test_a_client_call_is_answered_from_a_form(browser: Browser, site: Site) -> None:
    conversation = site.create()
    lookup = {
        "name": "lookup",
        "description": "Look a word up",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    }
    paused = site.run(conversation, '/tool lookup {"q": "nvim"}', tools=[lookup])
    assert paused["status"] == "requires_action"
    with browsing(browser, site.url) as seen:
        page = seen.page
        site.open(page, conversation)
        expect(page.get_by_role("article", name="tool call", exact=True)).to_contain_text(
            '{"q": "nvim"}'
        )
        page.get_by_role("textbox", name="Result").fill("a fork of vim")
        page.get_by_role("button", name="Send result").click()
        expect(answers(page).last).to_contain_text('Tool lookup returned: "a fork of vim"')
        # the answer streams in before the run's outcome is stored: read the context after that
        expect_run_completed(page)
    stored = site.api.get(f"/conversations/{conversation}/context").json()["messages"]
    assert stored[-2]["type"] == "tool_result"
    assert stored[-2]["content"] == [{"type": "text", "text": "a fork of vim"}]


def test_fork_here_makes_a_second_conversation_beside_the_first(
    browser: Browser, site: Site
) -> None:
    source = site.create("fork-source")
    site.run(source, "one")
    site.run(source, "two")
    with browsing(browser, site.url) as seen:
        page = seen.page
        site.open(page, source)
        expect(answers(page)).to_have_count(2)
        answers(page).first.get_by_role("button", name="Fork here").click()
        page.wait_for_url(lambda url: "#/c/" in url and "fork-source" not in url)
        fork = opened_id(page)
        expect(page.get_by_role("heading", name=fork, exact=True)).to_be_visible()
        expect(answers(page)).to_have_count(1)
        listed = page.get_by_role("list", name="Conversations")
        expect(listed.get_by_role("link").filter(has_text=fork)).to_have_count(1)
        expect(listed.get_by_role("link").filter(has_text=source)).to_have_count(1)
    assert user_texts(site.api.get(f"/conversations/{fork}/context").json()["messages"]) == ["one"]
    first = site.api.get(f"/conversations/{fork}/transcript").json()["items"][0]
    assert (first["kind"], first["body"]["source_id"], first["body"]["messages"]) == (
        "forked",
        source,
        2,
    )
    assert site.api.get(f"/conversations/{source}").json()["message_count"] == 4


LONG = 5_000
#: the most articles the page may hold while scrolling a long conversation (what is visible,
#: and a margin above and below it), whatever its length
MOST_DRAWN = 100


def test_a_five_thousand_message_conversation_is_drawn_a_window_at_a_time(
    browser: Browser, site: Site
) -> None:
    messages = []
    for i in range(LONG // 2):
        messages.append(user(f"question {i}" + " and more words" * (i % 9)))
        messages.append({"type": "assistant", "content": [{"type": "text", "text": f"answer {i}"}]})
    put = site.api.put(
        "/conversations/long-one/context",
        json={"system_prompt": "", "summary": "", "messages": messages},
        headers={"If-None-Match": "*"},
    )
    assert put.status_code == 201, put.text
    with browsing(browser, site.url) as seen:
        page = seen.page
        site.open(page, "long-one")
        last = answers(page).filter(has_text=f"answer {LONG // 2 - 1}")
        expect(last).to_be_visible()  # it opens at the end
        feed = page.get_by_role("feed", name="Context")
        expect(feed.get_by_role("article").first).to_have_attribute("aria-setsize", str(LONG))
        scroller = page.locator(".feed-scroller").first
        drawn = []
        for step in range(21):  # from the end to the top, a twentieth at a time
            scroller.evaluate(
                "(el, share) => { el.scrollTop = el.scrollHeight * share; }", 1 - step / 20
            )
            page.evaluate("() => new Promise(r => requestAnimationFrame(() => setTimeout(r)))")
            drawn.append(page.locator("article").count())
        assert 0 < min(drawn) and max(drawn) <= MOST_DRAWN, drawn
        first = page.get_by_role("article", name="user message", exact=True).filter(
            has_text="question 0"
        )
        expect(first.first).to_be_visible()
        # the keyboard reaches the last message: End from any article
        first.first.focus()
        page.keyboard.press("End")
        expect(last).to_be_focused()
        expect(last).to_be_visible()
        assert page.locator("article").count() <= MOST_DRAWN
