"""Response headers as the OpenAPI document declares them, so generated clients can read them."""

from __future__ import annotations

from typing import Any

ETAG_HEADER: dict[str, Any] = {
    "description": "Strong ETag of the stored context (never repeats for a conversation id, "
    "even across delete and re-create)",
    "schema": {"type": "string"},
}
LOCATION_HEADER: dict[str, Any] = {
    "description": "URL of the created resource",
    "schema": {"type": "string"},
}
RETRY_AFTER_HEADER: dict[str, Any] = {
    "description": "Seconds to wait before trying again",
    "schema": {"type": "string"},
}


# --- request header grammars --------------------------------------------------------------
#
# Each is the exact set of values the server accepts, as one regular expression (valid in
# Python and in ECMA-262, which JSON Schema's ``pattern`` uses), so that the document says what
# the parsers (app/etag.py, app/api/deps.py, ``idempotency_key_of``) accept and a generated
# value is never refused. A value outside is still answered by the parser itself: 400
# ``bad-header`` naming the position, not a 422. tests/api/test_header_grammars.py checks each
# pattern against its parser.

_OWS = r"[ \t]*"
#: RFC 9110 §8.8.3: ``entity-tag = [ weak ] opaque-tag``, ``etagc = %x21 / %x23-7E / obs-text``
_ENTITY_TAG = r'(?:W/)?"[\x21\x23-\x7e\x80-\xff]*"'
#: RFC 9110 §13.1.1/§13.1.2: ``"*" / #entity-tag`` with at least one tag; empty list elements
#: (``"a", , "b"``) are allowed, as §5.6.1 says a recipient must accept them
ENTITY_TAGS_PATTERN = (
    rf"^(?:{_OWS}\*{_OWS}|[ \t,]*{_ENTITY_TAG}(?:{_OWS},[ \t,]*{_ENTITY_TAG})*[ \t,]*)$"
)

_TOKEN = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_QUOTED = r'"(?:[^"\\\x00-\x08\x0a-\x1f\x7f]|\\[\t\x20-\x7e\x80-\xff])*"'
_WORD = rf"(?:{_TOKEN}|{_QUOTED})"
_PREFERENCE = (
    rf"{_TOKEN}(?:{_OWS}={_OWS}{_WORD})?(?:{_OWS};(?:{_OWS}{_TOKEN}(?:{_OWS}={_OWS}{_WORD})?)?)*"
)
#: RFC 7240 §2: ``#preference``, ``preference = token [ "=" word ] *( ";" parameter )``
PREFER_PATTERN = rf"^[ \t,]*(?:{_PREFERENCE}{_OWS}(?:,[ \t,]*(?:{_PREFERENCE}{_OWS})?)*)?$"

_VISIBLE = r"[\x21-\x7e]"
_PRINTABLE = r"[\x20-\x7e]"
_STRIPPED = r"[\t-\r\x1c-\x20\x85\xa0]*"  # what Python's str.strip() removes from a latin-1 value
#: draft-ietf-httpapi-idempotency-key-header: an sf-string (``"…"``), or — as the server also
#: accepts — the bare key; a key is one or more printable ASCII characters
IDEMPOTENCY_KEY_PATTERN = (
    rf'^{_STRIPPED}(?:"{_PRINTABLE}+"'
    rf"|{_VISIBLE}"
    rf'|"{_PRINTABLE}*[\x21\x23-\x7e]'
    rf"|[\x21\x23-\x7e]{_PRINTABLE}*{_VISIBLE}){_STRIPPED}$"
)
