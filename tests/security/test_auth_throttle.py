"""Key guessing is not free (docs/security.md): refused credentials are throttled per client
address (429 ``too-many-auth-failures`` with ``Retry-After``, the key then not even checked),
logged and counted; ``carryover serve`` refuses keys too short to be safe.

The throttle's window runs on the authenticator's clock, which the test moves."""

from __future__ import annotations

import logging
import re
from functools import partialmethod
from pathlib import Path

import httpx
import pytest

from app.api.auth import Authenticator
from app.api.throttle import AuthThrottle, client_key
from app.config import Settings
from app.config.check import check

from ..frame.test_startup_checks import refused_start
from ..helpers import assert_problem
from .conftest import ACME_KEY, API_KEYS, StartApp


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def auth_clock(monkeypatch: pytest.MonkeyPatch) -> ManualClock:
    clock = ManualClock()
    monkeypatch.setattr(
        Authenticator, "__init__", partialmethod(Authenticator.__init__, clock=clock)
    )
    return clock


def _client(app: object, address: str, key: str | None = None) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    transport = httpx.ASGITransport(app=app, client=(address, 40000))  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=transport, base_url="http://carryover.test", headers=headers)


def _counted(metrics: str, outcome: str) -> float:
    found = re.search(
        rf'^carryover_auth_failures_total{{outcome="{outcome}"}} (\S+)$', metrics, re.M
    )
    return float(found.group(1)) if found else 0.0


async def test_refused_keys_are_throttled_per_address(
    start_app: StartApp, auth_clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    async with start_app(
        api_keys=API_KEYS, auth_failure_limit=3, auth_failure_window_seconds=30
    ) as app:
        async with (
            _client(app, "203.0.113.7", "guess") as guesser,
            _client(app, "203.0.113.7", ACME_KEY) as same_address,
            _client(app, "203.0.113.8", ACME_KEY) as elsewhere,
            _client(app, "203.0.113.7") as keyless,
        ):
            before = (await elsewhere.get("/metrics")).text
            with caplog.at_level(logging.INFO, logger="app.api"):
                for _ in range(3):
                    assert_problem(await guesser.get("/conversations"), 401, "unauthorized")
                throttled = await guesser.get("/conversations")
                body = assert_problem(throttled, 429, "too-many-auth-failures")
                assert throttled.headers["retry-after"] == "10"  # one failure's worth: 30 s / 3
                assert "10 s" in body["detail"]
                # the address is refused whatever key it sends now: a right guess says nothing
                assert_problem(
                    await same_address.get("/conversations"), 429, "too-many-auth-failures"
                )
                # other addresses are not
                assert (await elsewhere.get("/conversations")).status_code == 200
                assert_problem(
                    await _client(app, "203.0.113.8", "guess").get("/conversations"),
                    401,
                    "unauthorized",
                )
                # a request without a key is no guess, but it is refused while the address is
                assert_problem(await keyless.get("/conversations"), 429, "too-many-auth-failures")

                auth_clock.advance(10)  # one failure's worth of budget is back: one more try
                assert_problem(await guesser.get("/conversations"), 401, "unauthorized")
                assert_problem(await guesser.get("/conversations"), 429, "too-many-auth-failures")
                auth_clock.advance(10)
                assert (await same_address.get("/conversations")).status_code == 200

            after = (await elsewhere.get("/metrics")).text
    assert _counted(after, "unauthorized") - _counted(before, "unauthorized") == 5
    assert _counted(after, "throttled") - _counted(before, "throttled") == 4
    failures = [r for r in caplog.records if "authentication failed from 203.0.113.7" in r.message]
    assert len(failures) == 4 and all(r.levelno == logging.INFO for r in failures)
    warnings = [r for r in caplog.records if "throttling client 203.0.113.7" in r.message]
    assert len(warnings) == 2  # once per episode: three 429s, then one
    assert all(r.levelno == logging.WARNING for r in warnings)
    assert "guess" not in caplog.text and ACME_KEY not in caplog.text


async def test_requests_without_a_key_are_not_failures(
    start_app: StartApp, auth_clock: ManualClock
) -> None:
    async with start_app(api_keys=API_KEYS, auth_failure_limit=2) as app:
        async with _client(app, "198.51.100.1") as keyless:
            for _ in range(10):
                assert_problem(await keyless.get("/conversations"), 401, "unauthorized")
        async with _client(app, "198.51.100.1", ACME_KEY) as keyed:
            assert (await keyed.get("/conversations")).status_code == 200


async def test_without_keys_nothing_is_throttled(start_app: StartApp) -> None:
    async with start_app(auth_failure_limit=1) as app:
        async with _client(app, "198.51.100.2", "anything") as caller:
            for _ in range(5):
                assert (await caller.get("/conversations")).status_code == 200


def test_ipv6_addresses_count_per_64_and_the_table_stays_bounded() -> None:
    assert client_key("2001:db8:1:2:aaaa::1") == client_key("2001:db8:1:2:bbbb::9")
    assert client_key("2001:db8:1:3::1") != client_key("2001:db8:1:2::1")
    assert client_key("::ffff:192.0.2.1") == "192.0.2.1"
    clock = ManualClock()
    throttle = AuthThrottle(limit=2, window=60, clock=clock, max_tracked=100)
    for i in range(1000):
        throttle.failed(f"192.0.2.{i % 250}" if i < 250 else f"10.{i // 250}.0.{i % 250}")
    assert len(throttle) <= 100
    throttle.failed("192.0.2.99")
    throttle.failed("192.0.2.99")
    assert throttle.retry_after("192.0.2.99") == 30
    clock.advance(30)
    assert throttle.retry_after("192.0.2.99") is None


def test_short_api_keys_are_refused_by_the_start_check() -> None:
    found = check(Settings(api_keys="acme:short-key,globex:long-enough-key-0123"), environ={})
    [error] = [e for e in found.errors if "CARRYOVER_API_KEYS" in e]
    assert "'acme'" in error and "'globex'" not in error and "16 characters" in error
    assert "short-key" not in error
    assert not [e for e in check(Settings(api_keys=API_KEYS), environ={}).errors if "API_KEYS" in e]


def test_serve_exits_2_on_a_short_key(tmp_path: Path) -> None:
    status, err, bound = refused_start(tmp_path, CARRYOVER_API_KEYS="acme:k2")
    assert status == 2, err
    assert "CARRYOVER_API_KEYS='**********'" in err and "16 characters" in err
    assert "acme:k2" not in err
    assert not bound
