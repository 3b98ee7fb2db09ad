"""Authentication (contract §6): ``Authorization: Bearer`` keys bound to tenants, from
``CARRYOVER_API_KEYS`` or the database (``carryover keys create``); every route but the health
checks needs one once keys are configured; a revoked key stops working within seconds."""

from __future__ import annotations

import hashlib
import re
from functools import partialmethod
from typing import Any

import httpx
import pytest

from app.api.auth import PUBLIC_PATHS, Authenticator
from app.store.db import make_engine
from app.store.keys import KeyStore

from ..helpers import assert_problem
from .conftest import (
    ACME_KEY,
    API_KEYS,
    GLOBEX_KEY,
    StartApp,
    Tenants,
    http_client,
    snapshot,
)

# --- helpers ------------------------------------------------------------------------------


class ManualClock:
    """A clock the test moves (the authenticator's caches expire when the test says)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def auth_clock(monkeypatch: pytest.MonkeyPatch) -> ManualClock:
    """The clock of every Authenticator the app builds (its ``clock`` parameter)."""
    clock = ManualClock()
    clocked = partialmethod(Authenticator.__init__, clock=clock)
    monkeypatch.setattr(Authenticator, "__init__", clocked)
    return clock


async def create_key(database_url: str, tenant: str) -> tuple[str, str]:
    """A database key for ``tenant``, as ``carryover keys create`` makes it: (id, key)."""
    engine = make_engine(database_url)
    try:
        created = await KeyStore(engine).create(tenant)
    finally:
        await engine.dispose()
    return created.stored.id, created.key


async def revoke_key(database_url: str, key_id: str) -> None:
    engine = make_engine(database_url)
    try:
        assert await KeyStore(engine).revoke(key_id) is not None
    finally:
        await engine.dispose()


def guarded_requests(app: Any) -> list[tuple[str, str]]:
    """(method, concrete path) for every operation the app documents that is not public."""
    found = []
    for template, operations in app.openapi()["paths"].items():
        if template in PUBLIC_PATHS:
            continue
        path = template.replace("{run_id}", "run-1").replace("{conversation_id}", "conv-1")
        found.extend((method.upper(), path) for method in sorted(operations))
    return found


def assert_unauthorized(response: httpx.Response, *, invalid: bool) -> dict[str, Any]:
    body = assert_problem(response, 401, "unauthorized")
    challenge = response.headers["www-authenticate"]
    assert challenge.startswith('Bearer realm="carryover"')
    assert ('error="invalid_token"' in challenge) is invalid
    return body


# --- every route ----------------------------------------------------------------------------


async def test_every_route_but_the_public_ones_needs_a_key(
    tenants: Tenants, database_url: str
) -> None:
    requests = guarded_requests(tenants.app)
    # all of contract §4 but the health checks, /metrics (public only when configured so), and
    # GET /usage (docs/operations.md)
    # + PATCH, fork, export, import and the versions list (docs/conversations.md)
    assert len(requests) == 20
    assert ("GET", "/usage") in requests
    assert ("GET", "/metrics") in requests
    await tenants.acme.post("/conversations", json={"id": "conv-1"})
    before = await snapshot(database_url)
    wrong = http_client(tenants.app, "not-a-key")
    basic = http_client(tenants.app, None, Authorization="Basic YWNtZTprZXk=")
    empty = http_client(tenants.app, None, Authorization="Bearer ")
    for method, path in requests:
        body = {"prompts": ["hi"]} if method == "POST" else None
        missing = await tenants.anonymous.request(method, path, json=body)
        detail = assert_unauthorized(missing, invalid=False)["detail"]
        assert "Authorization: Bearer" in detail
        bad = await wrong.request(method, path, json=body)
        assert "not valid" in assert_unauthorized(bad, invalid=True)["detail"]
        assert_unauthorized(await basic.request(method, path, json=body), invalid=True)
        assert_unauthorized(await empty.request(method, path, json=body), invalid=True)
    assert await snapshot(database_url) == before


async def test_health_checks_and_the_api_description_need_no_key(tenants: Tenants) -> None:
    for path in ("/healthz", "/readyz", "/openapi.json", "/docs"):
        answer = await tenants.anonymous.get(path)
        assert answer.status_code == 200, (path, answer.text)


async def test_unauthenticated_requests_learn_nothing_about_routes_or_bodies(
    tenants: Tenants,
) -> None:
    """Authentication comes before routing, JSON parsing and the body limit."""
    for answer in (
        await tenants.anonymous.get("/no/such/route"),
        await tenants.anonymous.patch("/conversations"),
        await tenants.anonymous.post(
            "/conversations", content=b"{not json", headers={"content-type": "application/json"}
        ),
        await tenants.anonymous.get("/conversations/bad%20id"),
        await tenants.anonymous.post("/conversations", content=b"x" * (9 * 1024 * 1024)),
    ):
        assert_unauthorized(answer, invalid=False)


async def test_metrics_need_a_key_unless_configured_public(start_app: StartApp) -> None:
    async with start_app(api_keys=API_KEYS) as app:
        assert_unauthorized(await http_client(app).get("/metrics"), invalid=False)
        answer = await http_client(app, GLOBEX_KEY).get("/metrics")
        assert answer.status_code == 200 and "carryover_http_requests" in answer.text
    async with start_app(api_keys=API_KEYS, public_metrics=True) as app:
        assert (await http_client(app).get("/metrics")).status_code == 200
        assert_unauthorized(await http_client(app).get("/conversations"), invalid=False)


async def test_without_keys_everything_is_the_default_tenant(start_app: StartApp) -> None:
    async with start_app() as app:
        anonymous, with_garbage = http_client(app), http_client(app, "whatever")
        assert (await anonymous.post("/conversations", json={"id": "open"})).status_code == 201
        # a header is not checked when no key exists; it is the same (only) tenant
        listed = (await with_garbage.get("/conversations")).json()["items"]
        assert [c["id"] for c in listed] == ["open"]
        assert (await anonymous.get("/metrics")).status_code == 200


# --- the two kinds of keys ----------------------------------------------------------------


async def test_env_keys_and_database_keys_both_authenticate(
    start_app: StartApp, database_url: str
) -> None:
    _, stored_acme = await create_key(database_url, "acme")
    _, stored_initech = await create_key(database_url, "initech")
    async with start_app(api_keys=API_KEYS) as app:
        env_acme, db_acme = http_client(app, ACME_KEY), http_client(app, stored_acme)
        initech = http_client(app, stored_initech)
        assert (await db_acme.post("/conversations", json={"id": "a1"})).status_code == 201
        assert (await initech.post("/conversations", json={"id": "i1"})).status_code == 201
        # both keys of acme act as the same tenant; initech only sees its own
        assert [c["id"] for c in (await env_acme.get("/conversations")).json()["items"]] == ["a1"]
        assert [c["id"] for c in (await initech.get("/conversations")).json()["items"]] == ["i1"]


async def test_database_keys_alone_turn_authentication_on_at_start(
    start_app: StartApp, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    _, key = await create_key(database_url, "acme")
    caplog.set_level("INFO", logger="app.api.auth")
    async with start_app() as app:
        assert_unauthorized(await http_client(app).get("/conversations"), invalid=False)
        assert (await http_client(app, key).get("/conversations")).status_code == 200
    assert "access: API keys required (1 in the database)" in caplog.text
    assert key not in caplog.text


async def test_the_first_key_created_while_running_turns_authentication_on(
    start_app: StartApp,
    database_url: str,
    caplog: pytest.LogCaptureFixture,
    auth_clock: ManualClock,
) -> None:
    caplog.set_level("INFO", logger="app.api.auth")
    async with start_app(api_key_cache_seconds=0.2) as app:
        assert "no API keys configured: no authentication" in caplog.text
        anonymous = http_client(app)
        assert (await anonymous.get("/conversations")).status_code == 200
        _, key = await create_key(database_url, "acme")
        # "no keys" is remembered for the cache period, and looked up again once it is over
        auth_clock.advance(0.1)
        assert (await anonymous.get("/conversations")).status_code == 200
        auth_clock.advance(0.1)
        assert_unauthorized(await anonymous.get("/conversations"), invalid=False)
        assert (await http_client(app, key).get("/conversations")).status_code == 200


async def test_a_revoked_key_stops_working_within_the_cache_period(
    start_app: StartApp, database_url: str, auth_clock: ManualClock
) -> None:
    """With the default cache (2 s): a revoke holds once the lookup's cache period is over."""
    key_id, key = await create_key(database_url, "acme")
    _, other = await create_key(database_url, "acme")
    async with start_app() as app:
        acme = http_client(app, key)
        assert (await acme.get("/conversations")).status_code == 200
        await revoke_key(database_url, key_id)
        auth_clock.advance(1.9)  # the lookup is still cached
        assert (await acme.get("/conversations")).status_code == 200
        auth_clock.advance(0.1)  # the cache period (2 s) is over: looked up again
        assert (
            "unknown or revoked"
            in assert_unauthorized(await acme.get("/conversations"), invalid=True)["detail"]
        )
        assert (await http_client(app, other).get("/conversations")).status_code == 200


