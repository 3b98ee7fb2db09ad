"""The committed OpenAPI document (contract §4): equal to what the app serves, deterministic, free
of secrets, and saying what generated clients need — every route, readable operation ids,
the conditional and preference request headers, and the ETag and Location response headers."""

from __future__ import annotations

import difflib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute

from app.api.app import create_app, openapi_document
from app.api.routes import conversations, events, health, runs, transcript, usage
from app.cli import default_settings, openapi_json

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "openapi" / "openapi.json"
REGENERATE = "carryover openapi"

OPERATIONS = {
    ("post", "/conversations"): "create_conversation",
    ("get", "/conversations"): "list_conversations",
    ("get", "/conversations/{conversation_id}"): "get_conversation",
    ("delete", "/conversations/{conversation_id}"): "delete_conversation",
    ("patch", "/conversations/{conversation_id}"): "patch_conversation",
    ("post", "/conversations/{conversation_id}/fork"): "fork_conversation",
    ("get", "/conversations/{conversation_id}/export"): "export_conversation",
    ("post", "/conversations/import"): "import_conversation",
    ("get", "/conversations/{conversation_id}/context"): "get_context",
    ("get", "/conversations/{conversation_id}/versions"): "list_context_versions",
    ("put", "/conversations/{conversation_id}/context"): "put_context",
    ("post", "/conversations/{conversation_id}/runs"): "create_run",
    ("get", "/conversations/{conversation_id}/runs"): "list_runs",
    ("get", "/conversations/{conversation_id}/runs/{run_id}"): "get_run",
    ("post", "/conversations/{conversation_id}/runs/{run_id}/cancel"): "cancel_run",
    ("get", "/conversations/{conversation_id}/runs/{run_id}/events"): "run_events",
    ("post", "/conversations/{conversation_id}/compact"): "compact_conversation",
    ("get", "/conversations/{conversation_id}/transcript"): "get_transcript",
    ("get", "/healthz"): "healthz",
    ("get", "/readyz"): "readyz",
    ("get", "/metrics"): "metrics",
    ("get", "/usage"): "get_usage",
}


def served() -> dict[str, Any]:
    """What the app serves, built as ``carryover openapi`` builds it."""
    document: dict[str, Any] = create_app(default_settings()).openapi()
    return document


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(COMMITTED.read_text(encoding="utf-8"))
    return loaded


def operation(document: dict[str, Any], method: str, path: str) -> dict[str, Any]:
    found: dict[str, Any] = document["paths"][path][method]
    return found


def parameters(op: dict[str, Any], where: str) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in op.get("parameters", []) if p["in"] == where}


# --- the committed file ---------------------------------------------------------------------


def test_the_committed_document_is_what_the_app_serves() -> None:
    assert COMMITTED.exists(), f"{COMMITTED.relative_to(ROOT)} is missing: run '{REGENERATE}'"
    committed = COMMITTED.read_text(encoding="utf-8")
    current = openapi_json(served())
    if committed != current:
        diff = list(
            difflib.unified_diff(
                committed.splitlines(),
                current.splitlines(),
                "committed",
                "served",
                lineterm="",
                n=1,
            )
        )
        shown = "\n".join(diff[:60]) + ("\n..." if len(diff) > 60 else "")
        pytest.fail(
            f"openapi/openapi.json is not what the app serves. Regenerate it with "
            f"'{REGENERATE}' (from the repository root) and commit it.\n{shown}",
            pytrace=False,
        )


async def test_the_app_serves_the_committed_document_over_http(
    document: dict[str, Any],
) -> None:
    app = create_app(default_settings())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://carryover.test") as client:
        got = await client.get("/openapi.json")
    assert got.status_code == 200
    assert got.json() == document


