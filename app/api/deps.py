"""Request dependencies: the app's services, the caller's tenant, and header parsing."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Header, Path, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.requests import HTTPConnection

from app.config import Settings
from app.etag import ETagCondition, parse_condition
from app.service.agents import AgentPool
from app.service.conversations import ConversationService
from app.service.runs import RunManager
from app.store.stores import Stores

from .auth import DEFAULT_TENANT as DEFAULT_TENANT  # re-exported
from .auth import TENANT_SCOPE_KEY, Authenticator
from .headers import ENTITY_TAGS_PATTERN, IDEMPOTENCY_KEY_PATTERN, PREFER_PATTERN
from .problems import BAD_CURSOR, BAD_HEADER, Problem, limit_exceeded
from .schemas import CONVERSATION_ID_PATTERN


@dataclass
class Services:
    """What the app holds for its lifetime (``app.state.services``)."""

    settings: Settings
    engine: AsyncEngine  # for the readiness check
    agents: AgentPool
    stores: Stores  # each aggregate's store (app/store/stores.py)
    conversations: ConversationService
    runs: RunManager
    auth: Authenticator


def services_of(request: Request) -> Services:
    found: Services = request.app.state.services
    return found


async def services(request: Request) -> Services:
    """The app's services (a coroutine: FastAPI runs a plain function dependency in its
    thread pool, a thread hop on every request)."""
    return services_of(request)


ServicesDep = Annotated[Services, Depends(services)]

_bearer = HTTPBearer(
    auto_error=False,
    description="An API key bound to a tenant (`carryover keys create --tenant NAME`, or "
    "`CARRYOVER_API_KEYS`). Required once keys are configured.",
)


def authenticated_tenant(request: HTTPConnection) -> str | None:
    """The tenant :class:`~app.api.auth.AuthMiddleware` authenticated the request as, if it
    did (None on a public path)."""
    found = request.scope.get(TENANT_SCOPE_KEY)
    return found if isinstance(found, str) else None


async def tenant(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str:
    """The caller's tenant, as :class:`~app.api.auth.AuthMiddleware` authenticated it (the
    bearer scheme is declared here so that the OpenAPI document says so). Without configured
    keys everything is the ``default`` tenant."""
    found = authenticated_tenant(request)
    if found is not None:
        return found
    # Not behind the middleware (a route on a public path): authenticate here.
    return await services_of(request).auth.authenticate(
        request.headers.get("authorization"), request.client.host if request.client else None
    )


TenantDep = Annotated[str, Depends(tenant)]

ConversationPath = Annotated[
    str,
    Path(
        pattern=CONVERSATION_ID_PATTERN,
        max_length=128,
        description="Conversation id: 1-128 of A-Z a-z 0-9 . _ : -, starting alphanumeric",
    ),
]
RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$"
RunIdPath = Annotated[
    str, Path(pattern=RUN_ID_PATTERN, max_length=64, description="Run id (as the API issued it)")
]

IfMatchHeader = Annotated[
    str | None,
    Header(
        alias="If-Match",
        description="Proceed only if the stored context has one of these "
        "strong ETags (RFC 9110); `*` matches any",
        json_schema_extra={"pattern": ENTITY_TAGS_PATTERN},
    ),
]
"""Its grammar is the document's ``pattern``, checked by :mod:`app.etag` (400
``bad-header`` naming the position), not by FastAPI (which would answer 422)."""
IfNoneMatchHeader = Annotated[
    str | None,
    Header(
        alias="If-None-Match",
        description="GET: answer 304 if the ETag still matches. PUT: `*` creates only if absent",
        json_schema_extra={"pattern": ENTITY_TAGS_PATTERN},
    ),
]


def if_match_value(header: str | None) -> ETagCondition | None:
    """An If-Match header as the services take it (400 ``bad-header`` when malformed)."""
    return parse_condition(header, "If-Match")


def if_none_match_value(header: str | None) -> ETagCondition | None:
    """An If-None-Match header as the services take it (400 ``bad-header`` when malformed)."""
    return parse_condition(header, "If-None-Match")


# --- Prefer (RFC 7240), Idempotency-Key, Accept -------------------------------------------

PreferHeader = Annotated[
    str | None,
    Header(
        alias="Prefer",
        description="RFC 7240: `return=minimal` leaves `context` out of the answer; on "
        "`POST …/runs`, `respond-async` answers 202 at once with the run record (background "
        "mode, docs/runs.md)",
        json_schema_extra={"pattern": PREFER_PATTERN},
    ),
]
"""Checked by :func:`parse_prefer` (400 ``bad-header``), in the grammar of the document."""
IdempotencyKeyHeader = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        max_length=255,
        description="Repeat a request safely: the same key and body replay the first answer. "
        'An sf-string (`"…"`) or the bare key: printable ASCII',
        json_schema_extra={"pattern": IDEMPOTENCY_KEY_PATTERN},
    ),
]
AcceptHeader = Annotated[
    str | None,
    Header(alias="Accept", description="`text/event-stream` streams the run as server-sent events"),
]

_TOKEN = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_QUOTED = r'"(?:[^"\\\x00-\x08\x0a-\x1f\x7f]|\\[\t\x20-\x7e\x80-\xff])*"'
_VALUE = rf"[ \t]*=[ \t]*({_TOKEN}|{_QUOTED})"
_PARAMETER = rf"{_TOKEN}(?:[ \t]*=[ \t]*(?:{_TOKEN}|{_QUOTED}))?"
_PREFERENCE = re.compile(rf"({_TOKEN})(?:{_VALUE})?(?:[ \t]*;(?:[ \t]*{_PARAMETER})?)*")


def parse_prefer(header: str | None) -> dict[str, str]:
    """The preferences of a ``Prefer`` header: name (lower case) → value (``""`` without one).

    Preferences the service does not know are returned too, for the caller to ignore, as
    RFC 7240 §2 requires; a value that does not follow the header's grammar
    (``#preference``, ``preference = token [ "=" word ] *( ";" parameter )``) is 400
    ``bad-header`` naming the position. The first occurrence of a preference wins.
    """
    if header is None:
        return {}
    found: dict[str, str] = {}
    i, n = 0, len(header)
    while i < n:
        if header[i] in " \t,":  # whitespace and empty list elements
            i += 1
            continue
        match = _PREFERENCE.match(header, i)
        if match is None:
            shown = header[i : i + 20]
            raise Problem(
                BAD_HEADER,
                f"Prefer: expected a preference (token[=value][; ...]) "
                f"at position {i}, got {shown!r}",
                header="Prefer",
            )
        value = match.group(2) or ""
        if value.startswith('"'):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        found.setdefault(match.group(1).lower(), value)
        i = match.end()
        while i < n and header[i] in " \t":
            i += 1
        if i < n and header[i] != ",":
            raise Problem(
                BAD_HEADER,
                f"Prefer: expected ',' or the end at position {i}, got {header[i : i + 20]!r}",
                header="Prefer",
            )
    return found


def prefers_minimal(header: str | None) -> bool:
    """``Prefer: return=minimal`` (values compared without case)."""
    return parse_prefer(header).get("return", "").lower() == "minimal"


# --- cursors -----------------------------------------------------------------------------
#
# A cursor names the last position of the page before: ``id.<id>`` for pages ordered by id
# (conversations, runs), ``seq.<n>`` for pages ordered by sequence number (the transcript).
# Clients pass ``next_cursor`` back unchanged; the format is a grammar a regular expression
# states exactly (the document's ``pattern``), so that any cursor the document allows is one the
# server accepts — a position after which there is nothing is an empty page, not an error.

#: positions are ids, which the database must be able to compare
ID_CURSOR_PATTERN = r"^id\.([A-Za-z0-9][A-Za-z0-9._:-]{0,127})$"
#: or sequence numbers, which fit a BIGINT (18 digits stay below 2**63)
SEQ_CURSOR_PATTERN = r"^seq\.([0-9]{1,18})$"
_ID_CURSOR = re.compile(ID_CURSOR_PATTERN.removesuffix("$") + r"\Z")
_SEQ_CURSOR = re.compile(SEQ_CURSOR_PATTERN.removesuffix("$") + r"\Z")


def encode_cursor(value: str | int) -> str:
    """The cursor for the position ``value`` (an id, or a sequence number)."""
    if isinstance(value, str):
        return f"id.{value}"
    return f"seq.{value}"


def decode_cursor(cursor: str | None, kind: type) -> Any:
    """The position a cursor stands for (``kind`` ``str`` for an id, ``int`` for a sequence
    number); 400 ``bad-cursor`` for anything outside its grammar."""
    if cursor is None:
        return None
    found = (_SEQ_CURSOR if kind is int else _ID_CURSOR).match(cursor)
    if found is None:
        raise Problem(BAD_CURSOR, "the cursor is not one this API issued")
    return int(found.group(1)) if kind is int else found.group(1)


def page_limit(settings: Settings, limit: int | None) -> int:
    """The page size asked for, within ``max_page_size`` (422 ``limit-exceeded`` beyond)."""
    if limit is None:
        return settings.default_page_size
    if limit > settings.max_page_size:
        raise limit_exceeded("max_page_size", settings.max_page_size, limit)
    return limit


CursorQuery = Annotated[
    str | None,
    Query(
        max_length=512,
        description="`next_cursor` of the previous page",
        json_schema_extra={"pattern": ID_CURSOR_PATTERN},
    ),
]
"""A cursor over ids (conversations, runs). The grammar is the document's, checked by
:func:`decode_cursor` (400 ``bad-cursor``), not by FastAPI (which would answer 422)."""
SeqCursorQuery = Annotated[
    str | None,
    Query(
        max_length=512,
        description="`next_cursor` of the previous page",
        json_schema_extra={"pattern": SEQ_CURSOR_PATTERN},
    ),
]
"""A cursor over sequence numbers (the transcript)."""
LimitQuery = Annotated[
    int | None,
    Query(
        ge=1,
        description="Page size: at most `max_page_size` (200 unless configured; more "
        "is a 422 `limit-exceeded`), 50 when left out",
    ),
]
"""Its ``maximum`` is the app's ``max_page_size``, which :func:`app.api.app.create_app` writes
into the document (the setting is the app's, not the module's)."""
