"""The API's own viewers, served from the package: Swagger UI at ``/docs`` and ReDoc at
``/redoc``, both reading ``/openapi.json``.

FastAPI's default pages load their scripts, styles and favicon from public CDNs, so on a
machine without the internet (or behind a proxy that blocks them) ``/docs`` is blank. The
same pages here take their files from the ``fastapi-offline`` package, which ships Swagger UI's
and ReDoc's distribution files (``swagger-ui-bundle.js``, ``swagger-ui.css``,
``redoc.standalone.js``) and is kept in step with their releases; they are served under
``/docs/assets/``. Nothing on these pages asks another origin for anything: no Google fonts,
no validator badge (Swagger UI would otherwise send the document's URL to a public validator),
and ReDoc's page carries a Content Security Policy that keeps the browser from fetching the
one thing its script still asks of another origin (the Redocly logo of its "API docs by
Redocly" link, drawn from a CDN whatever the options; the image is left out when it cannot
load).
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

DOCS_URL = "/docs"
REDOC_URL = "/redoc"
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"
#: where the viewers' files are served (public, like the pages: they hold nothing of a tenant)
ASSETS_URL = "/docs/assets"
#: the package whose ``static/`` folder holds Swagger UI's and ReDoc's distribution files
ASSETS_PACKAGE = ("fastapi_offline", "static")
#: ReDoc's page: this origin only (its styles are injected at run time, its search runs in a
#: worker made from a blob)
REDOC_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; worker-src 'self' blob:; connect-src 'self'; font-src 'self'; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
)


def install_docs_pages(app: FastAPI) -> None:
    """Serve ``/docs``, ``/docs/oauth2-redirect`` and ``/redoc`` with files from the package.
    The app must be built with ``docs_url=None, redoc_url=None`` (FastAPI's CDN pages off)."""
    assert app.openapi_url is not None
    openapi_url = app.openapi_url
    title = app.title

    app.mount(ASSETS_URL, StaticFiles(packages=[ASSETS_PACKAGE]), name="docs-assets")

    @app.get(DOCS_URL, include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{title} - Swagger UI",
            oauth2_redirect_url=OAUTH2_REDIRECT_URL,
            swagger_js_url=f"{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_URL}/favicon.png",
            # no badge fetched from the public validator
            swagger_ui_parameters={"validatorUrl": None},
        )

    @app.get(OAUTH2_REDIRECT_URL, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get(REDOC_URL, include_in_schema=False)
    async def redoc() -> HTMLResponse:
        page = get_redoc_html(
            openapi_url=openapi_url,
            title=f"{title} - ReDoc",
            redoc_js_url=f"{ASSETS_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{ASSETS_URL}/favicon.png",
            with_google_fonts=False,
        )
        page.headers["Content-Security-Policy"] = REDOC_POLICY
        return page


__all__ = ["ASSETS_URL", "DOCS_URL", "REDOC_URL", "install_docs_pages"]
