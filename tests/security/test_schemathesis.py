"""The whole API fuzzed from its own OpenAPI document (schemathesis), on SQLite, in every run.

- ``test_api``: every operation, with data that fits the document and data that does not
  (schemathesis' positive and negative modes), checked by the default response checks: no
  5xx (``not_a_server_error``), only documented statuses, content types and headers, and
  bodies that match the declared schemas.
- ``test_stateful``: sequences that follow the document's links (create → context → runs →
  run record …), checked the same way.

The app runs with API keys for two tenants and every request carries acme's key, so the
fuzzing goes through authentication like any client. Data that fits the document names the
configured agent profile and a well-formed ``Prefer`` (random strings there are left to the
negative mode); each stateful scenario starts from an empty service so that Hypothesis can
replay it. Bounded: 30 examples per operation and 30 scenarios of up to 6 steps, no deadline
(the database is real) — about 20 seconds.

The schema is loaded from the document (``openapi_document()``, which the first test checks
against what the app serves) and the requests go to the app in process through schemathesis'
ASGI client: schemathesis' lazy ``from_fixture`` loader does not run under pytest 9.
"""

from __future__ import annotations

import copy
import sqlite3
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.python import asgi
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from app.api.app import create_app, openapi_document
from app.config import Settings
from tests.conftest import _copy_sqlite

from .conftest import ACME_KEY, API_KEYS

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
AUTH = {"Authorization": f"Bearer {ACME_KEY}"}
BASE_URL = f"http://{asgi.HOST}"
MAX_EXAMPLES = 30
SETTINGS = settings(
    max_examples=MAX_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)

#: the document the app serves (it does not depend on settings; test_api_document checks it)
DOCUMENT = openapi_document()
schema = schemathesis.openapi.from_dict(copy.deepcopy(DOCUMENT))  # it adds inferred links


@schema.hook
def map_case(context: Any, case: Any) -> Any:
    """Data that fits the document reaches further when it names a configured agent profile and
    a Prefer header that is one (random strings are left to the negative mode)."""
    if case.meta is not None and case.meta.generation.mode.is_positive:
        if isinstance(case.body, dict) and isinstance(case.body.get("agent"), str):
            case.body["agent"] = "default"
        if case.headers and "Prefer" in case.headers:
            case.headers["Prefer"] = "return=minimal"
    return case


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory, _sqlite_template: Path) -> Path:
    path = tmp_path_factory.mktemp("schemathesis") / "carryover.db"
    _copy_sqlite(_sqlite_template, path)
    return path


@pytest.fixture(scope="module")
def fuzzed_app(database: Path) -> Any:
    return create_app(
        Settings(
            database_url=f"sqlite:///{database}",
            api_keys=API_KEYS,
            lease_seconds=2.0,
            busy_wait_seconds=1.0,
        )
    )


def forget_conversations(database: Path) -> None:
    """Delete every conversation (and, by cascade, everything of it)."""
    with sqlite3.connect(database, timeout=10) as conn:
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("DELETE FROM conversations")


@pytest.fixture(scope="module")
def session(fuzzed_app: Any) -> Iterator[Any]:
    """A requests session whose every request goes to the app in process (its lifespan runs
    for the module)."""
    try:
        with asgi.get_client(fuzzed_app) as client:
            yield client
    finally:
        asgi.shutdown_lifespans()


def test_api_document_is_what_the_app_serves(session: Any) -> None:
    assert session.get("/openapi.json").json() == DOCUMENT


@schema.parametrize()
@SETTINGS
def test_api(case: Any, session: Any) -> None:
    case.call_and_validate(session=session, base_url=BASE_URL, headers=AUTH, checks=CHECKS)


def test_stateful(session: Any, database: Path) -> None:
    answered: Counter[tuple[str, int]] = Counter()

    class Workflow(schema.as_state_machine()):  # type: ignore[misc]
        def setup(self) -> None:
            # Each scenario starts from an empty service, so that replaying a scenario's
            # steps gets the same answers (Hypothesis requires it).
            forget_conversations(database)

        def get_call_kwargs(self, case: Any) -> dict[str, Any]:
            return {"session": session, "base_url": BASE_URL, "headers": AUTH}

        def validate_response(
            self, response: Any, case: Any, additional_checks: Any = None, **kwargs: Any
        ) -> None:
            answered[case.operation.label, response.status_code] += 1
            case.validate_response(response, checks=CHECKS, transport_kwargs=kwargs)

    Workflow.run(settings=settings(SETTINGS, stateful_step_count=6))
    # the links were followed: conversations were created, then used through their id
    assert answered["POST /conversations", 201] > 0, answered
    followed = sum(
        n
        for (label, status), n in answered.items()
        if "{conversation_id}" in label and 200 <= status < 300
    )
    assert followed > 0, answered
