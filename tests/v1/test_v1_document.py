"""The ``/v1`` surface has its own OpenAPI document, ``openapi/v1.json``: committed, equal to
what the mounted app serves, every route in it with OpenAI's error object; the native document
has none of its routes."""

from __future__ import annotations

import json
from pathlib import Path

from app.api.app import create_app
from app.cli import default_settings, mounted_documents, openapi_json

ROOT = Path(__file__).resolve().parents[2]

OPERATIONS = {
    ("get", "/models"),
    ("get", "/models/{model}"),
    ("post", "/conversations"),
    ("get", "/conversations/{conversation_id}"),
    ("post", "/conversations/{conversation_id}"),
    ("delete", "/conversations/{conversation_id}"),
    ("get", "/conversations/{conversation_id}/items"),
    ("post", "/conversations/{conversation_id}/items"),
    ("get", "/conversations/{conversation_id}/items/{item_id}"),
    ("delete", "/conversations/{conversation_id}/items/{item_id}"),
    ("post", "/responses"),
    ("get", "/responses/{response_id}"),
    ("delete", "/responses/{response_id}"),
    ("post", "/responses/{response_id}/cancel"),
    ("get", "/responses/{response_id}/input_items"),
}


def test_the_committed_v1_document_is_what_the_app_serves() -> None:
    documents = mounted_documents(create_app(default_settings()))
    assert set(documents) == {"v1.json"}
    committed = (ROOT / "openapi" / "v1.json").read_text(encoding="utf-8")
    assert committed == openapi_json(documents["v1.json"]), "run 'carryover openapi'"


def test_every_v1_route_is_documented_with_openai_errors() -> None:
    document = json.loads((ROOT / "openapi" / "v1.json").read_text(encoding="utf-8"))
    assert document["servers"] == [{"url": "/v1"}]
    found = {(m, p) for p, ops in document["paths"].items() for m in ops}
    assert found == OPERATIONS
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            answers = operation["responses"]
            assert "422" not in answers, (method, path)
            for status in ("400", "401", "404", "500"):
                schema = answers[status]["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/Error"}, (method, path)


def test_the_native_document_has_no_v1_route() -> None:
    native = create_app(default_settings()).openapi()
    assert not [p for p in native["paths"] if p.startswith("/v1")]
