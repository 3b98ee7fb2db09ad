"""The whole API fuzzed from its own OpenAPI document (schemathesis), on SQLite (and, by
test_schemathesis_postgresql.py, on PostgreSQL), in every run.

- ``test_api``: every operation, with data that fits the document and data that does not
  (schemathesis' positive and negative modes), checked by all of schemathesis' checks: no
  5xx, only documented statuses, content types and headers, bodies that match the declared
  schemas, valid data accepted and invalid data refused, 405 with a full ``Allow`` for an
  undocumented method, and authentication enforced (``ignored_auth`` sends each
  authenticated request again without the key and with a wrong one).
- ``test_stateful``: sequences that follow the document's links (create → context → runs →
  run record …), checked the same way.

The app runs with API keys for two tenants and every request carries acme's key, so the
fuzzing goes through authentication like any client. Data that fits the document names the
configured agent profile and a well-formed ``Prefer`` (random strings there are left to the
negative mode); each stateful scenario starts from an empty service so that Hypothesis can
replay it. Bounded: 30 examples per operation and 30 scenarios of up to 6 steps, no deadline
(the database is real) — on 2 cores, about 100 seconds a module, 40 of them the import's.
Both engines, because each refuses values of its own (PostgreSQL: a NUL in a text column, an
integer past 32 bits).

The schema is loaded from the document (``openapi_document()``, which the first test checks
against what the app serves) and the requests go to the app in process through schemathesis'
ASGI client: schemathesis' lazy ``from_fixture`` loader does not run under pytest 9.
"""

from __future__ import annotations

import copy
import hashlib
import re
import sqlite3
from collections import Counter
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import CHECKS as _REGISTRY
from schemathesis.checks import load_all_checks
from schemathesis.config import SchemathesisConfig
from schemathesis.config._checks import POSITIVE_DATA_ACCEPTANCE_EXPECTED_STATUSES as ACCEPTED
from schemathesis.core.parameters import ParameterLocation
from schemathesis.python import asgi
from sqlalchemy.engine import make_url

from app.agent.messages import Context
from app.agent.replay import ReplayError, validate_context, validate_storable
from app.agent.structured import schema_problem
from app.api.app import create_app, openapi_document
from app.api.exports import ConversationExport
from app.config import Settings
from tests.conftest import run_blocking
from tests.fakes.mcp_server import FakeMcp

from .conftest import ACME_KEY, API_KEYS, fuzz_on

#: SQLite here; test_schemathesis_postgresql.py runs these tests on PostgreSQL
pytestmark = fuzz_on("sqlite")

load_all_checks()
#: every check schemathesis has (its CLI's ``--checks all``); ``max_response_time`` is none of
#: them unless given a limit, and this suite asserts no wall-clock bound
CHECKS = list(_REGISTRY.get_all())
MAX_EXAMPLES = 30
SETTINGS = settings(
    max_examples=MAX_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)


class DeferredApp:
    """The ASGI app the schema sends to, created by a fixture (it needs the test database)
    after the schema is loaded: every request — the cases' and the probes some checks send
    on their own (``ignored_auth`` without the key) — reaches it in process."""

    app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        assert self.app is not None, "the fuzzed_app fixture did not run"
        await self.app(scope, receive, send)


