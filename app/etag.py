"""Entity-tags and conditional requests (RFC 9110 §8.8.3, §13), in one place.

Everything about ETags lives here: making the store's ETags (:func:`version_etag`) and reading
them back (:func:`parse_version_etag`), parsing ``If-Match`` / ``If-None-Match``
(:func:`parse_condition`), comparing (:meth:`ETagCondition.matches_strong`, :func:`if_match_holds`)
and the same comparison as SQL for conditional writes (:func:`sql_if_match`). The API and the
store both use it; it imports nothing of ``app`` but :mod:`app.errors`.

The grammar, from RFC 9110::

    If-Match      = "*" / #entity-tag
    If-None-Match = "*" / #entity-tag
    entity-tag    = [ weak ] opaque-tag
    weak          = %s"W/"                 ; case-sensitive
    opaque-tag    = DQUOTE *etagc DQUOTE
    etagc         = %x21 / %x23-7E / obs-text

``etagc`` includes the comma, so ``"a,b"`` is one tag: a list is split by reading tags, never by
splitting on commas. Empty list elements (``"a", , "b"``) are allowed and ignored. A malformed
value is answered 400 ``bad-header`` rather than guessed at.

``If-Match`` uses the strong comparison (a weak tag never matches); ``If-None-Match`` the weak
one. Carryover's own ETags are always strong.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import ColumnElement, and_, false, or_, true

from app.errors import CarryoverError

_OWS = " \t"


def _is_etagc(char: str) -> bool:
    code = ord(char)
    return code == 0x21 or 0x23 <= code <= 0x7E or 0x80 <= code <= 0xFF


#: a run of etagc characters, exactly those :func:`_is_etagc` accepts: one C-level match for
#: the common case, an opaque value that is all etagc (the store's own ETags, every run)
_ALL_ETAGC = re.compile("[\x21\x23-\x7e\x80-\xff]*")


@dataclass(frozen=True)
class EntityTag:
    """One entity-tag: its opaque value (without quotes) and whether it is weak."""

    opaque: str
    weak: bool = False

    def __post_init__(self) -> None:
        if _ALL_ETAGC.fullmatch(self.opaque):
            return
        bad = next((c for c in self.opaque if not _is_etagc(c)), None)
        if bad is not None:
            raise ValueError(f"{bad!r} cannot appear in an entity-tag")

    def __str__(self) -> str:
        return f'{"W/" if self.weak else ""}"{self.opaque}"'

    @classmethod
    def parse(cls, value: str) -> EntityTag:
        """Parse one entity-tag such as ``"v1"`` or ``W/"v1"`` (``ValueError`` if malformed)."""
        text = value.strip(_OWS)
        weak = text.startswith("W/")
        body = text[2:] if weak else text
        if len(body) < 2 or body[0] != '"' or body[-1] != '"':
            raise ValueError(f"{value!r} is not an entity-tag (a quoted string, optionally W/)")
        return cls(body[1:-1], weak)

    def strong_match(self, other: EntityTag) -> bool:
        """RFC 9110 §8.8.3.2: both strong and identical."""
        return not self.weak and not other.weak and self.opaque == other.opaque

    def weak_match(self, other: EntityTag) -> bool:
        """Identical opaque values, weakness ignored."""
        return self.opaque == other.opaque


def make_etag(opaque: str) -> str:
    """The ``ETag`` header value for a strong tag with this opaque value."""
    return str(EntityTag(opaque))


@dataclass(frozen=True)
class ETagCondition:
    """A parsed ``If-Match`` / ``If-None-Match`` value: ``*`` or a list of tags."""

    any: bool
    tags: tuple[EntityTag, ...] = ()

    def matches_strong(self, current: EntityTag | None) -> bool:
        if current is None:
            return False
        return self.any or any(tag.strong_match(current) for tag in self.tags)

    def matches_weak(self, current: EntityTag | None) -> bool:
        if current is None:
            return False
        return self.any or any(tag.weak_match(current) for tag in self.tags)


HeaderValue = str | Sequence[str] | None


class MalformedHeader(CarryoverError):
    """A conditional header that breaks RFC 9110's grammar: 400 ``bad-header``."""

    slug = "bad-header"
    status = 400


def _bad(header: str, value: str, reason: str) -> MalformedHeader:
    shown = value if len(value) <= 200 else value[:200] + "..."
    return MalformedHeader(f"{header}: {reason} in {shown!r}", header=header)


def parse_condition(value: HeaderValue, header: str = "If-Match") -> ETagCondition | None:
    """Parse a conditional header; ``None`` when it is absent.

    Several field lines (a sequence) are one comma-separated list, as RFC 9110 §5.3 says.
    Raises :class:`MalformedHeader` (400 ``bad-header``) naming the header and the position.
    """
    if value is None:
        return None
    if not isinstance(value, str):
        if not value:
            return None
        value = ", ".join(value)
    text = value.strip(_OWS)
    if text == "*":
        return ETagCondition(any=True)
    if not text:
        raise _bad(header, text, 'expected "*" or a list of entity-tags, got an empty value')
    tags: list[EntityTag] = []
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in _OWS:
            i += 1
        if i < n and text[i] == ",":  # an empty list element
            i += 1
            continue
        if i >= n:
            break
        start = i
        weak = text.startswith("W/", i)
        if weak:
            i += 2
        if i >= n or text[i] != '"':
            if text[start] == "*":
                raise _bad(header, text, '"*" cannot be combined with entity-tags')
            if text.startswith("w/", start):
                raise _bad(header, text, f"a weak tag starts with 'W/' (position {start})")
            found = text[start : start + 10]
            raise _bad(
                header,
                text,
                f'expected an entity-tag ("..." or W/"...") at position {start}, got {found!r}',
            )
        close = text.find('"', i + 1)
        if close < 0:
            raise _bad(header, text, f"unterminated entity-tag starting at position {start}")
        opaque = text[i + 1 : close]
        bad = next((j for j, c in enumerate(opaque) if not _is_etagc(c)), None)
        if bad is not None:
            raise _bad(
                header,
                text,
                f"character {opaque[bad]!r} is not allowed in an entity-tag "
                f"(position {i + 1 + bad})",
            )
        tags.append(EntityTag(opaque, weak))
        i = close + 1
        while i < n and text[i] in _OWS:
            i += 1
        if i < n and text[i] != ",":
            raise _bad(
                header, text, f"expected ',' after the entity-tag ending at position {close}"
            )
    if not tags:
        raise _bad(header, text, "the list holds no entity-tag")
    return ETagCondition(any=False, tags=tuple(tags))


