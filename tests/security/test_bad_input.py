"""Never a 500 for bad input (contract §6): malformed JSON, wrong types, unknown block types,
invalid base64, overlong or ill-formed ids, bad cursors, bad header values and non-JSON
content types each give a problem whose detail says what and where — and write nothing."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from ..helpers import assert_problem
from .conftest import API_KEYS, AppClient, StartApp, http_client, snapshot

CONV = "c1"
RUNS = f"/conversations/{CONV}/runs"
CONTEXT = f"/conversations/{CONV}/context"


@dataclass
class Case:
    method: str
    path: str
    status: int
    slug: str
    detail: str  # a fragment the detail must contain
    json: Any = None
    content: bytes | None = None
    headers: dict[str, str | bytes] = field(default_factory=dict)
    error_path: str | None = None  # validation-error: the first error's path


def raw(content: bytes, content_type: str = "application/json") -> dict[str, Any]:
    return {"content": content, "headers": {"content-type": content_type}}


def cursor(value: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps({"after": value}).encode()).decode().rstrip("=")


def prompt(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"prompts": [{"type": "user", "content": list(blocks)}]}


CASES: dict[str, Case] = {
    # --- malformed JSON
    "truncated JSON": Case(
        "POST", RUNS, 400, "malformed-json", "not valid JSON", **raw(b'{"prompts": ["hi"')
    ),
    "JSON with a trailing comma": Case(
        "PUT",
        CONTEXT,
        400,
        "malformed-json",
        "at character",
        content=b'{"messages": [],}',
        headers={"content-type": "application/json", "If-Match": "*"},
    ),
    "not JSON at all": Case(
        "POST",
        "/conversations",
        400,
        "malformed-json",
        "Expecting value at character 0",
        **raw(b"hello"),
    ),
    "JSON that is not UTF-8": Case(
        "POST",
        "/conversations",
        400,
        "malformed-json",
        "not valid UTF-8: byte 0xff at offset 8",
        **raw(b'{"id": "\xff"}'),
    ),
    "an unpaired surrogate": Case(
        "POST",
        RUNS,
        400,
        "malformed-json",
        "unpaired UTF-16 surrogate \\ud800 at offset 14",
        **raw(b'{"prompts": ["\\ud800 alone"]}'),
    ),
    "a lone low surrogate": Case(
        "POST",
        "/conversations",
        400,
        "malformed-json",
        "unpaired UTF-16 surrogate \\udc00",
        **raw(b'{"system_prompt": "x\\udc00"}'),
    ),
    "nesting too deep": Case("POST", RUNS, 400, "malformed-json", "nests", **raw(b"[" * 50_000)),
    "compact with broken JSON": Case(
        "POST",
        f"/conversations/{CONV}/compact",
        400,
        "malformed-json",
        "not valid JSON",
        **raw(b"{"),
    ),
    # --- wrong types
    "prompts as a string": Case(
        "POST",
        RUNS,
        422,
        "validation-error",
        "body.prompts",
        json={"prompts": "hi"},
        error_path="body.prompts",
    ),
    "a number as a prompt": Case(
        "POST",
        RUNS,
        422,
        "validation-error",
        "body.prompts[0]",
        json={"prompts": [5]},
        error_path="body.prompts[0]",
    ),
    "a body that is a list": Case(
        "POST",
        "/conversations",
        422,
        "validation-error",
        "body: Input should be a valid dictionary",
        json=[1, 2],
    ),
    "an id that is a number": Case(
        "POST",
        "/conversations",
        422,
        "validation-error",
        "body.id",
        json={"id": 5},
        error_path="body.id",
    ),
    "an unknown option value": Case(
        "POST",
        RUNS,
        422,
        "validation-error",
        "body.on_failure",
        json={"prompts": ["hi"], "on_failure": "maybe"},
        error_path="body.on_failure",
    ),
    "an unknown field": Case(
        "POST", RUNS, 422, "validation-error", "body.prompt", json={"prompt": ["hi"]}
    ),
    "messages as an object": Case(
        "PUT",
        CONTEXT,
        422,
        "validation-error",
        "body.messages",
        json={"messages": {"0": "x"}},
        headers={"If-Match": "*"},
        error_path="body.messages",
    ),
    "a page size that is no number": Case(
        "GET", "/conversations?limit=ten", 422, "validation-error", "query.limit"
    ),
    "a page size of zero": Case("GET", f"{RUNS}?limit=0", 422, "validation-error", "query.limit"),
    # --- unknown block and message types
    "an unknown block type": Case(
        "POST",
        RUNS,
        422,
        "validation-error",
        "body.prompts[0].content[0].type",
        json=prompt({"type": "video"}),
        error_path="body.prompts[0].content[0].type",
    ),
    "a block without a type": Case(
        "POST", RUNS, 422, "validation-error", "body.prompts[0]", json=prompt({"text": "untagged"})
    ),
    "an unknown message type": Case(
        "PUT",
        CONTEXT,
        422,
        "validation-error",
        "body.messages[0].type",
        json={"messages": [{"type": "system", "content": []}]},
        headers={"If-Match": "*"},
        error_path="body.messages[0].type",
    ),
    "a thinking block from a user": Case(
        "PUT",
        CONTEXT,
        422,
        "validation-error",
        "body.messages[0].content[0].type",
        headers={"If-Match": "*"},
        json={"messages": [{"type": "user", "content": [{"type": "thinking", "thinking": "x"}]}]},
    ),
    # --- invalid base64
    "image data that is not base64": Case(
        "POST",
        RUNS,
        422,
        "validation-error",
        "not valid base64",
        json=prompt(
            {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/png", "data": "!!not base64!!"},
            }
        ),
        error_path="body.prompts[0].content[0].source.data",
    ),
    "base64 with bad padding": Case(
        "PUT",
        CONTEXT,
        422,
        "validation-error",
        "not valid base64",
        headers={"If-Match": "*"},
        json={
            "messages": [
                {
                    "type": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "abc"},
                        }
                    ],
                }
            ]
        },
        error_path="body.messages[0].content[0].source.data",
    ),
    # --- ids
    "an overlong id in the path": Case(
        "GET", "/conversations/" + "a" * 129, 422, "validation-error", "at most 128 characters"
    ),
    "an overlong id in a body": Case(
        "POST",
        "/conversations",
        422,
        "validation-error",
        "at most 128 characters",
        json={"id": "a" * 129},
        error_path="body.id",
    ),
    "an overlong id in a PUT": Case(
        "PUT",
        "/conversations/" + "b" * 200 + "/context",
        422,
        "validation-error",
        "path.conversation_id",
        json={},
        headers={"If-None-Match": "*"},
    ),
    "a space in an id": Case(
        "POST",
        "/conversations/bad%20id/runs",
        422,
        "validation-error",
        "path.conversation_id: String should match pattern",
        json={"prompts": ["hi"]},
    ),
    "a leading dash": Case(
        "DELETE", "/conversations/-c1", 422, "validation-error", "path.conversation_id"
    ),
    "a NUL in an id": Case(
        "GET", "/conversations/c%001/transcript", 422, "validation-error", "path.conversation_id"
    ),
    "a non-ASCII id": Case(
        "POST", "/conversations", 422, "validation-error", "body.id", json={"id": "caf\u00e9"}
    ),
    "an id with a slash in a body": Case(
        "POST", "/conversations", 422, "validation-error", "body.id", json={"id": "a/b"}
    ),
    "an overlong run id": Case(
        "GET", f"{RUNS}/" + "r" * 65, 422, "validation-error", "path.run_id"
    ),
    "a run id with odd characters": Case(
        "POST", f"{RUNS}/r%3Bdrop/cancel", 422, "validation-error", "path.run_id"
    ),
    # --- cursors
    "a cursor that is no base64": Case(
        "GET", "/conversations?cursor=%%%", 400, "bad-cursor", "not one this API issued"
    ),
    "a cursor of no JSON": Case(
        "GET", f"{RUNS}?cursor=aGVsbG8", 400, "bad-cursor", "not one this API issued"
    ),
    "a cursor of the wrong type": Case(
        "GET",
        f"/conversations/{CONV}/transcript?cursor=" + cursor("x"),
        400,
        "bad-cursor",
        "not one",
    ),
    "a cursor past BIGINT": Case(
        "GET",
        f"/conversations/{CONV}/transcript?cursor=" + cursor(10**30),
        400,
        "bad-cursor",
        "not one",
    ),
    "a negative cursor": Case(
        "GET",
        f"/conversations/{CONV}/transcript?cursor=" + cursor(-1),
        400,
        "bad-cursor",
        "not one",
    ),
    "a cursor holding a NUL": Case(
        "GET", "/conversations?cursor=" + cursor("a\u0000b"), 400, "bad-cursor", "not one"
    ),
    "a cursor of a boolean": Case(
        "GET", f"{RUNS}?cursor=" + cursor(True), 400, "bad-cursor", "not one"
    ),
    "an overlong cursor": Case(
        "GET", "/conversations?cursor=" + "A" * 600, 422, "validation-error", "query.cursor"
    ),
    # --- header values
    "If-Match garbage": Case(
        "PUT",
        CONTEXT,
        400,
        "bad-header",
        "If-Match: expected an entity-tag",
        json={},
        headers={"If-Match": "garbage"},
    ),
    "If-Match unterminated": Case(
        "DELETE",
        f"/conversations/{CONV}",
        400,
        "bad-header",
        "unterminated entity-tag",
        headers={"If-Match": '"abc'},
    ),
    "If-Match star in a list": Case(
        "POST",
        RUNS,
        400,
        "bad-header",
        "cannot be combined",
        json={"prompts": ["hi"]},
        headers={"If-Match": '*, "a"'},
    ),
    "If-None-Match garbage": Case(
        "GET", CONTEXT, 400, "bad-header", "If-None-Match", headers={"If-None-Match": "W/x"}
    ),
    "Idempotency-Key empty": Case(
        "POST",
        RUNS,
        400,
        "bad-header",
        "Idempotency-Key",
        json={"prompts": ["hi"]},
        headers={"Idempotency-Key": ""},
    ),
    "Idempotency-Key with control characters": Case(
        "POST",
        RUNS,
        400,
        "bad-header",
        "visible ASCII",
        json={"prompts": ["hi"]},
        headers={"Idempotency-Key": "a\tb"},
    ),
    "Idempotency-Key not ASCII": Case(
        "POST",
        RUNS,
        400,
        "bad-header",
        "visible ASCII",
        json={"prompts": ["hi"]},
        headers={"Idempotency-Key": "cl\u00e9".encode("latin-1")},
    ),
    "Idempotency-Key too long": Case(
        "POST",
        RUNS,
        422,
        "validation-error",
        "header.Idempotency-Key: String should have at most 255",
        json={"prompts": ["hi"]},
        headers={"Idempotency-Key": "k" * 256},
    ),
    "Prefer garbage": Case(
        "POST",
        RUNS,
        400,
        "bad-header",
        "Prefer: expected",
        json={"prompts": ["hi"]},
        headers={"Prefer": "garbage;;;==,"},
    ),
    "Prefer with a bad value": Case(
        "POST",
        f"/conversations/{CONV}/compact",
        400,
        "bad-header",
        "Prefer: expected",
        json={},
        headers={"Prefer": "return=mini mal"},
    ),
    # --- content types
    "text/plain": Case(
        "POST",
        RUNS,
        415,
        "unsupported-media-type",
        "not text/plain",
        **raw(b'{"prompts": ["hi"]}', "text/plain"),
    ),
    "a form": Case(
        "PUT",
        CONTEXT,
        415,
        "unsupported-media-type",
        "not application/x-www-form-urlencoded",
        content=b"messages=x",
        headers={"content-type": "application/x-www-form-urlencoded", "If-Match": "*"},
    ),
    "multipart": Case(
        "POST",
        "/conversations",
        415,
        "unsupported-media-type",
        "not multipart/form-data",
        **raw(b"--x--", "multipart/form-data; boundary=x"),
    ),
    "XML": Case(
        "POST",
        f"/conversations/{CONV}/compact",
        415,
        "unsupported-media-type",
        "not application/xml",
        **raw(b"<compact/>", "application/xml"),
    ),
    "a body without a content type": Case(
        "POST",
        RUNS,
        415,
        "unsupported-media-type",
        "no Content-Type",
        content=b'{"prompts": ["hi"]}',
    ),
    # --- methods and routes
    "an unknown method": Case(
        "PUT", f"/conversations/{CONV}", 405, "method-not-allowed", "PUT is not allowed"
    ),
    "an unknown route": Case(
        "GET", "/conversations/c1/nothing", 404, "not-found", "nothing at GET"
    ),
}


@pytest.fixture
async def prepared(start_app: StartApp, database_url: str) -> AsyncIterator[AppClient]:
    """Conversation c1 with a run and a transcript, as acme (keys configured)."""
    async with start_app(api_keys=API_KEYS) as app:
        client = http_client(app, API_KEYS.split(",")[0].split(":")[1])
        assert (await client.post("/conversations", json={"id": CONV})).status_code == 201
        assert (await client.post(RUNS, json={"prompts": ["first"]})).status_code == 201
        yield client


@pytest.mark.parametrize("name", list(CASES))
async def test_bad_input_is_a_precise_problem_and_writes_nothing(
    prepared: AppClient, database_url: str, name: str
) -> None:
    case = CASES[name]
    before = await snapshot(database_url)
    answer = await prepared.request(
        case.method, case.path, json=case.json, content=case.content, headers=case.headers
    )
    problem = assert_problem(answer, case.status, case.slug)
    assert case.detail in problem["detail"], problem
    if case.error_path is not None:
        assert problem["errors"][0]["path"] == case.error_path, problem
    if case.slug == "bad-header":
        assert problem["header"] in case.headers
    assert await snapshot(database_url) == before


async def test_the_cases_cover_every_kind_the_issue_names() -> None:
    names = " ".join(CASES).lower()
    for kind in (
        "json",
        "type",
        "block type",
        "base64",
        "overlong id",
        "cursor",
        "if-match",
        "idempotency-key",
        "prefer",
        "content type",
        "text/plain",
    ):
        assert kind in names, kind


async def test_well_formed_but_unknown_preferences_are_ignored(prepared: AppClient) -> None:
    """RFC 7240 §2: a preference the server does not know is ignored, not an error."""
    answer = await prepared.post(
        RUNS, json={"prompts": ["hi"]}, headers={"Prefer": 'wait=10, x="a,b"; y'}
    )
    assert answer.status_code == 201 and "context" in answer.json()
    minimal = await prepared.post(
        RUNS, json={"prompts": ["hi"]}, headers={"Prefer": 'handling=lenient, return="minimal"'}
    )
    assert minimal.status_code == 201 and "context" not in minimal.json()


async def test_a_cursor_the_api_issued_still_works(prepared: AppClient) -> None:
    for conv in ("c2", "c3"):
        await prepared.post("/conversations", json={"id": conv})
    # newest first (docs/conversations.md): c3, then c2, through the cursor the API issued
    first = (await prepared.get("/conversations", params={"limit": 1})).json()
    assert [c["id"] for c in first["items"]] == ["c3"]
    assert first["next_cursor"].startswith("at.")
    second = await prepared.get(
        "/conversations", params={"limit": 1, "cursor": first["next_cursor"]}
    )
    assert [c["id"] for c in second.json()["items"]] == ["c2"]
