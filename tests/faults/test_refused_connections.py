"""A database that refuses connections is ``503 database-unavailable`` (docs/faults.md), never a
500: on a PostgreSQL database of the test's own (``ALTER DATABASE … ALLOW_CONNECTIONS false``,
dropped afterwards), and every other refusal PostgreSQL or the pool sends, classified."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest
import sqlalchemy.exc
from sqlalchemy.engine import make_url

from app.api.app import create_app
from app.config import Settings
from app.store.faults import classify

from ..conftest import _postgres_admin, run_blocking
from ..helpers import assert_problem


def _admin(sql: str) -> None:
    run_blocking(lambda: _postgres_admin(sql))


@pytest.fixture
async def refusing(database_url: str) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    """A client of an app on the test's own database; the test decides when it refuses."""
    name = make_url(database_url).database
    app = create_app(Settings(database_url=database_url, lease_seconds=2.0))
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    try:
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://carryover.test") as http,
        ):
            yield http, str(name)
    finally:  # let the fixture drop it as usual
        _admin(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_a_database_that_refuses_connections_is_503(
    refusing: tuple[httpx.AsyncClient, str],
) -> None:
    http, name = refusing
    created = await http.post("/conversations", json={})
    assert created.status_code == 201
    conv = created.json()["id"]

    # what an operator does to close a database: no new connections, the open ones ended
    _admin(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
    _admin(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'")
    for path in (f"/conversations/{conv}", f"/conversations/{conv}/context", "/conversations"):
        answer = await http.get(path)
        body = assert_problem(answer, 503, "database-unavailable")
        assert answer.headers["retry-after"] == "2"
        assert "connection" not in answer.headers  # handled: the connection stays usable
        assert "unavailable" in body["detail"]
    ran = await http.post(f"/conversations/{conv}/runs", json={"prompts": ["hi"]})
    assert_problem(ran, 503, "database-unavailable")

    _admin(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    assert (await http.get(f"/conversations/{conv}")).status_code == 200


def _wrapped(error: BaseException) -> Exception:
    """As SQLAlchemy hands an adapter's error on (``.orig`` and the cause)."""
    wrapper = sqlalchemy.exc.DBAPIError("connect", {}, error)
    wrapper.__cause__ = error
    return wrapper


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (
            asyncpg.ObjectNotInPrerequisiteStateError(
                'database "x" is not currently accepting connections'
            ),
            "unavailable",
        ),
        (asyncpg.TooManyConnectionsError('too many connections for database "x"'), "unavailable"),
        (asyncpg.TooManyConnectionsError('too many connections for role "x"'), "unavailable"),
        (asyncpg.TooManyConnectionsError("sorry, too many clients already"), "unavailable"),
        (
            asyncpg.TooManyConnectionsError(
                "remaining connection slots are reserved for roles with the SUPERUSER attribute"
            ),
            "unavailable",
        ),
        (asyncpg.CannotConnectNowError("the database system is starting up"), "unavailable"),
        (
            asyncpg.CannotConnectNowError("the database system is not accepting connections"),
            "unavailable",
        ),
        (ConnectionRefusedError(111, "Connect call failed"), "unavailable"),
        (
            sqlalchemy.exc.TimeoutError(
                "QueuePool limit of size 5 overflow 10 reached, connection timed out"
            ),
            "unavailable",
        ),
        (asyncpg.InvalidCatalogNameError('database "x" does not exist'), "misconfigured"),
        (
            asyncpg.InsufficientPrivilegeError(
                'permission denied for database "x"\nDETAIL: User does not have CONNECT privilege.'
            ),
            "misconfigured",
        ),
        (
            asyncpg.InvalidAuthorizationSpecificationError('role "x" is not permitted to log in'),
            "misconfigured",
        ),
        (asyncpg.InvalidPasswordError('password authentication failed for "x"'), "misconfigured"),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else str(value),
)
def test_every_refusal_of_a_connection_is_a_fault(error: BaseException, kind: str) -> None:
    for raised in (error, _wrapped(error)):
        fault = classify(raised)
        assert fault is not None, raised
        assert fault.kind == kind


@pytest.mark.parametrize(
    "error",
    [
        asyncpg.ObjectNotInPrerequisiteStateError("currval of sequence is not yet defined"),
        asyncpg.InsufficientPrivilegeError("permission denied for table runs"),
    ],
)
def test_the_same_sqlstates_for_other_reasons_are_not_faults(error: Any) -> None:
    assert classify(_wrapped(error)) is None
