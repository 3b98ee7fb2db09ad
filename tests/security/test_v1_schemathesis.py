"""The ``/v1`` surface fuzzed from its own document (``openapi/v1.json``, schemathesis), on
SQLite and PostgreSQL: with data that fits the document and data that does not, no answer is a
5xx, every status is one the document lists, data that does not fit is refused, authentication
is enforced (each request sent again without the key and with a wrong one), and every refusal
is OpenAI's error object (never a problem+json). Bounded: 20 examples per operation, no
deadline (the database is real).

The document's item schemas are loose (an item is any object; its rules are the mapping's,
app/api/v1/items.py), so "valid data is accepted" is not one of the checks here."""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.python import asgi
from schemathesis.specs.openapi.checks import (
    ignored_auth,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from app.api.app import create_app
from app.api.v1 import v1_document
from app.config import Settings

from .conftest import ACME_KEY, API_KEYS, fuzz_on

pytestmark = fuzz_on("sqlite", "postgresql")

SETTINGS = settings(
    max_examples=20, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)


class DeferredApp:
    """The app the schema sends to, created by a fixture after the schema is loaded."""

    app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        assert self.app is not None, "the session fixture did not run"
        await self.app(scope, receive, send)


APP = DeferredApp()
#: 60 s before a request of the app in process counts as hanging (schemathesis's default is 10)
CONFIG = SchemathesisConfig.from_dict(
    {"request-timeout": 60, "auth": {"openapi": {"HTTPBearer": {"bearer": ACME_KEY}}}}
)
schema = schemathesis.openapi.from_dict(v1_document(), config=CONFIG)
schema.app = APP


def openai_error_shape(ctx: Any, response: Any, case: Any) -> bool | None:
    """A refusal is ``{"error": {"message", "type", "param", "code"}}``, as JSON. Not
    registered with ``@schemathesis.check``: that would add it to every schema's checks, and
    test_schemathesis.py runs all registered checks on the native API, whose refusals are
    problem+json."""
    if response.status_code < 400:
        return None
    media = response.headers.get("content-type", [""])
    media = media[0] if isinstance(media, list) else media
    assert media.startswith("application/json"), f"{response.status_code} answered as {media}"
    body = response.json()
    assert isinstance(body, dict) and set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"], error
    return None


@pytest.fixture(scope="module")
def session(fuzzed_database: str) -> Any:
    APP.app = create_app(
        Settings(
            database_url=fuzzed_database,
            api_keys=API_KEYS,
            lease_seconds=2.0,
            auth_failure_limit=0,
        )
    )
    try:
        with asgi.get_client(APP) as client:
            yield client
    finally:
        asgi.shutdown_lifespans()


@schema.parametrize()
@SETTINGS
def test_v1(case: Any, session: Any) -> None:
    case.call_and_validate(
        checks=[
            not_a_server_error,
            status_code_conformance,
            response_schema_conformance,
            negative_data_rejection,
            ignored_auth,
            openai_error_shape,
        ]
    )