APP = DeferredApp()
#: the document the app serves (it does not depend on settings; test_api_document checks it)
DOCUMENT = openapi_document()
#: Every request carries acme's key, as schemathesis' own auth: its checks know which requests
#: are authenticated (``ignored_auth`` sends them again without the key and with a wrong one;
#: a negative case that leaves the key out must be refused).
#:
#: A request that fits the document may still be refused for the state it meets, as schemathesis
#: allows for 409 (a run in progress): 412 when its generated If-Match names no current ETag,
#: and 428 for a PUT of a context without If-Match or If-None-Match, which the document says but
#: cannot make a rule of (OpenAPI has no "one of these two headers"); 410 for the events of a
#: run that has none any more (e.g. one restored by an import, whose events are not exported).
CONFIG = SchemathesisConfig.from_dict(
    {
        # a request is the app in process: 60 s, not schemathesis's 10, before it counts as
        # hanging (on a loaded machine a waiting run's request took longer than 10 s)
        "request-timeout": 60,
        # schemathesis' constants analysis (about 230 values read from the app's source, put
        # into generated bodies) is off: drawing the export document of POST
        # /conversations/import with it took 128 s of this module's 187 (40 s without), and
        # the values the API takes (roles, block types, stop reasons) are the document's
        # own enums, which generation draws from anyway
        "analysis": {"constants": {"enabled": False}},
        "auth": {"openapi": {"HTTPBearer": {"bearer": ACME_KEY}}},
        "checks": {
            "positive_data_acceptance": {"expected-statuses": [*ACCEPTED, "410", "412", "428"]},
        },
    }
)
schema = schemathesis.openapi.from_dict(copy.deepcopy(DOCUMENT), config=CONFIG)  # adds links
schema.app = APP


#: the grammar of each header parameter that has one (the same in every operation)
HEADER_PATTERNS = {
    parameter["name"]: re.compile(parameter["schema"]["pattern"])
    for operations in DOCUMENT["paths"].values()
    for operation in operations.values()
    for parameter in operation.get("parameters", [])
    if parameter["in"] == "header" and "pattern" in parameter["schema"]
}


