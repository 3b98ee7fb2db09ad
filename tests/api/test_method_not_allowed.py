"""A method a resource does not have is a 405 whose ``Allow`` lists every method it has
(RFC 9110 §15.5.6), for every path of the OpenAPI document — not only the first route whose
path matched, which is what Starlette names."""

from __future__ import annotations

import re
from typing import Any

import pytest

from app.api.app import openapi_document

from .conftest import AppClient

DOCUMENT = openapi_document()
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
#: a value for each path parameter (routing does not need the resource to exist)
VALUES = {"conversation_id": "c-405", "run_id": "run-405"}


def concrete(path: str) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: VALUES[m.group(1)], path)


def documented(path: str) -> set[str]:
    return {method.upper() for method in DOCUMENT["paths"][path]}


def routed(path: str) -> set[str]:
    """The methods some documented path answers at ``concrete(path)``: a fixed path can also
    match a template (``GET /conversations/import`` is the conversation ``import``)."""
    found = set()
    for other in DOCUMENT["paths"]:
        template = re.sub(r"\\\{\w+\\\}", "[^/]+", re.escape(other))
        if re.fullmatch(template, concrete(path)):
            found |= documented(other)
    return found


@pytest.mark.parametrize("path", list(DOCUMENT["paths"]))
async def test_a_405_allows_every_documented_method(client: AppClient, path: str) -> None:
    refused = [method for method in METHODS if method not in routed(path)]
    assert refused, path
    for method in refused:
        response = await client.request(method, concrete(path))
        assert response.status_code == 405, (method, path, response.text)
        body: dict[str, Any] = response.json()
        assert body["type"].endswith("/method-not-allowed")
        assert body["detail"] == f"{method} is not allowed on {concrete(path)}"
        allowed = [m.strip() for m in response.headers["allow"].split(",")]
        assert len(allowed) == len(set(allowed)), allowed
        assert set(allowed) == documented(path), (method, path, allowed)
