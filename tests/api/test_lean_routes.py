"""The run routes solve an ordinary request's parameters without FastAPI's dependency solving
(app/api/lean.py), and answer every request exactly as FastAPI's own handler does: the same
status, the same problem, word for word. The same requests are sent with the lean path on and
with it off (an app with dependency overrides always takes FastAPI's handler)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import fastapi.routing
import httpx
import pytest

from .conftest import AppClient

MINIMAL = {"Prefer": "return=minimal"}
PROMPT = {"prompts": ["hello"]}


def _unrelated() -> None:  # an override of nothing the routes use
    return None


@contextmanager
def fastapi_solves(app: Any) -> Iterator[None]:
    """FastAPI's handler for every request in the block (any override turns the lean path
    off; this one replaces a function no route depends on)."""
    app.dependency_overrides[_unrelated] = _unrelated
    try:
        yield
    finally:
        app.dependency_overrides.clear()


@pytest.fixture
def solved(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths of the requests FastAPI solved the dependencies of."""
    calls: list[str] = []
    original = fastapi.routing.solve_dependencies

    async def counted(*, request: Any, **kwargs: Any) -> Any:
        calls.append(request.url.path)
        return await original(request=request, **kwargs)

    monkeypatch.setattr(fastapi.routing, "solve_dependencies", counted)
    return calls


async def test_an_ordinary_run_is_solved_without_fastapis_dependency_solving(
    client: AppClient, solved: list[str]
) -> None:
    await client.post("/conversations", json={"id": "lean"})
    solved.clear()  # (the conversation's route is FastAPI's)
    run = await client.post("/conversations/lean/runs", json=PROMPT, headers=MINIMAL)
    assert run.status_code == 201, run.text
    run_id = run.json()["run_id"]
    assert (await client.get(f"/conversations/lean/runs/{run_id}")).status_code == 200
    response = await client.post("/v1/responses", json={"model": "default", "input": "hi"})
    assert response.status_code == 200, response.text
    assert solved == []

    # a request the lean path does not take is FastAPI's, and refused as before
    refused = await client.post(
        "/conversations/lean/runs", json=PROMPT, headers={"Idempotency-Key": "k" * 300}
    )
    assert refused.status_code == 422
    assert solved == ["/conversations/lean/runs"]


def _comparable(answer: Any) -> tuple[Any, ...]:
    """A refusal whole; of an answer that ran, what two runs on one conversation share."""
    kind = answer.headers.get("content-type", "")
    if answer.is_success:
        body = answer.json()
        return answer.status_code, kind, body.get("status"), body.get("object")
    return answer.status_code, kind, answer.content


#: (method, path, body bytes or JSON, headers): requests the lean path takes and requests it
#: leaves to FastAPI, good and bad
CASES: list[tuple[str, str, Any, dict[str, str]]] = [
    ("POST", "/conversations/same/runs", PROMPT, MINIMAL),
    ("POST", "/conversations/same/runs", PROMPT, {**MINIMAL, "If-Match": "*"}),
    ("POST", "/conversations/same/runs", PROMPT, {"If-Match": "not an etag"}),
    ("POST", "/conversations/same/runs", PROMPT, {"Idempotency-Key": "k" * 256}),
    ("POST", "/conversations/same/runs", PROMPT, {"Prefer": "return=minimal;;bad=\x01"}),
    ("POST", "/conversations/missing/runs", PROMPT, MINIMAL),
    ("POST", "/conversations/-bad-id/runs", PROMPT, MINIMAL),
    ("POST", f"/conversations/{'x' * 129}/runs", PROMPT, MINIMAL),
    ("POST", "/conversations/same/runs", {}, MINIMAL),
    ("POST", "/conversations/same/runs", {"prompts": "not a list"}, MINIMAL),
    ("POST", "/conversations/same/runs", {"prompts": ["a"], "unknown": 1}, MINIMAL),
    ("POST", "/conversations/same/runs", b"null", MINIMAL),
    ("POST", "/conversations/same/runs", b"", MINIMAL),
    ("POST", "/conversations/same/runs", b"{", MINIMAL),
    ("POST", "/conversations/same/runs", b"[" * 5000 + b"]" * 5000, MINIMAL),
    ("POST", "/conversations/same/runs", b'{"prompts":["a"]}', {"content-type": "text/plain"}),
    ("POST", "/conversations/same/runs", b'{"prompts":["a"]}', {"content-type": ""}),
    (
        "POST",
        "/conversations/same/runs",
        b'{"prompts":["a"]}',
        {**MINIMAL, "content-type": "Application/JSON; charset=utf-8"},
    ),
    (
        "POST",
        "/conversations/same/runs",
        b'{"prompts":["a"]}',
        {**MINIMAL, "content-type": "application/merge-patch+json"},
    ),
    ("GET", "/conversations/same/runs/run_unknown", None, {}),
    ("GET", "/conversations/same/runs/-bad", None, {}),
    ("POST", "/conversations/same/runs/run_unknown/cancel", None, {}),
    ("POST", "/conversations/same/compact", {}, {"If-Match": "*"}),
    ("POST", "/conversations/same/compact", {"keep_last": "many"}, {}),
    ("POST", "/v1/responses", {"model": "default", "input": "hi"}, {}),
    ("POST", "/v1/responses", {"model": "nope", "input": "hi"}, {}),
    ("POST", "/v1/responses", {"input": "hi"}, {}),
    ("POST", "/v1/responses", b"{", {"content-type": "application/json"}),
    ("POST", "/v1/responses/resp_unknown/cancel", None, {}),
    ("DELETE", "/v1/responses/resp_unknown", None, {}),
]


async def _send(
    client: AppClient, method: str, path: str, body: Any, headers: dict[str, str]
) -> httpx.Response:
    if body is None:
        return await client.request(method, path, headers=headers)
    if isinstance(body, bytes):
        return await client.request(
            method, path, content=body, headers={"content-type": "application/json", **headers}
        )
    return await client.request(method, path, json=body, headers=headers)


async def test_the_lean_path_answers_what_fastapi_answers(client: AppClient) -> None:
    await client.post("/conversations", json={"id": "same"})
    lean = [await _send(client, *case) for case in CASES]
    with fastapi_solves(client.app):
        standard = [await _send(client, *case) for case in CASES]
    for case, one, other in zip(CASES, lean, standard, strict=True):
        assert _comparable(one) == _comparable(other), case
    # the good ones ran, the bad ones were refused: both paths were exercised
    statuses = {answer.status_code for answer in lean}
    assert {200, 201, 400, 404, 422} <= statuses