def _current(current: EntityTag | str | None) -> EntityTag | None:
    if current is None or isinstance(current, EntityTag):
        return current
    return EntityTag.parse(current)


def if_match_passes(header: HeaderValue, current: EntityTag | str | None) -> bool:
    """Whether an ``If-Match`` precondition holds (RFC 9110 §13.1.1).

    ``current`` is the resource's ETag as sent (``"abc"``), or ``None`` when it does not exist.
    Absent header: true. ``*``: true when the resource exists. A list: true when one tag
    matches strongly — weak tags never do.
    """
    condition = parse_condition(header, "If-Match")
    if condition is None:
        return True
    return condition.matches_strong(_current(current))


def if_none_match_passes(header: HeaderValue, current: EntityTag | str | None) -> bool:
    """Whether an ``If-None-Match`` precondition holds (RFC 9110 §13.1.2).

    Absent header: true. ``*``: true only when the resource does not exist (create-only).
    A list: true when no tag matches weakly. When it fails, a GET/HEAD answers 304 and any
    other method 412.
    """
    condition = parse_condition(header, "If-None-Match")
    if condition is None:
        return True
    return not condition.matches_weak(_current(current))


Outcome = Literal["proceed", "not-modified", "precondition-failed"]


def evaluate_preconditions(
    *,
    if_match: HeaderValue,
    if_none_match: HeaderValue,
    current: EntityTag | str | None,
    safe_method: bool,
) -> Outcome:
    """RFC 9110 §13.2.2, without the date validators: ``If-Match`` first, then
    ``If-None-Match``, whose failure is 304 for GET/HEAD (``safe_method``) and 412 otherwise.

    Both headers are parsed before either is evaluated, so a malformed one is always a 400.
    """
    match = parse_condition(if_match, "If-Match")
    none_match = parse_condition(if_none_match, "If-None-Match")
    return evaluate_conditions(match, none_match, current, safe_method=safe_method)


def evaluate_conditions(
    if_match: ETagCondition | None,
    if_none_match: ETagCondition | None,
    current: EntityTag | str | None,
    *,
    safe_method: bool,
) -> Outcome:
    """:func:`evaluate_preconditions` on conditions already parsed."""
    etag = _current(current)
    if if_match is not None and not if_match.matches_strong(etag):
        return "precondition-failed"
    if if_none_match is not None and if_none_match.matches_weak(etag):
        return "not-modified" if safe_method else "precondition-failed"
    return "proceed"


# --- the store's ETags ------------------------------------------------------------------------


def version_etag(incarnation: str, version: int) -> str:
    """The strong, opaque ETag of a stored context, ``"<incarnation>-<version>"`` (quotes
    included). The incarnation is random per creation, so an ETag never repeats across delete
    and re-create."""
    return make_etag(f"{incarnation}-{version}")


def parse_version_etag(etag: str) -> tuple[str, int] | None:
    """``(incarnation, version)`` of an ETag the store issued, or None for anything else (weak
    tags and malformed values included: they never match)."""
    if len(etag) < 2 or not (etag.startswith('"') and etag.endswith('"')):
        return None
    incarnation, sep, version = etag[1:-1].rpartition("-")
    if not sep or not incarnation or not version.isdigit() or str(int(version)) != version:
        return None
    return incarnation, int(version)


IfMatch = ETagCondition | str | Sequence[str]
"""An If-Match condition as the store takes it: a parsed :class:`ETagCondition`, ``"*"``, one
ETag, or a list of ETags (any of them may match)."""


def _versions(if_match: IfMatch) -> list[tuple[str, int]] | None:
    """The ``(incarnation, version)`` pairs an If-Match value accepts; None for ``*``."""
    if isinstance(if_match, ETagCondition):
        if if_match.any:
            return None
        tags = [str(tag) for tag in if_match.tags if not tag.weak]
    elif if_match == "*":
        return None
    else:
        tags = [if_match] if isinstance(if_match, str) else list(if_match)
    return [pair for tag in tags if (pair := parse_version_etag(tag)) is not None]


def if_match_holds(if_match: IfMatch, incarnation: str, version: int) -> bool:
    """RFC 9110 If-Match (strong comparison) against a stored state."""
    pairs = _versions(if_match)
    return pairs is None or (incarnation, version) in pairs


def sql_if_match(
    if_match: IfMatch, incarnation: ColumnElement[str], version: ColumnElement[int]
) -> ColumnElement[bool]:
    """:func:`if_match_holds` as a WHERE condition on the incarnation and version columns."""
    pairs = _versions(if_match)
    if pairs is None:
        return true()
    if not pairs:
        return false()
    return or_(*(and_(incarnation == i, version == v) for i, v in pairs))