async def test_revoking_every_key_never_opens_the_server(
    start_app: StartApp, database_url: str
) -> None:
    key_id, key = await create_key(database_url, "acme")
    async with start_app(api_key_cache_seconds=0) as app:
        assert (await http_client(app, key).get("/conversations")).status_code == 200
        await revoke_key(database_url, key_id)
        assert_unauthorized(await http_client(app, key).get("/conversations"), invalid=True)
        assert_unauthorized(await http_client(app).get("/conversations"), invalid=False)


async def test_database_lookups_are_cached_briefly(
    start_app: StartApp, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, key = await create_key(database_url, "acme")
    lookups: list[str] = []
    original = KeyStore.tenant_for_hash

    async def counted(self: KeyStore, key_hash: str) -> str | None:
        lookups.append(key_hash)
        return await original(self, key_hash)

    monkeypatch.setattr(KeyStore, "tenant_for_hash", counted)
    async with start_app(api_key_cache_seconds=30) as app:
        acme, wrong = http_client(app, key), http_client(app, "co_guess")
        for _ in range(20):
            assert (await acme.get("/conversations")).status_code == 200
            assert (await wrong.get("/conversations")).status_code == 401
    assert len(lookups) == 2  # one per distinct key, cached for the period


async def test_an_overlong_key_is_refused_without_a_lookup(
    start_app: StartApp, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await create_key(database_url, "acme")

    async def never(self: KeyStore, key_hash: str) -> str | None:
        raise AssertionError("looked up")

    monkeypatch.setattr(KeyStore, "tenant_for_hash", never)
    async with start_app() as app:
        answer = await http_client(app, "k" * 100_000).get("/conversations")
        assert_unauthorized(answer, invalid=True)


async def test_a_database_that_cannot_be_asked_is_503_never_a_pass(
    start_app: StartApp, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(self: KeyStore) -> int:
        raise ConnectionRefusedError("database down")

    monkeypatch.setattr(KeyStore, "active_count", broken)
    async with start_app(api_key_cache_seconds=0) as app:
        answer = await http_client(app).get("/conversations")
        assert_problem(answer, 503, "database-unavailable")
        assert answer.headers["retry-after"] == "2"  # an unreachable database (docs/faults.md)
        assert (await http_client(app).get("/healthz")).status_code == 200
    assert "could not count the API keys" in caplog.text


async def test_keys_are_stored_as_hashes_with_a_short_prefix(database_url: str) -> None:
    key_id, key = await create_key(database_url, "acme")
    assert re.fullmatch(r"co_[A-Za-z0-9_-]{43}", key)
    rows = (await snapshot(database_url))["api_keys"]
    [(row_id, tenant, key_hash, prefix, _created, revoked)] = rows
    assert (row_id, tenant, prefix, revoked) == (key_id, "acme", key[:11], None)
    assert key_hash == hashlib.sha256(key.encode()).hexdigest()
    assert key not in repr(rows)


def test_the_openapi_document_declares_the_bearer_scheme(tenants: Tenants) -> None:
    document = tenants.app.openapi()
    assert document["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            if path in ("/healthz", "/readyz"):
                assert "security" not in operation
                continue
            assert {"HTTPBearer": []} in operation["security"], (method, path)
            assert "401" in operation["responses"], (method, path)
    assert {} in document["paths"]["/metrics"]["get"]["security"]  # optional there


def test_the_env_keys_used_here_are_distinct() -> None:
    assert ACME_KEY != GLOBEX_KEY and ACME_KEY in API_KEYS
