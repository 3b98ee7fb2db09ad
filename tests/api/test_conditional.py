"""Conditional requests through HTTP (contract §4, RFC 9110 §13): ``If-Match`` with ``*``, lists
and weak tags, 404 before 412, ETags that never repeat, ``If-None-Match`` on GET context, and
a 400 for a malformed header — on every route that takes them."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from ..helpers import assert_problem
from .conftest import AppClient

PROBLEM = "https://carryover.dev/problems/"
CONTEXT = {
    "system_prompt": "You are concise.",
    "summary": "",
    "messages": [{"type": "user", "content": [{"type": "text", "text": "replaced"}]}],
}


async def create(client: AppClient, conv_id: str | None = None) -> tuple[str, str]:
    body: dict[str, Any] = {"system_prompt": "You are concise."}
    if conv_id is not None:
        body["id"] = conv_id
    created = await client.post("/conversations", json=body)
    assert created.status_code == 201, created.text
    return created.json()["id"], created.headers["etag"]


async def etag_of(client: AppClient, conv: str) -> str:
    got = await client.get(f"/conversations/{conv}/context")
    assert got.status_code == 200
    return got.headers["etag"]


async def put_context(client: AppClient, conv: str, **headers: str) -> httpx.Response:
    return await client.put(
        f"/conversations/{conv}/context", json=CONTEXT, headers=_headers(headers)
    )


async def delete(client: AppClient, conv: str, **headers: str) -> httpx.Response:
    return await client.delete(f"/conversations/{conv}", headers=_headers(headers))


async def run(client: AppClient, conv: str, **headers: str) -> httpx.Response:
    return await client.post(
        f"/conversations/{conv}/runs", json={"prompts": ["hi"]}, headers=_headers(headers)
    )


async def compact(client: AppClient, conv: str, **headers: str) -> httpx.Response:
    return await client.post(f"/conversations/{conv}/compact", headers=_headers(headers))


def _headers(headers: dict[str, str]) -> dict[str, str]:
    return {name.replace("_", "-"): value for name, value in headers.items()}


WRITES = {"put_context": put_context, "delete": delete, "run": run, "compact": compact}
#: what each write answers when its precondition holds
SUCCESS = {"put_context": 200, "delete": 204, "run": 201, "compact": 201}


async def assert_untouched(client: AppClient, conv: str, etag: str) -> None:
    """Nothing ran and nothing was written: same ETag, no run record, empty transcript."""
    assert await etag_of(client, conv) == etag
    runs = (await client.get(f"/conversations/{conv}/runs")).json()
    assert runs["items"] == []
    meta = (await client.get(f"/conversations/{conv}")).json()
    assert (meta["run_count"], meta["transcript_count"], meta["active_run_id"]) == (0, 0, None)


# --- If-Match ----------------------------------------------------------------------------------


@pytest.mark.parametrize("write", list(WRITES))
async def test_if_match_star_matches_any_stored_state(client: AppClient, write: str) -> None:
    conv, _ = await create(client)
    await run(client, conv)  # the state is no longer the one created
    response = await WRITES[write](client, conv, If_Match="*")
    assert response.status_code == SUCCESS[write], response.text


@pytest.mark.parametrize("write", list(WRITES))
async def test_if_match_list_passes_when_any_one_tag_matches(client: AppClient, write: str) -> None:
    conv, first = await create(client)
    await run(client, conv)
    current = await etag_of(client, conv)
    listed = f'"nope-1", {first},{current} , "also-not-1"'
    response = await WRITES[write](client, conv, If_Match=listed)
    assert response.status_code == SUCCESS[write], response.text


@pytest.mark.parametrize("write", list(WRITES))
async def test_if_match_list_of_stale_tags_is_412(client: AppClient, write: str) -> None:
    conv, first = await create(client)
    await run(client, conv)
    current = await etag_of(client, conv)
    problem = assert_problem(
        await WRITES[write](client, conv, If_Match=f'"nope-1", {first}'),
        412,
        "precondition-failed",
    )
    assert problem["current_etag"] == current
    await assert_unchanged_after_412(client, conv, current, runs=1)


async def assert_unchanged_after_412(client: AppClient, conv: str, etag: str, runs: int) -> None:
    assert await etag_of(client, conv) == etag
    listed = (await client.get(f"/conversations/{conv}/runs")).json()["items"]
    assert len(listed) == runs


@pytest.mark.parametrize("write", list(WRITES))
async def test_a_weak_tag_never_matches_even_with_the_current_opaque_value(
    client: AppClient, write: str
) -> None:
    conv, etag = await create(client)
    weak = "W/" + etag
    assert_problem(await WRITES[write](client, conv, If_Match=weak), 412, "precondition-failed")
    assert_problem(
        await WRITES[write](client, conv, If_Match=f'"x-1", {weak}'), 412, "precondition-failed"
    )
    await assert_untouched(client, conv, etag)


@pytest.mark.parametrize("write", list(WRITES))
@pytest.mark.parametrize("if_match", ["*", '"stale-1"', 'W/"stale-1"'])
async def test_a_missing_conversation_is_404_before_any_412(
    client: AppClient, write: str, if_match: str
) -> None:
    response = await WRITES[write](client, "no-such-conversation", If_Match=if_match)
    body = assert_problem(response, 404, "not-found")
    assert "no-such-conversation" in body["detail"]


@pytest.mark.parametrize("write", list(WRITES))
async def test_a_deleted_conversation_is_404_for_its_old_etag(
    client: AppClient, write: str
) -> None:
    conv, etag = await create(client, "gone")
    assert (await delete(client, conv, If_Match=etag)).status_code == 204
    assert_problem(await WRITES[write](client, conv, If_Match=etag), 404, "not-found")


@pytest.mark.parametrize("write", list(WRITES))
@pytest.mark.parametrize(
    "malformed",
    ["abc", '"unterminated', '*, "a-1"', 'w/"a-1"', '"a-1" "b-1"', '"a-1";', ",", '"a\x7f"'],
)
async def test_a_malformed_if_match_is_400_bad_header(
    client: AppClient, write: str, malformed: str
) -> None:
    conv, etag = await create(client)
    body = assert_problem(await WRITES[write](client, conv, If_Match=malformed), 400, "bad-header")
    assert body["header"] == "If-Match"
    await assert_untouched(client, conv, etag)


# --- ETags ----------------------------------------------------------------------------------


async def test_etags_never_repeat_across_delete_and_recreate(client: AppClient) -> None:
    seen: list[str] = []
    for _ in range(3):
        conv, etag = await create(client, "same-id")
        seen.append(etag)
        seen.append((await run(client, conv)).headers["etag"])
        assert (await delete(client, conv, If_Match=seen[-1])).status_code == 204
    # recreated through PUT If-None-Match: * as well
    created = await put_context(client, "same-id", If_None_Match="*")
    assert created.status_code == 201
    seen.append(created.headers["etag"])
    assert len(set(seen)) == len(seen), seen
    # an ETag of an earlier incarnation never matches the new one
    for old in seen[:-1]:
        assert_problem(
            await put_context(client, "same-id", If_Match=old), 412, "precondition-failed"
        )


async def test_the_etag_changes_with_every_stored_change_and_only_then(client: AppClient) -> None:
    conv, created = await create(client)
    assert (await client.get(f"/conversations/{conv}")).headers["etag"] == created
    assert await etag_of(client, conv) == created  # reads change nothing
    ran = await run(client, conv)
    assert ran.headers["etag"] not in (created,)
    replaced = await put_context(client, conv, If_Match=ran.headers["etag"])
    assert replaced.headers["etag"] not in (created, ran.headers["etag"])
    # a failed run with on_failure discard stores nothing: the ETag stays
    discarded = await client.post(
        f"/conversations/{conv}/runs", json={"prompts": ["/fail"], "on_failure": "discard"}
    )
    assert discarded.headers["etag"] == replaced.headers["etag"]


# --- If-None-Match on GET context ------------------------------------------------------------


async def test_get_context_if_none_match_current_is_304_with_the_etag(client: AppClient) -> None:
    conv, etag = await create(client)
    for header in (etag, "*", f'"other-1", {etag}', "W/" + etag):  # weak comparison for GET
        got = await client.get(f"/conversations/{conv}/context", headers={"If-None-Match": header})
        assert got.status_code == 304, header
        assert got.headers["etag"] == etag
        assert got.content == b""


async def test_get_context_if_none_match_stale_is_200_with_the_context(client: AppClient) -> None:
    conv, old = await create(client)
    ran = await run(client, conv)
    got = await client.get(f"/conversations/{conv}/context", headers={"If-None-Match": old})
    assert got.status_code == 200
    assert got.headers["etag"] == ran.headers["etag"] != old
    assert got.json() == ran.json()["context"]


async def test_get_context_if_none_match_on_a_missing_conversation_is_404(
    client: AppClient,
) -> None:
    got = await client.get("/conversations/nope/context", headers={"If-None-Match": "*"})
    assert_problem(got, 404, "not-found")


async def test_get_context_malformed_if_none_match_is_400(client: AppClient) -> None:
    conv, _ = await create(client)
    got = await client.get(f"/conversations/{conv}/context", headers={"If-None-Match": "abc"})
    assert assert_problem(got, 400, "bad-header")["header"] == "If-None-Match"


# --- runs and DELETE -------------------------------------------------------------------------


async def test_post_runs_with_a_stale_if_match_is_412_and_nothing_ran(client: AppClient) -> None:
    conv, created = await create(client)
    put = await put_context(client, conv, If_Match=created)
    current = put.headers["etag"]
    meta_before = (await client.get(f"/conversations/{conv}")).json()
    context_before = (await client.get(f"/conversations/{conv}/context")).json()

    response = await client.post(
        f"/conversations/{conv}/runs", json={"prompts": ["hello"]}, headers={"If-Match": created}
    )
    problem = assert_problem(response, 412, "precondition-failed")
    assert problem["current_etag"] == current
    assert "etag" not in response.headers and "location" not in response.headers

    assert (await client.get(f"/conversations/{conv}/runs")).json()["items"] == []
    assert (await client.get(f"/conversations/{conv}/context")).json() == context_before
    meta_after = (await client.get(f"/conversations/{conv}")).json()
    assert meta_after == meta_before
    assert meta_after["run_count"] == 0 and meta_after["active_run_id"] is None

    # with the current ETag it runs, on the state it named
    ok = await client.post(
        f"/conversations/{conv}/runs", json={"prompts": ["hello"]}, headers={"If-Match": current}
    )
    assert ok.status_code == 201 and ok.json()["base_etag"] == current


async def test_delete_with_a_stale_if_match_is_412_then_the_current_one_deletes(
    client: AppClient,
) -> None:
    conv, created = await create(client)
    current = (await run(client, conv)).headers["etag"]
    problem = assert_problem(
        await delete(client, conv, If_Match=created), 412, "precondition-failed"
    )
    assert problem["current_etag"] == current
    assert (await client.get(f"/conversations/{conv}")).status_code == 200

    deleted = await delete(client, conv, If_Match=current)
    assert deleted.status_code == 204 and deleted.content == b""
    assert_problem(await client.get(f"/conversations/{conv}"), 404, "not-found")
    assert_problem(await delete(client, conv, If_Match=current), 404, "not-found")
    assert_problem(await delete(client, conv), 404, "not-found")