def test_the_command_writes_the_same_document_whatever_the_environment(tmp_path: Path) -> None:
    """``carryover openapi`` reads no configuration: a hostile or broken environment changes
    nothing in the document and none of its secrets reach it."""
    secrets = ["pg-password-0xdeadbeef", "tenant-key-0xfeedface", "sk-openai-0xcafebabe"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CARRYOVER_")}
    env.update(
        {
            "CARRYOVER_DATABASE_URL": f"postgresql://carry:{secrets[0]}@db.internal:5432/prod",
            "CARRYOVER_API_KEYS": f"acme:{secrets[1]}",
            "OPENAI_API_KEY": secrets[2],
            "CARRYOVER_PROVIDER": "openai",  # without a model: this configuration does not validate
            "CARRYOVER_MAX_PAGE_SIZE": "7",
            "CARRYOVER_CORS_ORIGINS": "https://app.example.com",
            "CARRYOVER_CONFIG_FILE": str(tmp_path / "missing.toml"),
        }
    )
    output = tmp_path / "openapi.json"
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "openapi", "--output", str(output)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    text = output.read_text(encoding="utf-8")
    assert text == openapi_json(served())
    for secret in secrets:
        assert secret not in text
    assert "db.internal" not in text and "app.example.com" not in text


def test_the_document_holds_no_secret_or_local_detail(document: dict[str, Any]) -> None:
    text = json.dumps(document)
    for needle in (
        "sqlite:",
        "postgresql:",
        "carryover.db",
        "127.0.0.1",
        'api_key"',
        str(ROOT),
        "/home/",
        "/tmp/",
    ):
        assert needle not in text, needle
    assert not re.search(r"sk-[A-Za-z0-9]{8,}", text)


def test_the_document_is_stable_sorted_json() -> None:
    committed = COMMITTED.read_text(encoding="utf-8")
    assert committed == openapi_json(json.loads(committed))
    assert openapi_json(served()) == openapi_json(served())  # built twice, the same
    assert openapi_document() == served()


# --- what it says ---------------------------------------------------------------------------


def test_every_route_is_documented_with_a_readable_operation_id(
    document: dict[str, Any],
) -> None:
    routes = {
        (method.lower(), route.path)
        for module in (conversations, runs, events, transcript, health, usage)
        for route in module.router.routes
        if isinstance(route, APIRoute) and route.include_in_schema
        for method in route.methods
    }
    documented = {
        (method, path): op["operationId"]
        for path, ops in document["paths"].items()
        for method, op in ops.items()
        if isinstance(op, dict) and "operationId" in op
    }
    assert set(documented) == routes
    assert documented == OPERATIONS
    ids = list(documented.values())
    assert len(set(ids)) == len(ids)
    for op_id in ids:
        assert re.fullmatch(r"[a-z]+(_[a-z]+)*", op_id), op_id
        assert not re.search(r"_(get|post|put|delete)$", op_id), op_id


@pytest.mark.parametrize(
    ("method", "path", "headers"),
    [
        ("put", "/conversations/{conversation_id}/context", {"If-Match", "If-None-Match"}),
        ("get", "/conversations/{conversation_id}/context", {"If-None-Match"}),
        ("delete", "/conversations/{conversation_id}", {"If-Match"}),
        (
            "post",
            "/conversations/{conversation_id}/runs",
            {"If-Match", "Prefer", "Idempotency-Key", "Accept"},
        ),
        ("post", "/conversations/{conversation_id}/compact", {"If-Match", "Prefer"}),
    ],
)
def test_request_headers_are_declared(
    document: dict[str, Any], method: str, path: str, headers: set[str]
) -> None:
    declared = parameters(operation(document, method, path), "header")
    assert headers <= set(declared)
    for name in headers:
        assert declared[name]["required"] is False
        assert declared[name]["description"]
        # a string, never null (an absent header is left out, not sent as "null")
        assert declared[name]["schema"]["type"] == "string"


@pytest.mark.parametrize(
    ("method", "path", "status", "headers"),
    [
        ("post", "/conversations", "201", {"ETag", "Location"}),
        ("get", "/conversations/{conversation_id}", "200", {"ETag"}),
        ("get", "/conversations/{conversation_id}/context", "200", {"ETag"}),
        ("get", "/conversations/{conversation_id}/context", "304", {"ETag"}),
        ("put", "/conversations/{conversation_id}/context", "200", {"ETag"}),
        ("put", "/conversations/{conversation_id}/context", "201", {"ETag", "Location"}),
        ("post", "/conversations/{conversation_id}/runs", "201", {"ETag", "Location"}),
        ("post", "/conversations/{conversation_id}/runs", "409", {"Retry-After"}),
        ("post", "/conversations/{conversation_id}/compact", "201", {"ETag", "Location"}),
    ],
)
def test_response_headers_are_declared(
    document: dict[str, Any], method: str, path: str, status: str, headers: set[str]
) -> None:
    response = operation(document, method, path)["responses"][status]
    declared = response.get("headers", {})
    assert headers <= set(declared)
    for name in headers:
        assert declared[name]["schema"] == {"type": "string"}


def test_conditional_operations_document_their_problems(document: dict[str, Any]) -> None:
    for method, path in [
        ("put", "/conversations/{conversation_id}/context"),
        ("delete", "/conversations/{conversation_id}"),
        ("post", "/conversations/{conversation_id}/runs"),
        ("post", "/conversations/{conversation_id}/compact"),
    ]:
        responses = operation(document, method, path)["responses"]
        for status in ("400", "404", "412", "422"):
            assert status in responses, (method, path, status)
    put = operation(document, "put", "/conversations/{conversation_id}/context")["responses"]
    assert "428" in put and "201" in put


def test_errors_are_problem_details(document: dict[str, Any]) -> None:
    ref = {"$ref": "#/components/schemas/ProblemDetails"}
    for path, ops in document["paths"].items():
        for method, op in ops.items():
            for status, response in op["responses"].items():
                if int(status) < 400 or (path, status) == ("/readyz", "503"):
                    continue  # not ready is answered with the readiness body
                content = response.get("content", {})
                assert set(content) == {"application/problem+json"}, (method, path, status)
                assert content["application/problem+json"]["schema"] == ref, (method, path)
    schemas = document["components"]["schemas"]
    assert "HTTPValidationError" not in schemas
    assert {"type", "title", "status", "detail"} <= set(schemas["ProblemDetails"]["required"])


def test_request_bodies_are_the_wire_models(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    run_create = schemas["RunCreate"]
    prompt = run_create["properties"]["prompts"]["items"]
    assert {"type": "string"} in prompt["anyOf"]
    # a user message, or (contract §7) a tool_result answering a pending client call
    [union] = [p for p in prompt["anyOf"] if "oneOf" in p]
    assert union["discriminator"]["mapping"] == {
        "user": "#/components/schemas/UserMessage-Input",
        "tool_result": "#/components/schemas/ToolResultMessage-Input",
    }
    for name in ("tools", "require_approval", "approvals"):
        assert name in run_create["properties"], name
    run = schemas["Run"]["properties"]
    assert "requires_action" in run["status"]["enum"]
    assert run["required_action"]["anyOf"][0] == {"$ref": "#/components/schemas/RequiredAction"}
    assert "pending_tool_calls" in schemas["Conversation"]["properties"]
    message = schemas["Context-Input"]["properties"]["messages"]["items"]
    assert message["discriminator"]["propertyName"] == "type"
    assert set(message["discriminator"]["mapping"]) == {"user", "assistant", "tool_result"}
    block = schemas["AssistantMessage-Input"]["properties"]["content"]["items"]
    assert set(block["discriminator"]["mapping"]) == {
        "text",
        "thinking",
        "redacted_thinking",
        "tool_call",
    }
    body = operation(document, "put", "/conversations/{conversation_id}/context")["requestBody"]
    assert body["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Context-Input"
    }


def test_every_problem_type_is_documented() -> None:
    """Each registered problem type (request problems and run errors) is named in the
    document, on the schema of the problems that carry it."""
    from app.api.problems import PROBLEM_TYPES

    schemas = openapi_document()["components"]["schemas"]
    request = schemas["ProblemDetails"]["properties"]["type"]["description"]
    run = schemas["RunProblem"]["properties"]["type"]["description"]
    for problem in PROBLEM_TYPES.values():
        assert problem.uri in (run if problem.run_error else request), problem.slug