def json_integers(value: Any) -> Any:
    """``value`` with integral floats as integers. JSON Schema counts ``5.0`` as an
    ``integer`` and schemathesis sends it so; Carryover's codec takes a JSON integer only as
    ``5`` (tests/agent/test_codec.py: wrong JSON types are not coerced), which a schema cannot
    say."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [json_integers(item) for item in value]
    if isinstance(value, dict):
        return {key: json_integers(item) for key, item in value.items()}
    return value


@schema.hook
def map_case(context: Any, case: Any) -> Any:
    """Data that fits the document reaches further when it names a configured agent profile.

    Schemathesis' coverage phase keeps header values alphanumeric and, for a header whose
    pattern needs other characters (every entity-tag has quotes), puts a placeholder such as
    ``0`` into the cases it means to be valid; such a header is left out of them (the fuzzing
    phase generates the headers from their patterns). A valid Idempotency-Key is made one per
    body, so that a key is never meant for two different requests; integral floats become
    integers (see :func:`json_integers`)."""
    if case.meta is not None and case.meta.generation.mode.is_positive:
        if isinstance(case.body, dict) and isinstance(case.body.get("agent"), str):
            case.body["agent"] = "default"
        if case.operation.label == "POST /conversations/{conversation_id}/runs":
            fit_run_to_the_conversation(case.body, case.headers)
        if case.operation.label == "POST /conversations/{conversation_id}/fork" and isinstance(
            case.body, dict
        ):
            # a cut must fit the source's messages (422 unsafe-cut otherwise, a state the
            # schema cannot know): 0 always does (a whole float too: it becomes an integer)
            cut = case.body.get("messages")
            if isinstance(cut, int | float) and not isinstance(cut, bool):
                case.body["messages"] = 0
        case.body = json_integers(case.body)
        if case.headers and "Idempotency-Key" in case.headers:
            # one key per body: a key reused with another body is 422 idempotency-key-mismatch
            digest = hashlib.sha256(repr(case.body).encode()).hexdigest()[:16]
            case.headers["Idempotency-Key"] = f"key-{digest}"
        for name, value in list((case.headers or {}).items()):
            pattern = HEADER_PATTERNS.get(name)
            if pattern is not None and isinstance(value, str) and not pattern.match(value):
                del case.headers[name]
    return case


#: what a valid client tool is beyond its schema (docs/tools.md)
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_SERVER_TOOLS = {"time_now", "wait", "fail"}


def fit_run_to_the_conversation(body: Any, headers: Any = None) -> None:
    """A run's answers to pending tool calls (``tool_result`` prompts, ``approvals``) and its
    ``require_approval`` names are checked against the stored context and the agent's tools,
    which a schema cannot state (422 ``unexpected-tool-answer`` / ``validation-error``, as the
    operation documents), nor can it state which JSON objects are JSON Schemas (an
    ``output_schema``'s ``schema``): data meant to be valid keeps none of them, only client
    tools that fit the rules, and at least one prompt (a run without answers needs one)."""
    if not isinstance(body, dict):
        return
    prefer = str((headers or {}).get("Prefer", ""))
    queued = "respond-async" in prefer or body.get("if_busy") in ("wait", "enqueue")
    schema = body.get("output_schema")
    if isinstance(schema, dict) and schema_problem(schema.get("schema")) is not None:
        # a JSON object that is no JSON Schema is refused (422 validation-error, as documented);
        # the document cannot say what a valid JSON Schema is
        del body["output_schema"]
    body.pop("approvals", None)
    body.pop("require_approval", None)
    prompts = [
        p
        for p in body.get("prompts") or []
        if not (isinstance(p, dict) and p.get("type") == "tool_result")
    ]
    body["prompts"] = prompts or ["hello"]
    seen: set[str] = set()
    tools = []
    for tool in body.get("tools") or []:
        if isinstance(tool, dict) and tool.get("type") == "mcp":
            first = not any(t.get("type") == "mcp" for t in tools)
            fitted = fit_mcp_server(tool, body, first=first, queued=queued)
            if fitted is not None:
                tools.append(fitted)
            continue
        name = tool.get("name") if isinstance(tool, dict) else None
        parameters = tool.get("parameters", {"type": "object"}) if isinstance(tool, dict) else None
        if (
            isinstance(name, str)
            and _TOOL_NAME.match(name)
            and name not in _SERVER_TOOLS | _MCP_TOOLS | seen
            and isinstance(parameters, dict)
            and parameters.get("type") == "object"
            and isinstance(parameters.get("properties", {}), dict)
        ):
            seen.add(name)
            tools.append(tool)
    if "tools" in body:
        body["tools"] = tools


#: the MCP server the fuzzed runs may name (tests/fakes/mcp_server.py), and the names of its
#: tools (a client tool may not share one)
MCP: dict[str, str] = {}
_MCP_TOOLS = {"lookup", "add", "explode", "hold"}


def fit_mcp_server(tool: dict[str, Any], body: dict[str, Any], *, first: bool, queued: bool) -> Any:
    """An MCP entry meant to be valid, as the service can take it: at the one server this
    deployment allows (CARRYOVER_MCP_ALLOWED_URLS), one per run (a second one on that server
    offers the same names: 422, as documented), approval lists that do not both name a tool,
    and no headers on a run that goes through the queue (they are never stored: 422)."""
    if not first or "url" not in MCP:
        return None
    fitted = {**tool, "server_url": MCP["url"]}
    approval = fitted.get("require_approval")
    if isinstance(approval, dict) and approval.get("always") and approval.get("never"):
        fitted["require_approval"] = {"never": approval["never"]}
    if queued:
        fitted.pop("headers", None)
    return fitted


#: operations whose body may be JSON ``null`` (or left out), as the document says
NULLABLE_BODIES = {
    f"{method.upper()} {path}"
    for path, operations in DOCUMENT["paths"].items()
    for method, operation in operations.items()
    if {"type": "null"}
    in operation.get("requestBody", {})
    .get("content", {})
    .get("application/json", {})
    .get("schema", {})
    .get("anyOf", [])
}


@schema.hook
def filter_case(context: Any, case: Any) -> bool:
    """Leave out the cases whose mode is not what the document makes of them.

    - A negative case whose body is ``null`` or absent where the document allows both:
      schemathesis counts them as wrong without looking at the ``null`` branch.
    - A negative case that leaves out or spoils the ``Authorization`` header: the configured
      key is put back into it, so it is not negative any more (``ignored_auth`` sends every
      authenticated request again without the key and with a wrong one instead).
    - A context that breaks the replay rules (contract §1: every tool_result answers a pending
      tool_call, ...), which a schema cannot state, sent as valid: the server refuses it, 422
      ``unreplayable-context``, as the operation documents.
    """
    if case.meta is None:
        return True
    if case.meta.generation.mode.is_negative:
        if case.operation.label in NULLABLE_BODIES and not isinstance(case.body, dict):
            return False
        data = case.meta.phase.data
        negated = {getattr(data, "parameter", None)}
        negated |= {mutation.parameter for mutation in getattr(data, "mutations", ())}
        if "Authorization" in negated:
            return False
        headers = case.meta.components.get(ParameterLocation.HEADER)
        if headers is not None and headers.mode.is_negative:
            # Not every phase says which header it negated; the key is one of them, so a case
            # with negated headers is left out (tests/security/test_bad_input.py sends each
            # malformed header value on purpose).
            return False
    if case.meta is None:
        return True
    if case.operation.label == "PUT /conversations/{conversation_id}/context":
        try:
            validate_context(Context.model_validate(json_integers(case.body)))
        except ReplayError:
            return False
        except ValueError:
            pass  # not a context at all: the server says why
    if (
        case.operation.label == "POST /conversations/import"
        and case.meta.generation.mode.is_positive
    ):
        # an export document's rules beyond its schema (a storable context, transcript seq
        # increasing, run ids unique: docs/conversations.md) are refused with 422 as documented
        try:
            document = ConversationExport.model_validate(json_integers(case.body))
            validate_storable(document.context)
        except (ReplayError, ValueError):
            return False
    return True


@pytest.fixture(scope="module")
def mcp_server() -> Iterator[FakeMcp]:
    with FakeMcp("fuzzed") as fake:
        MCP["url"] = fake.url
        try:
            yield fake
        finally:
            MCP.clear()


@pytest.fixture(scope="module")
def fuzzed_app(fuzzed_database: str, mcp_server: FakeMcp) -> Any:
    return create_app(
        Settings(
            database_url=fuzzed_database,
            mcp_allowed_urls=(f"http://127.0.0.1:{mcp_server.port}/",),
            api_keys=API_KEYS,
            lease_seconds=2.0,
            busy_wait_seconds=1.0,
            auth_failure_limit=0,  # it sends wrong keys from one address (test_auth_throttle.py)
            # every per-run setting the document names may be set (a profile that allows fewer
            # refuses the others with 422: docs/contract.md "Per-run settings")
            allowed_run_settings=("model", "temperature", "max_output_tokens", "instructions"),
        )
    )


def forget_conversations(database: str) -> None:
    """Delete every conversation (and, by cascade, everything of it)."""
    url = make_url(database)
    if url.get_backend_name() == "sqlite":
        with sqlite3.connect(url.database or "", timeout=10) as conn:
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("DELETE FROM conversations")
        return

    async def delete() -> None:
        conn = await asyncpg.connect(url.set(drivername="postgresql").render_as_string(False))
        try:
            await conn.execute("DELETE FROM conversations")
        finally:
            await conn.close()

    run_blocking(delete)


@pytest.fixture(scope="module")
def session(fuzzed_app: Any) -> Iterator[Any]:
    """A requests session whose every request goes to the app in process (its lifespan runs
    for the module)."""
    APP.app = fuzzed_app
    try:
        with asgi.get_client(APP) as client:
            yield client
    finally:
        asgi.shutdown_lifespans()


def test_api_document_is_what_the_app_serves(session: Any) -> None:
    assert session.get("/openapi.json").json() == DOCUMENT


@schema.parametrize()
@SETTINGS
def test_api(case: Any, session: Any) -> None:
    # the hooks do not see the coverage phase: its cases go through them here
    case = map_case(None, case)
    if not filter_case(None, case):
        return
    case.call_and_validate(checks=CHECKS)


def test_stateful(session: Any, fuzzed_database: str) -> None:
    answered: Counter[tuple[str, int]] = Counter()

    class Workflow(schema.as_state_machine()):  # type: ignore[misc]
        def setup(self) -> None:
            # Each scenario starts from an empty service, so that replaying a scenario's
            # steps gets the same answers (Hypothesis requires it).
            forget_conversations(fuzzed_database)

        def validate_response(
            self, response: Any, case: Any, additional_checks: Any = None, **kwargs: Any
        ) -> None:
            answered[case.operation.label, response.status_code] += 1
            if not filter_case(None, case):  # as in test_api: the hook does not see every case
                return
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
