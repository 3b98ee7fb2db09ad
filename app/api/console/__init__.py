"""The console (docs/console.md): ``GET /console``, a web page served by the app itself to
browse, search and continue conversations, and its files under ``/console/static/``.

The page is plain HTML, CSS and JavaScript modules shipped in this package (``static/``, package
data): no build step, no CDN, nothing fetched from another origin. It holds no data of its own:
everything it shows it reads from the native HTTP API with the API key the user gives it, so
the page and its files are public (like ``/docs``) and every request for data is authenticated
as any other client's.

Every answer here carries a Content Security Policy that forbids other origins and inline
script (:data:`CONTENT_SECURITY_POLICY`), so even a message whose text is crafted HTML cannot
run script or make the browser call out (the page also never builds markup from data).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.types import Scope

CONSOLE_URL = "/console"
STATIC_URL = "/console/static"
STATIC_DIR = Path(__file__).parent / "static"

#: only this origin, for everything; no inline script or style, no plugins, no framing. Images
#: may also be ``data:`` URLs (a message's base64 image blocks are shown from the bytes the
#: page already holds); an image block's ``url`` is shown as text, never loaded.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    # revalidated on each load (the ETag makes that a 304), so an upgrade is seen at once
    "Cache-Control": "no-cache",
}


class ConsoleFiles(StaticFiles):
    """The console's files, each answered with :data:`SECURITY_HEADERS`."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)  # a file, or 304 Not Modified
        response.headers.update(SECURITY_HEADERS)
        return response


router = APIRouter(include_in_schema=False)


@router.api_route(CONSOLE_URL, methods=["GET", "HEAD"])
async def console() -> Response:
    """The console's page (public: it holds nothing until the user gives it a key)."""
    return FileResponse(STATIC_DIR / "index.html", headers=SECURITY_HEADERS)


@router.api_route(CONSOLE_URL + "/", methods=["GET", "HEAD"])
async def console_slash() -> Response:
    # one address for the page, so its relative links resolve one way
    return RedirectResponse(CONSOLE_URL, status_code=308, headers=SECURITY_HEADERS)


def install_console(app: FastAPI) -> None:
    """Serve the console's page and files."""
    app.include_router(router)
    app.mount(STATIC_URL, ConsoleFiles(directory=STATIC_DIR), name="console-static")


__all__ = ["CONSOLE_URL", "CONTENT_SECURITY_POLICY", "STATIC_URL", "install_console"]
