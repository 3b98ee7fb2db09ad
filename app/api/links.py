"""What the OpenAPI document says beyond the route decorators: links, and the answers that
middleware gives on every operation.

- **Links** (OpenAPI 3.1 §4.8.20) say how one answer feeds the next request: the ``id`` of a
  created conversation is the ``conversation_id`` of its context, runs and transcript; a run's
  ``run_id`` names its record; a context's ``ETag`` is the ``If-Match`` of its replacement.
  Generated clients and stateful testing (schemathesis follows them) use them.
- **Middleware answers**: 401 (and 503 when the key cannot be checked) on every operation that
  needs a key (``/metrics`` needs one unless ``CARRYOVER_PUBLIC_METRICS`` is set, so its
  security requirement is optional), 413 on every request that may carry a body, and 400/415
  on every operation that takes a JSON body. Declared here once, so no route can forget them.

- **Exact bodies**: a discriminated union's tag (``type`` of every message, block and image
  source) is required in each member, as OpenAPI's discriminator demands and the server
  enforces (pydantic leaves it optional because the models give it a default); base64 image
  data carries the pattern the server checks.

Applied to the schema FastAPI generates, after the problem documentation; idempotent.
"""

from __future__ import annotations

import copy
from typing import Any

from fastapi import FastAPI

from .problems import (
    DATABASE_UNAVAILABLE,
    MALFORMED_JSON,
    NOT_READY,
    PAYLOAD_TOO_LARGE,
    TOO_MANY_AUTH_FAILURES,
    UNAUTHORIZED,
    UNSUPPORTED_MEDIA_TYPE,
    problem_responses,
)

_CONVERSATION_ID = "$response.body#/id"
_RUN_CONVERSATION = "$response.body#/conversation_id"
_SAME_CONVERSATION = "$request.path.conversation_id"


def _link(operation_id: str, description: str, **parameters: str) -> dict[str, Any]:
    """A link object; ``If_Match`` stands for the request header ``If-Match``."""
    names = {"If_Match": "header.If-Match"}
    return {
        "operationId": operation_id,
        "description": description,
        "parameters": {names.get(name, name): value for name, value in parameters.items()},
    }


def _conversation_links(source: str) -> dict[str, Any]:
    return {
        "GetConversation": _link(
            "get_conversation", "The conversation's metadata", conversation_id=source
        ),
        "GetContext": _link(
            "get_context", "The conversation's stored Context", conversation_id=source
        ),
        "PutContext": _link(
            "put_context", "Replace the conversation's Context", conversation_id=source
        ),
        "CreateRun": _link(
            "create_run", "Run the agent on the conversation", conversation_id=source
        ),
        "ListRuns": _link("list_runs", "The conversation's runs", conversation_id=source),
        "GetTranscript": _link(
            "get_transcript", "The conversation's transcript", conversation_id=source
        ),
        "Compact": _link(
            "compact_conversation", "Compact the conversation now", conversation_id=source
        ),
        "DeleteConversation": _link(
            "delete_conversation", "Delete the conversation", conversation_id=source
        ),
    }


