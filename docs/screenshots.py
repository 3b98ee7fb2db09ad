"""Screenshots of the console for docs/console.md, taken in Debian's Chromium by Playwright.

Run by hand from the repository root (not by the test suite), after a change to the console:

    .venv/bin/python docs/screenshots.py            # writes docs/console/*.png

It starts ``carryover serve`` on a fresh SQLite file in a temporary directory (the echo model,
an API key, the tool ``wait`` gated by approval), fills a few conversations through the HTTP
API, and photographs the main views at a laptop's and a phone's width, light and dark. It
needs the test extra (``./scripts/bootstrap test``: Playwright) and ``/usr/bin/chromium``
(``apt-get install chromium``); nothing else, and no network.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from playwright.sync_api import Page, expect, sync_playwright

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "console"
CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
KEY = "screenshots-key-0000001"
LAPTOP = {"width": 1200, "height": 760}
PHONE = {"width": 390, "height": 780}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve(directory: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CARRYOVER_")}
    env.update(
        CARRYOVER_DATABASE_URL=f"sqlite:///{directory / 'db.sqlite'}",
        CARRYOVER_PORT=str(port),
        CARRYOVER_API_KEYS=f"demo:{KEY}",
        CARRYOVER_APPROVAL_REQUIRED="wait",
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return process, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    process.kill()
    raise SystemExit("carryover serve did not come up")


def fill(api: httpx.Client) -> None:
    """A few conversations to look at."""

    def run(conversation: str, prompt: str) -> None:
        api.post(f"/conversations/{conversation}/runs", json={"prompts": [prompt]})

    api.post(
        "/conversations",
        json={
            "id": "nvim-demo",
            "system_prompt": "You are a concise assistant.",
            "metadata": {"topic": "editors", "user": "u-17"},
        },
    )
    for prompt in ("What is nvim?", "How does it differ from vim?", "/fail"):
        run("nvim-demo", prompt)
    api.post("/conversations/nvim-demo/compact")
    for prompt in ("/tool time_now {}", "And what did we say about vim?"):
        run("nvim-demo", prompt)
    api.post("/conversations", json={"id": "deploy-check", "metadata": {"topic": "ops"}})
    run("deploy-check", "Is the deploy done?")
    run("deploy-check", '/tool wait {"seconds": 2}')  # waits for an approval
    for n in range(1, 4):
        api.post("/conversations", json={"id": f"support-{n}", "metadata": {"topic": "billing"}})
        run(f"support-{n}", f"Ticket {n}: the invoice total looks wrong.")


def open_console(page: Page, url: str, conversation: str | None = None) -> None:
    page.add_init_script(f"sessionStorage.setItem('carryover.console.apiKey', '{KEY}')")
    page.goto(f"{url}/console" + (f"#/c/{conversation}" if conversation else ""))
    if conversation:
        expect(page.get_by_role("heading", name=conversation)).to_be_visible()
    else:
        expect(page.get_by_role("list", name="Conversations")).to_contain_text("nvim-demo")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        process, url = serve(Path(tmp))
        try:
            with httpx.Client(
                base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60
            ) as api:
                fill(api)
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
                shoot(browser, url)
                browser.close()
        finally:
            process.terminate()
            process.wait(30)
    for path in sorted(OUT.glob("*.png")):
        print(f"{path.relative_to(ROOT)}  {path.stat().st_size // 1024} KiB")


def shoot(browser: object, url: str) -> None:
    def page(scheme: str = "light", viewport: dict[str, int] = LAPTOP) -> Page:
        context = browser.new_context(viewport=viewport, color_scheme=scheme)  # type: ignore[attr-defined]
        return context.new_page()  # type: ignore[no-any-return]

    p = page()
    p.goto(f"{url}/console")
    expect(p.get_by_role("textbox", name="API key")).to_be_visible()
    p.screenshot(path=OUT / "key.png")

    p = page()
    open_console(p, url, "nvim-demo")
    expect(p.get_by_role("article", name="compaction")).to_be_visible()
    p.get_by_role("textbox", name="Message", exact=True).fill("Which one should I learn first?")
    p.screenshot(path=OUT / "conversation.png")

    p = page("dark")
    open_console(p, url, "nvim-demo")
    p.get_by_role("tab", name="Transcript").click()
    transcript = p.get_by_role("feed", name="Transcript")
    expect(transcript.get_by_role("article", name="compaction")).to_be_visible()
    transcript.get_by_role("article", name="assistant message").filter(
        has_text="simulated"
    ).scroll_into_view_if_needed()
    p.screenshot(path=OUT / "transcript-dark.png")

    p = page()
    open_console(p, url, "deploy-check")
    expect(p.get_by_role("button", name="Approve")).to_be_visible()
    p.screenshot(path=OUT / "approval.png")

    p = page()
    open_console(p, url, "nvim-demo")
    p.get_by_role("tab", name="Runs").click()
    expect(p.get_by_role("list", name="Runs")).to_contain_text("failed")
    p.screenshot(path=OUT / "runs.png")

    p = page("light", PHONE)
    open_console(p, url, "nvim-demo")
    expect(p.get_by_role("article", name="compaction")).to_be_visible()
    p.screenshot(path=OUT / "phone.png")


if __name__ == "__main__":
    main()
