"""CORS (``CARRYOVER_CORS_ORIGINS``): off unless configured; when on, preflights pass without a
key, the allowed origins get ``ETag`` and ``Location`` exposed, and other origins get nothing."""

from __future__ import annotations

from ..helpers import assert_problem
from .conftest import ACME_KEY, API_KEYS, StartApp, http_client

ORIGIN = "https://app.example"


async def test_preflight_and_simple_requests_from_an_allowed_origin(start_app: StartApp) -> None:
    async with start_app(api_keys=API_KEYS, cors_origins=f"{ORIGIN},https://other.example") as app:
        browser = http_client(app)
        preflight = await browser.options(
            "/conversations/c1/context",
            headers={
                "Origin": ORIGIN,
                "Access-Control-Request-Method": "PUT",
                "Access-Control-Request-Headers": "authorization, content-type, if-match",
            },
        )
        assert preflight.status_code == 200, preflight.text  # no key needed for a preflight
        assert preflight.headers["access-control-allow-origin"] == ORIGIN
        assert "PUT" in preflight.headers["access-control-allow-methods"]
        allowed = preflight.headers["access-control-allow-headers"].lower()
        for header in (
            "authorization",
            "content-type",
            "if-match",
            "if-none-match",
            "idempotency-key",
            "prefer",
        ):
            assert header in allowed, header

        acme = http_client(app, ACME_KEY, Origin=ORIGIN)
        created = await acme.post("/conversations", json={"id": "c1"})
        assert created.status_code == 201
        assert created.headers["access-control-allow-origin"] == ORIGIN
        exposed = {
            h.strip().lower() for h in created.headers["access-control-expose-headers"].split(",")
        }
        assert {"etag", "location"} <= exposed
        got = await acme.get("/conversations/c1/context")
        assert got.headers["access-control-allow-origin"] == ORIGIN
        assert "etag" in got.headers["access-control-expose-headers"].lower()

        # a browser can read why it was refused
        refused = await http_client(app, None, Origin=ORIGIN).get("/conversations")
        assert_problem(refused, 401, "unauthorized")
        assert refused.headers["access-control-allow-origin"] == ORIGIN


async def test_other_origins_get_no_cors_headers(start_app: StartApp) -> None:
    async with start_app(api_keys=API_KEYS, cors_origins=ORIGIN) as app:
        preflight = await http_client(app).options(
            "/conversations",
            headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
        )
        assert preflight.status_code == 400
        assert "access-control-allow-origin" not in preflight.headers
        simple = await http_client(app, ACME_KEY, Origin="https://evil.example").get(
            "/conversations"
        )
        assert simple.status_code == 200
        assert "access-control-allow-origin" not in simple.headers


async def test_cors_is_off_unless_configured(start_app: StartApp) -> None:
    async with start_app(api_keys=API_KEYS) as app:
        simple = await http_client(app, ACME_KEY, Origin=ORIGIN).get("/conversations")
        assert simple.status_code == 200
        assert not any(h.startswith("access-control-") for h in simple.headers)
        preflight = await http_client(app).options(
            "/conversations", headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST"}
        )
        assert "access-control-allow-origin" not in preflight.headers
        assert preflight.status_code == 401  # no CORS: an OPTIONS is an ordinary request