#: (path, method, status) → links of that response
LINKS: dict[tuple[str, str, str], dict[str, Any]] = {
    ("/conversations", "post", "201"): _conversation_links(_CONVERSATION_ID),
    ("/conversations/{conversation_id}/context", "get", "200"): {
        "ReplaceContext": _link(
            "put_context",
            "Replace this context, on the condition that it is still current",
            conversation_id=_SAME_CONVERSATION,
            If_Match="$response.header.ETag",
        ),
        "CreateRun": _link(
            "create_run",
            "Run the agent on this context, if it is still current",
            conversation_id=_SAME_CONVERSATION,
            If_Match="$response.header.ETag",
        ),
    },
    ("/conversations/{conversation_id}/context", "put", "200"): {
        "CreateRun": _link(
            "create_run", "Run the agent on the new context", conversation_id=_SAME_CONVERSATION
        ),
        "GetContext": _link(
            "get_context", "The stored context", conversation_id=_SAME_CONVERSATION
        ),
    },
    ("/conversations/{conversation_id}/context", "put", "201"): {
        "CreateRun": _link(
            "create_run",
            "Run the agent on the new conversation",
            conversation_id=_SAME_CONVERSATION,
        ),
        "GetContext": _link(
            "get_context", "The stored context", conversation_id=_SAME_CONVERSATION
        ),
    },
    ("/conversations/{conversation_id}/runs", "post", "201"): {
        "GetRun": _link(
            "get_run",
            "This run's record",
            conversation_id=_RUN_CONVERSATION,
            run_id="$response.body#/run_id",
        ),
        "CancelRun": _link(
            "cancel_run",
            "Cancel this run",
            conversation_id=_RUN_CONVERSATION,
            run_id="$response.body#/run_id",
        ),
        "GetContext": _link(
            "get_context", "The stored context after this run", conversation_id=_RUN_CONVERSATION
        ),
        "GetTranscript": _link(
            "get_transcript",
            "The transcript, with this run's entries",
            conversation_id=_RUN_CONVERSATION,
        ),
    },
    ("/conversations/{conversation_id}/compact", "post", "201"): {
        "GetRun": _link(
            "get_run",
            "The compaction's run record",
            conversation_id=_RUN_CONVERSATION,
            run_id="$response.body#/run_id",
        ),
    },
}

_BODY_METHODS = frozenset({"post", "put", "patch", "delete"})


def _add_responses(operation: dict[str, Any], extra: dict[int | str, dict[str, Any]]) -> None:
    responses = operation.setdefault("responses", {})
    for status, response in extra.items():
        responses.setdefault(str(status), response)


#: what ``base64.b64decode(data, validate=True)`` accepts: the alphabet, in padded quartets
BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"


def _require_discriminators(node: Any, components: dict[str, Any]) -> None:
    if isinstance(node, list):
        for item in node:
            _require_discriminators(item, components)
        return
    if not isinstance(node, dict):
        return
    discriminator = node.get("discriminator")
    if isinstance(discriminator, dict):
        tag = discriminator.get("propertyName")
        for ref in discriminator.get("mapping", {}).values():
            member = components.get(str(ref).rsplit("/", 1)[-1])
            if member is not None and tag in member.get("properties", {}):
                required = member.setdefault("required", [])
                if tag not in required:
                    required.insert(0, tag)
    for value in node.values():
        _require_discriminators(value, components)


def document_extras(schema: dict[str, Any]) -> None:
    """Add the links, the middleware's answers and the exact body rules to ``schema``
    (in place)."""
    components = schema.get("components", {}).get("schemas", {})
    for name, component in components.items():
        if name.endswith(("-Input", "-Output")):
            # a request's and an answer's schema of one model: titled apart, since generators
            # (openapi-python-client) name models by title
            component["title"] = name.replace("-", "")
    _require_discriminators(schema, components)
    # one schema, or a request's and an answer's (FastAPI's ``-Input`` / ``-Output``)
    for name in ("Base64Source", "Base64Source-Input", "Base64Source-Output"):
        data = components.get(name, {}).get("properties", {}).get("data")
        if isinstance(data, dict):
            data.update({"pattern": BASE64_PATTERN, "contentEncoding": "base64"})
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            for status, response in operation["responses"].items():
                links = LINKS.get((path, method, status))
                if links:
                    response["links"] = copy.deepcopy(links)  # a document's own, to edit
            if path == "/metrics":
                # a key when keys are configured, unless CARRYOVER_PUBLIC_METRICS is set
                operation["security"] = [{"HTTPBearer": []}, {}]
                _add_responses(operation, problem_responses(UNAUTHORIZED))
            elif operation.get("security"):
                _add_responses(
                    operation,
                    problem_responses(
                        UNAUTHORIZED, TOO_MANY_AUTH_FAILURES, NOT_READY, DATABASE_UNAVAILABLE
                    ),
                )
            if method in _BODY_METHODS:
                _add_responses(operation, problem_responses(PAYLOAD_TOO_LARGE))
            if "requestBody" in operation:
                _add_responses(operation, problem_responses(MALFORMED_JSON, UNSUPPORTED_MEDIA_TYPE))


def install_links(app: FastAPI) -> None:
    """Make ``app.openapi()`` include :func:`document_extras`."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        schema = generate()
        document_extras(schema)
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
