"""Every error is an RFC 9457 problem: the registry, the handlers, the OpenAPI document."""

from __future__ import annotations

import re
from typing import Annotated, Literal

import pytest
from fastapi import FastAPI, Header, HTTPException
from fastapi.testclient import TestClient
from pydantic import BaseModel, Field

from app.api import problems
from app.api.handlers import install_problem_handlers
from app.api.problems import (
    PROBLEM_TYPES,
    Problem,
    ProblemType,
    problem_response,
    problem_responses,
)

from ..helpers import assert_problem

SECRET = "do-not-leak-4711"


class Text(BaseModel):
    type: Literal["text"]
    text: str


class Image(BaseModel):
    type: Literal["image"]
    url: str


class User(BaseModel):
    type: Literal["user"]
    content: list[Annotated[Text | Image, Field(discriminator="type")]]


class RunRequest(BaseModel):
    prompts: list[User]
    on_failure: Literal["keep", "discard"] = "keep"


def make_app() -> FastAPI:
    app = FastAPI()
    install_problem_handlers(app)

    @app.post("/runs", responses=problem_responses(problems.RUN_IN_PROGRESS, 412))
    async def run(body: RunRequest, limit: int = 10) -> dict[str, int]:
        return {"prompts": len(body.prompts)}

    @app.get("/headers")
    async def headers(x_count: Annotated[int, Header()]) -> dict[str, int]:
        return {"count": x_count}

    @app.get("/busy")
    async def busy() -> None:
        raise problems.run_in_progress("run_42", retry_after=3)

    @app.get("/missing")
    async def missing() -> None:
        raise Problem(problems.NOT_FOUND, "conversation c1 does not exist")

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError(f"database password is {SECRET}")

    @app.get("/teapot")
    async def teapot() -> None:
        raise HTTPException(418)

    @app.get("/unchanged")
    async def unchanged() -> None:
        raise HTTPException(304, headers={"ETag": '"v1"'})

    return app


@pytest.fixture
def client() -> TestClient:
    return TestClient(make_app(), raise_server_exceptions=False)


# --- the registry ----------------------------------------------------------------------------

EXPECTED = {
    "not-found": 404,
    "conversation-exists": 409,
    "precondition-required": 428,
    "precondition-failed": 412,
    "invalid-context": 422,
    "unreplayable-context": 422,
    "validation-error": 422,
    "malformed-json": 400,
    "run-in-progress": 409,
    "idempotency-key-mismatch": 422,
    "idempotency-key-in-flight": 409,
    "unauthorized": 401,
    "payload-too-large": 413,
    "limit-exceeded": 422,
    "unsupported-media-type": 415,
    "not-acceptable": 406,
    "bad-header": 400,
    "bad-cursor": 400,
    "internal": 500,
}


@pytest.mark.parametrize(("slug", "status"), EXPECTED.items())
def test_registry_has_every_kind_the_service_needs(slug: str, status: int) -> None:
    problem_type = PROBLEM_TYPES[slug]
    assert problem_type.status == status
    assert problem_type.uri == f"https://carryover.dev/problems/{slug}"


def test_registry_slugs_are_stable_identifiers() -> None:
    for slug, problem_type in PROBLEM_TYPES.items():
        assert problem_type.slug == slug
        assert re.fullmatch(r"[a-z]+(-[a-z]+)*", slug)
        assert 400 <= problem_type.status <= 599


def test_extension_members_cannot_shadow_standard_ones() -> None:
    with pytest.raises(ValueError, match="status"):
        Problem(problems.NOT_FOUND, "x", status=200)


def test_problem_response_outside_a_handler() -> None:
    response = problem_response(problems.BAD_CURSOR, "cursor expired", instance="/x", page=2)
    assert response.status_code == 400
    assert response.media_type == "application/problem+json"
    assert response.body == (
        b'{"type":"https://carryover.dev/problems/bad-cursor","title":"Invalid pagination cursor",'
        b'"status":400,"detail":"cursor expired","instance":"/x","page":2}'
    )


def test_constructors_carry_their_extension_members() -> None:
    assert problems.invalid_context(3, "tool_result without its call").body()["message_index"] == 3
    limit = problems.limit_exceeded("max_prompts_per_run", 32, 40).body()
    assert (limit["limit"], limit["maximum"], limit["actual"]) == ("max_prompts_per_run", 32, 40)
    assert limit["detail"] == "max_prompts_per_run is 32 (got 40)"
    too_large = problems.payload_too_large(1024)
    assert too_large.status == 413 and too_large.body()["limit"] == "max_body_bytes"
    errors = problems.validation_error([{"path": "body.a", "message": "bad"}]).body()
    assert errors["errors"] == [{"path": "body.a", "message": "bad"}]
    assert errors["detail"] == "body.a: bad"


# --- handlers --------------------------------------------------------------------------------


