"""GET and PUT ``/conversations/{id}/context`` (contract §1, §4): the Context with its ETag,
replace with ``If-Match``, create with ``If-None-Match: *``, 428 without either, 412 when
stale, 422 for a context that cannot be replayed or does not parse, and lossless storage."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import httpx

from app.agent.messages import Context

from ..helpers import assert_problem
from .conftest import AppClient

PROBLEM = "https://carryover.dev/problems/"


def text(role: str, value: str) -> dict[str, Any]:
    return {"type": role, "content": [{"type": "text", "text": value}]}


def assistant(*blocks: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"type": "assistant", "content": list(blocks), **fields}


def tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"type": "tool_call", "id": call_id, "name": name, "arguments": arguments}


def tool_result(call_id: str, name: str, value: str, is_error: bool = False) -> dict[str, Any]:
    return {
        "type": "tool_result",
        "tool_call_id": call_id,
        "tool_name": name,
        "content": [{"type": "text", "text": value}],
        "is_error": is_error,
    }


def context(
    *messages: dict[str, Any], system_prompt: str = "Be brief.", summary: str = ""
) -> dict[str, Any]:
    return {"system_prompt": system_prompt, "summary": summary, "messages": list(messages)}


PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(range(256))).decode()

#: every message and block type with every field set, edge values included
FULL = context(
    {
        "type": "user",
        "content": [
            {"type": "text", "text": "Look at these, ünïcödé ✓"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
            {
                "type": "image",
                "source": {"type": "url", "url": "https://example.com/a.png?x=1&y=2"},
            },
        ],
    },
    assistant(
        {"type": "thinking", "thinking": "", "signature": "sig-only"},
        {"type": "thinking", "thinking": "let me think", "signature": ""},
        {"type": "redacted_thinking", "data": "opaque=="},
        {"type": "text", "text": ""},
        tool_call("call_1", "lookup", '{"q": "nvim",  "n":1 }'),
        tool_call("call_2", "broken", '{"not json'),
        provider="anthropic",
        model="claude-x",
        response_id="msg_1",
        stop_reason="tool_use",
        usage={
            "input_tokens": 10,
            "output_tokens": 5,
            "cache_read_tokens": 3,
            "cache_write_tokens": 2,
        },
        provider_data={"reasoning": [{"id": "rs_1", "encrypted_content": "enc"}], "n": 1.5},
        error=None,
    ),
    tool_result("call_1", "lookup", "found"),
    {
        "type": "tool_result",
        "tool_call_id": "call_2",
        "tool_name": "broken",
        "is_error": True,
        "content": [
            {"type": "text", "text": "bad arguments"},
            {"type": "image", "source": {"type": "url", "url": "https://example.com/e"}},
        ],
    },
    assistant(
        {"type": "text", "text": "done"},
        provider="openai",
        model="gpt",
        response_id="resp_2",
        stop_reason="end_turn",
        usage={
            "input_tokens": 1,
            "output_tokens": 1,
            "cache_read_tokens": 0,
            "cache_write_tokens": 0,
        },
        provider_data={},
        error=None,
    ),
    system_prompt="",
    summary="Earlier: the user asked about editors.",
)


async def create(client: AppClient) -> tuple[str, str]:
    created = await client.post("/conversations", json={"system_prompt": "Be brief."})
    assert created.status_code == 201
    return created.json()["id"], created.headers["etag"]


async def put(
    client: AppClient, conv: str, body: Any, headers: dict[str, str] | None = None
) -> httpx.Response:
    return await client.put(f"/conversations/{conv}/context", json=body, headers=headers or {})


async def stored(client: AppClient, conv: str) -> tuple[dict[str, Any], str]:
    got = await client.get(f"/conversations/{conv}/context")
    assert got.status_code == 200
    return got.json(), got.headers["etag"]


# --- GET ----------------------------------------------------------------------------------


async def test_get_context_of_a_new_conversation(client: AppClient) -> None:
    conv, etag = await create(client)
    got = await client.get(f"/conversations/{conv}/context")
    assert got.status_code == 200
    assert got.headers["content-type"] == "application/json"
    assert got.headers["etag"] == etag
    assert got.json() == {"system_prompt": "Be brief.", "summary": "", "messages": []}


async def test_get_context_of_a_missing_conversation_is_404(client: AppClient) -> None:
    assert_problem(await client.get("/conversations/missing/context"), 404, "not-found")


# --- PUT: replace -------------------------------------------------------------------------


async def test_put_with_if_match_replaces_the_context(client: AppClient) -> None:
    conv, etag = await create(client)
    new = context(text("user", "hi"), assistant({"type": "text", "text": "hello"}))
    replaced = await put(client, conv, new, {"If-Match": etag})
    assert replaced.status_code == 200
    new_etag = replaced.headers["etag"]
    assert new_etag != etag
    assert replaced.json()["messages"][1]["content"] == [{"type": "text", "text": "hello"}]

    body, current = await stored(client, conv)
    assert current == new_etag
    assert body == replaced.json()
    meta = (await client.get(f"/conversations/{conv}")).json()
    assert (meta["etag"], meta["message_count"], meta["has_summary"]) == (new_etag, 2, False)

    # and again, from the new ETag, to a shorter context with a summary
    shorter = context(text("user", "next"), summary="we said hi")
    again = await put(client, conv, shorter, {"If-Match": new_etag})
    assert again.status_code == 200
    body, _ = await stored(client, conv)
    assert body == shorter
    meta = (await client.get(f"/conversations/{conv}")).json()
    assert (meta["message_count"], meta["has_summary"]) == (1, True)


async def test_put_stores_every_message_and_block_losslessly(client: AppClient) -> None:
    conv, etag = await create(client)
    replaced = await put(client, conv, FULL, {"If-Match": etag})
    assert replaced.status_code == 200, replaced.text
    body, _ = await stored(client, conv)
    assert body == FULL
    # empty strings stay empty strings, not missing fields
    thinking = body["messages"][1]["content"][0]
    assert thinking == {"type": "thinking", "thinking": "", "signature": "sig-only"}
    assert body["messages"][1]["content"][5]["arguments"] == '{"not json'
    assert body["system_prompt"] == ""


async def test_put_fills_defaults_and_the_stored_form_is_canonical(client: AppClient) -> None:
    conv, etag = await create(client)
    minimal = {
        "messages": [
            {"type": "user", "content": [{"type": "text", "text": "x"}]},
            {"type": "assistant", "content": [{"type": "text", "text": "y"}]},
        ]
    }
    replaced = await put(client, conv, minimal, {"If-Match": etag})
    assert replaced.status_code == 200
    body, _ = await stored(client, conv)
    assert body["system_prompt"] == "" and body["summary"] == ""
    answer = body["messages"][1]
    assert answer["stop_reason"] == "end_turn" and answer["provider_data"] == {}
    assert answer["error"] is None
    assert answer["usage"] == {
        "input_tokens": 0,
        "output_tokens": 0,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
    }


async def test_put_with_a_stale_if_match_is_412_and_keeps_the_stored_context(
    client: AppClient,
) -> None:
    conv, old = await create(client)
    first = await put(client, conv, context(text("user", "first")), {"If-Match": old})
    problem = assert_problem(
        await put(client, conv, context(text("user", "second")), {"If-Match": old}),
        412,
        "precondition-failed",
    )
    assert problem["current_etag"] == first.headers["etag"]
    body, etag = await stored(client, conv)
    assert body == context(text("user", "first")) and etag == first.headers["etag"]


async def test_put_with_if_match_on_a_missing_conversation_is_404(client: AppClient) -> None:
    assert_problem(await put(client, "absent", context(), {"If-Match": '"x-1"'}), 404, "not-found")
    assert_problem(await put(client, "absent", context(), {"If-Match": "*"}), 404, "not-found")
    assert_problem(await client.get("/conversations/absent"), 404, "not-found")


# --- PUT: create --------------------------------------------------------------------------


async def test_put_with_if_none_match_star_creates_the_conversation(client: AppClient) -> None:
    body = context(text("user", "imported"), assistant({"type": "text", "text": "ok"}))
    created = await put(client, "imported-1", body, {"If-None-Match": "*"})
    assert created.status_code == 201, created.text
    assert created.headers["location"] == "/conversations/imported-1"
    etag = created.headers["etag"]
    assert created.json() == (await stored(client, "imported-1"))[0]

    meta = await client.get("/conversations/imported-1")
    assert meta.status_code == 200
    assert meta.json()["etag"] == etag == meta.headers["etag"]
    assert meta.json()["message_count"] == 2
    assert meta.json()["system_prompt"] == "Be brief."

    # it goes on like any conversation
    ran = await client.post(
        "/conversations/imported-1/runs", json={"prompts": ["more"]}, headers={"If-Match": etag}
    )
    assert ran.status_code == 201
    assert ran.json()["final"]["content"][0]["text"] == 'Echo: I saw 3 messages. You said: "more"'


async def test_put_if_none_match_star_on_an_existing_conversation_is_412(
    client: AppClient,
) -> None:
    conv, etag = await create(client)
    problem = assert_problem(
        await put(client, conv, context(text("user", "x")), {"If-None-Match": "*"}),
        412,
        "precondition-failed",
    )
    assert problem["current_etag"] == etag
    body, current = await stored(client, conv)
    assert body["messages"] == [] and current == etag


async def test_put_without_a_precondition_is_428(client: AppClient) -> None:
    conv, etag = await create(client)
    body = assert_problem(
        await put(client, conv, context(text("user", "x"))), 428, "precondition-required"
    )
    assert "If-Match" in body["detail"]
    # If-None-Match with a tag (not "*") is no precondition for a PUT either
    assert_problem(
        await put(client, conv, context(), {"If-None-Match": etag}), 428, "precondition-required"
    )
    # on a missing conversation too: nothing is created
    assert_problem(await put(client, "new-one", context()), 428, "precondition-required")
    assert_problem(await client.get("/conversations/new-one"), 404, "not-found")
    assert (await stored(client, conv))[1] == etag


async def test_put_with_both_if_match_and_if_none_match_star_never_holds(
    client: AppClient,
) -> None:
    """RFC 9110 §13.2.2: If-Match is evaluated, then If-None-Match; ``*`` fails on a
    conversation that exists, so the pair can never both hold: 412, or 404 when missing."""
    conv, etag = await create(client)
    headers = {"If-Match": etag, "If-None-Match": "*"}
    assert_problem(
        await put(client, conv, context(text("user", "x")), headers), 412, "precondition-failed"
    )
    assert (await stored(client, conv))[1] == etag
    assert_problem(await put(client, "absent", context(), headers), 404, "not-found")


# --- PUT: validation ----------------------------------------------------------------------


async def test_an_unreplayable_context_is_422_naming_the_message_index(client: AppClient) -> None:
    conv, etag = await create(client)
    cases = [
        # a tool_result without its call
        (1, context(text("user", "a"), tool_result("nope", "t", "x"))),
        # a call left unanswered before the next user message
        (
            4,
            context(
                text("user", "a"),
                assistant(tool_call("c1", "t", "{}")),
                tool_result("c1", "t", "ok"),
                assistant(tool_call("c2", "t", "{}")),
                text("user", "c"),
            ),
        ),
        # a failed attempt is no part of a context
        (
            2,
            context(
                text("user", "a"),
                assistant({"type": "text", "text": "ok"}),
                assistant(stop_reason="error", error={"kind": "fatal", "message": "boom"}),
            ),
        ),
        # a result naming another tool than its call
        (
            3,
            context(
                text("user", "a"),
                assistant(tool_call("c9", "right", "{}")),
                tool_result("c9", "right", "x"),
                tool_result("c9", "wrong", "x"),
            ),
        ),
    ]
    for index, body in cases:
        problem = assert_problem(
            await put(client, conv, body, {"If-Match": etag}), 422, "unreplayable-context"
        )
        assert problem["message_index"] == index, problem
        assert f"messages[{index}]" in problem["detail"]
    # with If-None-Match: * nothing is created either
    assert_problem(
        await put(client, "never", cases[0][1], {"If-None-Match": "*"}), 422, "unreplayable-context"
    )
    assert_problem(await client.get("/conversations/never"), 404, "not-found")
    assert (await stored(client, conv)) == (
        {"system_prompt": "Be brief.", "summary": "", "messages": []},
        etag,
    )


async def test_an_unknown_type_is_422_with_the_path_of_the_offending_value(
    client: AppClient,
) -> None:
    conv, etag = await create(client)
    cases = [
        (
            context({"type": "user", "content": [{"type": "video", "text": "x"}]}),
            "body.messages[0].content[0].type",
            "video",
        ),
        (
            context(text("user", "a"), {"type": "bot", "content": []}),
            "body.messages[1].type",
            "bot",
        ),
        (
            context(
                text("user", "a"),
                assistant(
                    {"type": "image", "source": {"type": "url", "url": "https://example.com"}}
                ),
            ),
            "body.messages[1].content[0].type",
            "image",
        ),
        (
            context(
                {
                    "type": "user",
                    "content": [
                        {"type": "image", "source": {"type": "file", "path": "/etc/passwd"}}
                    ],
                }
            ),
            "body.messages[0].content[0].source.type",
            "file",
        ),
    ]
    for body, path, tag in cases:
        problem = assert_problem(
            await put(client, conv, body, {"If-Match": etag}), 422, "validation-error"
        )
        assert problem["errors"][0]["path"] == path, problem
        assert tag in problem["errors"][0]["message"]
    assert (await stored(client, conv))[1] == etag


async def test_unknown_fields_and_bad_values_are_refused_not_dropped(client: AppClient) -> None:
    conv, etag = await create(client)
    extra_field = copy.deepcopy(FULL)
    extra_field["messages"][0]["content"][0]["bold"] = True
    problem = assert_problem(
        await put(client, conv, extra_field, {"If-Match": etag}), 422, "validation-error"
    )
    assert problem["errors"][0]["path"] == "body.messages[0].content[0].bold"

    # a field named like its block's tag: the path names the field, not the tag
    for block, field in (
        ({"type": "text", "text": 5}, "text"),
        ({"type": "thinking", "thinking": None}, "thinking"),
    ):
        role = "user" if block["type"] == "text" else "assistant"
        body = context(text("user", "a"), {"type": role, "content": [block]})
        problem = assert_problem(
            await put(client, conv, body, {"If-Match": etag}), 422, "validation-error"
        )
        assert problem["errors"][0]["path"] == f"body.messages[1].content[0].{field}", problem

    bad_image = context(
        {
            "type": "user",
            "content": [
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": "not base64!"},
                }
            ],
        }
    )
    problem = assert_problem(
        await put(client, conv, bad_image, {"If-Match": etag}), 422, "validation-error"
    )
    assert problem["errors"][0]["path"] == "body.messages[0].content[0].source.data"

    no_messages_list = {"system_prompt": "x", "messages": "hello"}
    assert_problem(
        await put(client, conv, no_messages_list, {"If-Match": etag}), 422, "validation-error"
    )
    assert (await stored(client, conv))[1] == etag


async def test_put_records_a_context_replacement_in_the_transcript(client: AppClient) -> None:
    conv, _ = await create(client)
    ran = await client.post(f"/conversations/{conv}/runs", json={"prompts": ["hi"]})
    body = context(text("user", "rewritten"))
    replaced = await put(client, conv, body, {"If-Match": ran.headers["etag"]})
    entries = (await client.get(f"/conversations/{conv}/transcript")).json()["items"]
    last = entries[-1]
    assert last["kind"] == "context_replaced" and last["run_id"] is None
    assert last["body"] == {"etag": replaced.headers["etag"], "context": body}
    assert [e["seq"] for e in entries] == list(range(1, len(entries) + 1))


async def test_put_answers_the_bytes_get_answers_and_a_json_response_of_the_context_would(
    client: AppClient,
) -> None:
    """The PUT answer is built from the texts the write dumped (no second dump of the context):
    byte for byte what GET context sends and what a JSONResponse of the validated context sent
    before — edge values, non-ASCII and escapes included, and a context long enough to be dumped
    in a worker thread and written in several INSERTs."""
    odd = text("user", 'quote " backslash \\ newline \n tab \t nul-free \u2028 emoji 🦀 ünï')
    long = [text("user" if i % 2 == 0 else "assistant", f"m{i}") for i in range(2_101)]
    for body in (FULL, context(odd, *long, summary="s ✓")):
        conv, etag = await create(client)
        answer = await put(client, conv, body, {"If-Match": etag})
        assert answer.status_code == 200
        got = await client.get(f"/conversations/{conv}/context")
        assert answer.content == got.content
        expected = Context.model_validate(body).model_dump(mode="json")
        assert answer.content == json.dumps(
            expected, ensure_ascii=False, separators=(",", ":")
        ).encode("utf-8")
        created = await put(client, f"{conv}-new", body, {"If-None-Match": "*"})
        assert created.status_code == 201 and created.content == answer.content
