"""RFC 9110 conditional requests: entity-tag lists, If-Match (strong), If-None-Match (weak)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.api.problems import BAD_HEADER
from app.errors import CarryoverError
from app.etag import (
    EntityTag,
    ETagCondition,
    evaluate_preconditions,
    if_match_passes,
    if_none_match_passes,
    make_etag,
    parse_condition,
)

CURRENT = '"v2"'
PRINTABLE = "!#$%&'()*+-./09:;<=>?@AZ[\\]^_`az{|}~"


def tags(*items: tuple[str, bool]) -> ETagCondition:
    return ETagCondition(any=False, tags=tuple(EntityTag(o, w) for o, w in items))


# --- parsing ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("*", ETagCondition(any=True)),
        ("  *\t", ETagCondition(any=True)),
        ('"v1"', tags(("v1", False))),
        ('W/"v1"', tags(("v1", True))),
        ('""', tags(("", False))),
        ('W/""', tags(("", True))),
        ('"a", "b"', tags(("a", False), ("b", False))),
        ('"a","b",W/"c"', tags(("a", False), ("b", False), ("c", True))),
        ('  "a" \t,\t W/"b"  ', tags(("a", False), ("b", True))),
        # etagc includes the comma: one tag, not two
        ('"a,b"', tags(("a,b", False))),
        ('"a,b", "c"', tags(("a,b", False), ("c", False))),
        # empty list elements are allowed and ignored
        ('"a", , "b"', tags(("a", False), ("b", False))),
        (', "a",', tags(("a", False))),
        # every etagc: %x21, %x23-7E, obs-text
        (f'"{PRINTABLE}"', tags((PRINTABLE, False))),
        ('"caf\xe9\x80\xff"', tags(("caf\xe9\x80\xff", False))),
        ('"*"', tags(("*", False))),
        ('"W/"', tags(("W/", False))),
        ('W/"W/"', tags(("W/", True))),
    ],
)
def test_parse(value: str, expected: ETagCondition) -> None:
    assert parse_condition(value) == expected


def test_absent_header_is_no_condition() -> None:
    assert parse_condition(None) is None
    assert parse_condition([]) is None


def test_several_field_lines_form_one_list() -> None:
    assert parse_condition(['"a"', 'W/"b", "c"']) == tags(("a", False), ("b", True), ("c", False))


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("", "got an empty value"),
        ("   ", "got an empty value"),
        (",", "the list holds no entity-tag"),
        (" , ,", "the list holds no entity-tag"),
        ("v1", "expected an entity-tag"),
        ("'v1'", "expected an entity-tag"),
        ('"v1', "unterminated entity-tag starting at position 0"),
        ('"a", "b', "unterminated entity-tag starting at position 5"),
        ('v1"', "expected an entity-tag"),
        ('"a" "b"', "expected ',' after the entity-tag ending at position 2"),
        ('"a"b', "expected ',' after the entity-tag"),
        ('"a";"b"', "expected ',' after the entity-tag"),
        ('*, "a"', '"*" cannot be combined with entity-tags'),
        ('"a", *', '"*" cannot be combined with entity-tags'),
        ("*,*", '"*" cannot be combined with entity-tags'),
        ('w/"a"', "a weak tag starts with 'W/'"),
        ("W/a", "expected an entity-tag"),
        ('W/ "a"', "expected an entity-tag"),
        ('W/"a', "unterminated entity-tag"),
        ('"a b"', "character ' ' is not allowed"),
        ('"a\tb"', "character '\\t' is not allowed"),
        ('"a\x7f"', "is not allowed in an entity-tag"),
        ('"a\x00"', "is not allowed in an entity-tag"),
        ('"\u2603"', "is not allowed in an entity-tag"),
    ],
)
@pytest.mark.parametrize("header", ["If-Match", "If-None-Match"])
def test_malformed_values_are_a_bad_header_problem(value: str, reason: str, header: str) -> None:
    with pytest.raises(CarryoverError) as info:
        parse_condition(value, header)
    problem = info.value
    assert problem.slug == BAD_HEADER.slug
    assert problem.status == 400
    assert problem.detail.startswith(f"{header}: ")
    assert reason in problem.detail
    assert problem.extras == {"header": header}


def test_a_long_malformed_value_is_shortened_in_the_detail() -> None:
    with pytest.raises(CarryoverError) as info:
        parse_condition('"a", ' + "x" * 5000)
    assert len(info.value.detail) < 400


# --- entity tags -----------------------------------------------------------------------------


def test_entity_tag_round_trip() -> None:
    assert str(EntityTag("v1")) == '"v1"'
    assert str(EntityTag("v1", weak=True)) == 'W/"v1"'
    assert EntityTag.parse('W/"v1"') == EntityTag("v1", weak=True)
    assert EntityTag.parse(' "v1" ') == EntityTag("v1")
    assert make_etag("c1-17") == '"c1-17"'


@pytest.mark.parametrize("opaque", ['a"b', "a b", "\n", "\u2603"])
def test_entity_tag_refuses_characters_outside_etagc(opaque: str) -> None:
    with pytest.raises(ValueError, match="cannot appear in an entity-tag"):
        make_etag(opaque)


@pytest.mark.parametrize("value", ["v1", "'v1'", "W/v1", '"v1', ""])
def test_entity_tag_parse_refuses_non_tags(value: str) -> None:
    with pytest.raises(ValueError, match="is not an entity-tag"):
        EntityTag.parse(value)


@pytest.mark.parametrize(
    ("a", "b", "strong", "weak"),
    [  # RFC 9110 §8.8.3.2, the comparison table
        ('W/"1"', 'W/"1"', False, True),
        ('W/"1"', 'W/"2"', False, False),
        ('W/"1"', '"1"', False, True),
        ('"1"', '"1"', True, True),
    ],
)
def test_comparison_table(a: str, b: str, strong: bool, weak: bool) -> None:
    left, right = EntityTag.parse(a), EntityTag.parse(b)
    assert left.strong_match(right) is strong and right.strong_match(left) is strong
    assert left.weak_match(right) is weak and right.weak_match(left) is weak


etagc = st.characters(min_codepoint=0x21, max_codepoint=0xFF).filter(
    lambda c: c != '"' and c != "\x7f" and not 0x7F <= ord(c) < 0x80
)


@given(st.lists(st.tuples(st.text(etagc, max_size=12), st.booleans()), min_size=1, max_size=6))
def test_any_list_of_tags_survives_format_then_parse(items: list[tuple[str, bool]]) -> None:
    value = " , ".join(str(EntityTag(opaque, weak)) for opaque, weak in items)
    assert parse_condition(value) == tags(*items)


# --- If-Match: strong comparison -------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "current", "passes"),
    [
        (None, CURRENT, True),
        (None, None, True),
        ("*", CURRENT, True),
        ("*", None, False),  # "*" needs a current representation
        ('"v2"', CURRENT, True),
        ('"v1"', CURRENT, False),
        ('"v1", "v2"', CURRENT, True),
        ('"v1", "v3"', CURRENT, False),
        ('W/"v2"', CURRENT, False),  # weak tags never match
        ('W/"v2", "v2"', CURRENT, True),
        ('"v2"', 'W/"v2"', False),  # a weak current tag never matches strongly
        ('"v2"', None, False),
        ('"V2"', CURRENT, False),  # opaque tags are case-sensitive
        (' \t"v2"\t ', CURRENT, True),
        ('"v2,v3"', '"v2"', False),  # one tag containing a comma
        ('"v2,v3"', '"v2,v3"', True),
    ],
)
def test_if_match(header: str | None, current: str | None, passes: bool) -> None:
    assert if_match_passes(header, current) is passes


def test_if_match_accepts_an_entity_tag_object() -> None:
    assert if_match_passes('"v2"', EntityTag("v2"))


def test_if_match_checks_syntax_even_when_the_resource_is_missing() -> None:
    with pytest.raises(CarryoverError):
        if_match_passes("v2", None)


def test_a_current_etag_that_is_not_a_tag_is_a_programming_error() -> None:
    with pytest.raises(ValueError):
        if_match_passes('"v2"', "v2")


# --- If-None-Match: weak comparison ----------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "current", "passes"),
    [
        (None, CURRENT, True),
        (None, None, True),
        ("*", None, True),  # create-only: passes when nothing exists
        ("*", CURRENT, False),
        ('"v2"', CURRENT, False),
        ('W/"v2"', CURRENT, False),  # weak comparison: W/ is ignored
        ('"v2"', 'W/"v2"', False),
        ('"v1"', CURRENT, True),
        ('"v1", W/"v2"', CURRENT, False),
        ('"v1", "v3"', CURRENT, True),
        ('"v2"', None, True),
    ],
)
def test_if_none_match(header: str | None, current: str | None, passes: bool) -> None:
    assert if_none_match_passes(header, current) is passes


# --- evaluation order (RFC 9110 §13.2.2) -----------------------------------------------------


@pytest.mark.parametrize(
    ("if_match", "if_none_match", "current", "safe", "outcome"),
    [
        (None, None, CURRENT, False, "proceed"),
        ('"v2"', None, CURRENT, False, "proceed"),
        ('"v1"', None, CURRENT, False, "precondition-failed"),
        ('"v1"', None, CURRENT, True, "precondition-failed"),
        (None, '"v2"', CURRENT, True, "not-modified"),
        (None, '"v2"', CURRENT, False, "precondition-failed"),
        (None, '"v1"', CURRENT, True, "proceed"),
        (None, "*", None, False, "proceed"),  # PUT create-only on a new conversation
        (None, "*", CURRENT, False, "precondition-failed"),  # ... on an existing one
        ("*", None, None, False, "precondition-failed"),
        ('"v1"', '"v2"', CURRENT, True, "precondition-failed"),  # If-Match is evaluated first
        ('"v2"', '"v2"', CURRENT, True, "not-modified"),
        ('"v2"', '"v1"', CURRENT, False, "proceed"),
    ],
)
def test_evaluate_preconditions(
    if_match: str | None, if_none_match: str | None, current: str | None, safe: bool, outcome: str
) -> None:
    assert (
        evaluate_preconditions(
            if_match=if_match, if_none_match=if_none_match, current=current, safe_method=safe
        )
        == outcome
    )


def test_a_malformed_header_is_400_even_when_the_other_fails() -> None:
    with pytest.raises(CarryoverError) as info:
        evaluate_preconditions(
            if_match='"v1"', if_none_match="garbage", current=CURRENT, safe_method=False
        )
    assert "If-None-Match" in info.value.detail
