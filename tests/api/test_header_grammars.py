"""The grammar the document gives a header or a cursor (its ``pattern``) is exactly what the
server's parser accepts: every value the pattern matches is accepted, every other is a 400.

Clients and schemathesis generate values from these patterns, so a pattern wider than the
parser makes valid requests fail, and a narrower one hides what the server takes. Each pair is
checked on values drawn from the pattern itself and on strings over the characters the grammar
turns on (latin-1, since a header value is latin-1 on the wire).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from app.api.answers import idempotency_key_of
from app.api.app import openapi_document
from app.api.deps import decode_cursor, encode_cursor, parse_prefer
from app.api.problems import Problem
from app.api.routes.conversations import _list_cursor, _parse_list_cursor
from app.api.routes.events import _after
from app.errors import CarryoverError
from app.etag import parse_condition

DOCUMENT = openapi_document()


def declared_pattern(where: str, name: str) -> str:
    """The one pattern the document gives this parameter (the same in every operation)."""
    found = {
        parameter["schema"]["pattern"]
        for operations in DOCUMENT["paths"].values()
        for operation in operations.values()
        for parameter in operation.get("parameters", [])
        if parameter["in"] == where and parameter["name"] == name
    }
    assert len(found) == 1, (where, name, found)
    return found.pop()


def declared_cursor_pattern(path: str) -> str:
    [cursor] = [p for p in DOCUMENT["paths"][path]["get"]["parameters"] if p["name"] == "cursor"]
    pattern: str = cursor["schema"]["pattern"]
    return pattern


def ecma(pattern: str) -> re.Pattern[str]:
    """The pattern as JSON Schema reads it: ``$`` is the end (Python's also allows a final
    newline before it)."""
    assert pattern.startswith("^") and pattern.endswith("$"), pattern
    return re.compile(pattern[:-1] + r"\Z")


def accepts(parse: Callable[[str], Any], value: str) -> bool:
    try:
        parse(value)
    except Problem as problem:
        assert problem.problem_type.status == 400, problem
        return False
    except CarryoverError as refusal:  # the ETag parser lives below the api layer (app/etag.py)
        assert refusal.status == 400 and refusal.slug == "bad-header", refusal
        return False
    return True


def check(pattern: str, parse: Callable[[str], Any], value: str) -> None:
    matched = ecma(pattern).match(value) is not None
    assert matched == accepts(parse, value), (value, matched)


LATIN1 = st.characters(max_codepoint=0xFF)
#: the characters the header grammars turn on, drawn often
SPECIAL = st.sampled_from(list(' \t,;="\\*W/w!#~\x21\x7e\x7f\x80\xff\x00\x1f\n\r\x85\xa0\xb2ab0'))
NEAR = st.text(st.one_of(SPECIAL, LATIN1), max_size=30)


def drawn(pattern: str) -> st.SearchStrategy[str]:
    return st.one_of(st.from_regex(ecma(pattern), fullmatch=True), NEAR)


CASES = {
    "If-Match": lambda v: parse_condition(v, "If-Match"),
    "If-None-Match": lambda v: parse_condition(v, "If-None-Match"),
    "Prefer": parse_prefer,
    "Idempotency-Key": idempotency_key_of,
    "Last-Event-ID": lambda v: _after(v, None),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_header_pattern_is_what_its_parser_accepts(name: str) -> None:
    pattern = declared_pattern("header", name)
    parse = CASES[name]

    @settings(max_examples=200, deadline=None, database=None)
    @given(drawn(pattern))
    @example('"a", W/"b"')
    @example('"\x80\xe9\xff", W/"\x21"')  # obs-text is an etagc
    @example('"a\x7fb"')
    @example('w/"a"')
    @example(', , "a",,')
    @example(" * ")
    @example('*, "a"')
    @example('"a" "b"')
    @example('return=minimal; a="x\\"y", handling=lenient')
    @example("return = minimal ;")
    @example('"key-1"')
    @example('"')
    @example('""')
    @example(" \x85key\xa0 ")
    @example("")
    def run(value: str) -> None:
        check(pattern, parse, value)

    run()


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/conversations/{conversation_id}/runs", str),
        ("/conversations/{conversation_id}/transcript", int),
    ],
)
def test_a_cursor_pattern_is_what_the_server_accepts(path: str, kind: type) -> None:
    pattern = declared_cursor_pattern(path)

    @settings(max_examples=150, deadline=None, database=None)
    @given(st.one_of(drawn(pattern), st.from_regex(r"\A(id|seq)\.[\w.:-]{0,130}\Z")))
    @example(encode_cursor("conv-1"))
    @example(encode_cursor(0))
    @example(encode_cursor(10**18 - 1))
    @example(encode_cursor(10**18))
    @example(encode_cursor(True))
    @example("id.a\n")
    def run(value: str) -> None:
        check(pattern, lambda v: decode_cursor(v, kind), value)

    run()


def test_a_listing_cursor_pattern_is_what_the_server_accepts() -> None:
    """The listing's keyset cursor (``at.<micros>.<id>``, docs/conversations.md)."""
    pattern = declared_cursor_pattern("/conversations")

    @settings(max_examples=150, deadline=None, database=None)
    @given(st.one_of(drawn(pattern), st.from_regex(r"\A(at|id)\.[\w.:-]{0,130}\Z")))
    @example(_list_cursor(datetime(2026, 1, 1, tzinfo=UTC), "conv-1"))
    @example("at.999999999999999999.a")
    @example("at.1234567890123456789.a")
    @example("at..a")
    @example("at.1.a\n")
    def run(value: str) -> None:
        check(pattern, _parse_list_cursor, value)

    run()


def test_every_issued_cursor_is_in_its_grammar() -> None:
    latest = datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    assert ecma(declared_cursor_pattern("/conversations")).match(_list_cursor(latest, "c" * 128))
    assert _parse_list_cursor(_list_cursor(latest, "c.1")) == (latest, "c.1")
    runs = "/conversations/{conversation_id}/runs"
    assert ecma(declared_cursor_pattern(runs)).match(encode_cursor("c" * 128))
    assert ecma(declared_cursor_pattern("/conversations/{conversation_id}/transcript")).match(
        encode_cursor(2**59)
    )
    assert decode_cursor(encode_cursor("run_9"), str) == "run_9"
    assert decode_cursor(encode_cursor(42), int) == 42


def test_the_page_size_has_the_servers_maximum() -> None:
    for path in (
        "/conversations",
        "/conversations/{conversation_id}/runs",
        "/conversations/{conversation_id}/transcript",
    ):
        [limit] = [p for p in DOCUMENT["paths"][path]["get"]["parameters"] if p["name"] == "limit"]
        assert limit["schema"] == limit["schema"] | {
            "type": "integer",
            "minimum": 1,
            "maximum": 200,
        }