def test_a_raised_problem_becomes_problem_json(client: TestClient) -> None:
    body = assert_problem(client.get("/missing"), 404, "not-found", instance=True)
    assert body["detail"] == "conversation c1 does not exist"


def test_run_in_progress_names_the_run_and_says_when_to_retry(client: TestClient) -> None:
    response = client.get("/busy")
    body = assert_problem(response, 409, "run-in-progress", instance=True)
    assert body["active_run_id"] == "run_42"
    assert response.headers["retry-after"] == "3"


def test_malformed_json_is_400(client: TestClient) -> None:
    response = client.post(
        "/runs", content=b'{"prompts": [', headers={"content-type": "application/json"}
    )
    body = assert_problem(response, 400, "malformed-json", instance=True)
    assert "not valid JSON" in str(body["detail"])


def test_validation_error_names_each_path(client: TestClient) -> None:
    response = client.post(
        "/runs?limit=many",
        json={
            "prompts": [
                {"type": "user", "content": [{"type": "text", "text": "hi"}, {"type": "video"}]},
                {"type": "user", "content": [{"type": "text"}]},
            ],
            "on_failure": "explode",
        },
    )
    body = assert_problem(response, 422, "validation-error", instance=True)
    paths = [error["path"] for error in body["errors"]]
    assert paths == [
        "query.limit",
        "body.prompts[0].content[1].type",
        "body.prompts[1].content[0].text",
        "body.on_failure",
    ]
    assert "'video'" in body["errors"][1]["message"]
    assert body["detail"] == "query.limit: " + body["errors"][0]["message"] + " (and 3 more)"


def test_a_missing_body_is_a_validation_error(client: TestClient) -> None:
    body = assert_problem(client.post("/runs"), 422, "validation-error", instance=True)
    assert body["errors"] == [{"path": "body", "message": "Field required"}]


def test_a_bad_header_value_is_a_validation_error_on_the_header(client: TestClient) -> None:
    body = assert_problem(
        client.get("/headers", headers={"x-count": "x"}), 422, "validation-error", instance=True
    )
    assert body["errors"][0]["path"] == "header.x-count"


def test_a_body_that_is_not_json_is_415(client: TestClient) -> None:
    response = client.post("/runs", content=b"hello", headers={"content-type": "text/plain"})
    body = assert_problem(response, 415, "unsupported-media-type", instance=True)
    assert "text/plain" in str(body["detail"])


def test_unknown_route_is_404(client: TestClient) -> None:
    body = assert_problem(client.get("/nowhere"), 404, "not-found", instance=True)
    assert body["detail"] == "nothing at GET /nowhere"


def test_wrong_method_is_405_with_allow(client: TestClient) -> None:
    response = client.delete("/runs")
    assert_problem(response, 405, "method-not-allowed", instance=True)
    assert response.headers["allow"] == "POST"


def test_an_unhandled_exception_is_a_500_problem_that_leaks_nothing(client: TestClient) -> None:
    response = client.get("/boom")
    assert_problem(response, 500, "internal", instance=True)
    assert SECRET not in response.text
    assert "RuntimeError" not in response.text


def test_an_http_status_without_a_kind_is_about_blank(client: TestClient) -> None:
    response = client.get("/teapot")
    assert response.status_code == 418
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["type"] == "about:blank"
    assert response.json()["title"] == "I'm a Teapot"


def test_a_304_stays_empty(client: TestClient) -> None:
    response = client.get("/unchanged")
    assert response.status_code == 304
    assert response.content == b""
    assert response.headers["etag"] == '"v1"'


# --- OpenAPI ---------------------------------------------------------------------------------


def test_openapi_documents_problems_not_fastapi_errors(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    schemas = document["components"]["schemas"]
    assert "ProblemDetails" in schemas
    assert "HTTPValidationError" not in schemas and "ValidationError" not in schemas
    responses = document["paths"]["/runs"]["post"]["responses"]
    ref = {"$ref": "#/components/schemas/ProblemDetails"}
    for status in ("409", "412", "422"):
        assert responses[status]["content"] == {"application/problem+json": {"schema": ref}}
    assert responses["409"]["description"] == "run-in-progress: Another run is in progress"
    assert "precondition-failed" in responses["412"]["description"]
    assert document == make_app().openapi()  # stable from one build to the next


def test_problem_responses_for_a_status_lists_its_kinds() -> None:
    responses = problem_responses(409)
    assert list(responses) == [409]
    description = responses[409]["description"]
    for slug in ("conversation-exists", "run-in-progress", "idempotency-key-in-flight"):
        assert slug in description


def test_problem_details_model_accepts_every_problem() -> None:
    for problem_type in PROBLEM_TYPES.values():
        body = Problem(problem_type, "x", extra_member=1).body("/i")
        model = problems.ProblemDetails.model_validate(body)
        assert model.type == problem_type.uri
    assert isinstance(problems.NOT_FOUND, ProblemType)
