"""The console's page and files, and the API's viewers, over HTTP (docs/console.md): served
from the package, public (they hold no data), under a Content Security Policy that forbids
other origins and inline script; the data behind them needs a key as always. The browser
tests (tests/console) drive the page itself."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any

from app.api.console import CONTENT_SECURITY_POLICY, STATIC_DIR

KEY = "console-pages-key-0001"
SVG_NAMESPACE = 'xmlns="http://www.w3.org/2000/svg"'


class Tags(HTMLParser):
    """Every start tag with its attributes, and the text inside each <script>."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag == "script":
            self._in_script = True
            self.scripts.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.scripts[-1] += data


def parse(html: str) -> Tags:
    tags = Tags()
    tags.feed(html)
    return tags


IMPORT = re.compile(r"""(?:from|import)\s*["'](\./[^"']+)["']""")


async def test_the_page_and_every_file_it_loads_come_from_the_package_under_a_strict_policy(
    app_factory: Any,
) -> None:
    async with app_factory(api_keys=f"acme:{KEY}") as client:  # public, even with keys
        page = await client.get("/console")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        policy = page.headers["content-security-policy"]
        assert policy == CONTENT_SECURITY_POLICY
        assert "default-src 'self'" in policy and "script-src 'self';" in policy
        assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
        assert page.headers["x-content-type-options"] == "nosniff"

        tags = parse(page.text)
        assert [s for s in tags.scripts if s.strip()] == []  # no inline script
        scripts = [a for t, a in tags.tags if t == "script"]
        assert scripts == [{"type": "module", "src": "console/static/js/main.js"}]
        links = [a["href"] for t, a in tags.tags if t == "link" and a.get("href")]
        assert links == ["console/static/icon.svg", "console/static/console.css"]
        assert not any("style" in a for _, a in tags.tags)  # no inline style either

        # every module the page imports, followed from main.js, is served, with the policy
        todo = ["js/main.js"]
        served: set[str] = set()
        while todo:
            name = todo.pop()
            if name in served:
                continue
            served.add(name)
            answer = await client.get(f"/console/static/{name}")
            assert answer.status_code == 200, name
            assert answer.headers["content-type"].startswith("text/javascript"), name
            assert answer.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
            folder = name.rsplit("/", 1)[0]
            todo += [f"{folder}/{found[2:]}" for found in IMPORT.findall(answer.text)]
        on_disk = {f"js/{p.name}" for p in (STATIC_DIR / "js").glob("*.js")}
        assert served == on_disk  # every module is used, none is missing
        for name in ("console.css", "icon.svg"):
            answer = await client.get(f"/console/static/{name}")
            assert answer.status_code == 200, name
            assert answer.headers["content-security-policy"] == CONTENT_SECURITY_POLICY

        # nothing in the package names another origin (an XML namespace is a name, not a URL)
        for path in STATIC_DIR.rglob("*"):
            if path.is_file():
                text = path.read_text(encoding="utf-8").replace(SVG_NAMESPACE, "")
                assert not re.search(r"https?://", text), path


async def test_the_page_is_public_but_what_it_shows_needs_a_key(app_factory: Any) -> None:
    async with app_factory(api_keys=f"acme:{KEY}") as client:
        assert (await client.get("/console")).status_code == 200
        assert (await client.head("/console")).status_code == 200
        moved = await client.get("/console/")
        assert (moved.status_code, moved.headers["location"]) == (308, "/console")
        assert (await client.get("/conversations")).status_code == 401
        # the public folder serves its files and nothing else: no way out of it
        for path in (
            "/console/static/%2e%2e/%2e%2e/conversations",
            "/console/static/..%2f..%2fconversations",
            "/console/static/js/%2e%2e/%2e%2e/__init__.py",
            "/console/static/no-such-file.js",
        ):
            answer = await client.get(path)
            assert answer.status_code == 404, (path, answer.text)
        assert (await client.get("/consoles")).status_code == 401  # not a public prefix
        authorized = await client.get("/conversations", headers={"Authorization": f"Bearer {KEY}"})
        assert authorized.status_code == 200


async def test_swagger_ui_and_redoc_take_their_files_from_the_package(app_factory: Any) -> None:
    async with app_factory(api_keys=f"acme:{KEY}") as client:
        docs = await client.get("/docs")
        assert docs.status_code == 200
        assert not re.search(r"https?://", docs.text), docs.text  # no CDN, no outside favicon
        assert '"validatorUrl": null' in docs.text  # no badge from the public validator
        redoc = await client.get("/redoc")
        assert redoc.status_code == 200
        assert not re.search(r"https?://", redoc.text), redoc.text  # no Google fonts either
        assert "default-src 'self'" in redoc.headers["content-security-policy"]
        urls = [a.get("src") or a.get("href") for _, a in parse(docs.text + redoc.text).tags]
        assets = sorted({u for u in urls if u and u.startswith("/docs/assets/")})
        assert assets == [
            "/docs/assets/favicon.png",
            "/docs/assets/redoc.standalone.js",
            "/docs/assets/swagger-ui-bundle.js",
            "/docs/assets/swagger-ui.css",
        ]
        for url in assets:  # public: the pages load them before any key is asked
            assert (await client.get(url)).status_code == 200, url
        assert (await client.get("/docs/oauth2-redirect")).status_code == 200


async def test_the_console_is_not_in_the_openapi_document(client: Any) -> None:
    paths = (await client.get("/openapi.json")).json()["paths"]
    assert not [p for p in paths if p.startswith(("/console", "/docs"))]
