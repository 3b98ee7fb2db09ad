"""Request dependencies: the app's services, the caller's tenant, and header parsing."""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Header, Path, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import Settings
from app.etag import ETagCondition
from app.service.agents import AgentPool
from app.service.conversations import ConversationService
from app.service.runs import RunManager

from .auth import DEFAULT_TENANT as DEFAULT_TENANT  # re-exported
from .auth import TENANT_SCOPE_KEY, Authenticator
from .etags import parse_condition
from .problems import BAD_CURSOR, BAD_HEADER, Problem, limit_exceeded
from .schemas import CONVERSATION_ID_PATTERN


@dataclass
class Services:
    """What the app holds for its lifetime (``app.state.services``)."""

    settings: Settings
    engine: AsyncEngine  # for the readiness check
    agents: AgentPool
    conversations: ConversationService
    runs: RunManager
    auth: Authenticator


def services(request: Request) -> Services:
    found: Services = request.app.state.services
    return found


ServicesDep = Annotated[Services, Depends(services)]

_bearer = HTTPBearer(
    auto_error=False,
    description="An API key bound to a tenant (`carryover keys create --tenant NAME`, or "
    "`CARRYOVER_API_KEYS`). Required once keys are configured.",
)


async def tenant(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str:
    """The caller's tenant, as :class:`~app.api.auth.AuthMiddleware` authenticated it (the
    bearer scheme is declared here so that the OpenAPI document says so). Without configured
    keys everything is the ``default`` tenant."""
    found = request.scope.get(TENANT_SCOPE_KEY)
    if isinstance(found, str):
        return found
    # Not behind the middleware (a route on a public path): authenticate here.
    return await services(request).auth.authenticate(request.headers.get("authorization"))


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
    ),
]
IfNoneMatchHeader = Annotated[
    str | None,
    Header(
        alias="If-None-Match",
        description="GET: answer 304 if the ETag still matches. PUT: `*` creates only if absent",
    ),
]


def if_match_value(header: str | None) -> ETagCondition | None:
    """An If-Match header as the services take it (400 ``bad-header`` when malformed)."""
    return parse_condition(header, "If-Match")


def if_none_match_value(header: str | None) -> ETagCondition | None:
    """An If-None-Match header as the services take it (400 ``bad-header`` when malformed)."""
    return parse_condition(header, "If-None-Match")


# --- Prefer (RFC 7240) --------------------------------------------------------------------

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


def encode_cursor(value: Any) -> str:
    raw = json.dumps({"after": value}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str | None, kind: type) -> Any:
    """The position a cursor stands for; 400 ``bad-cursor`` for anything we did not issue."""
    if cursor is None:
        return None
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
        value = data["after"]
    except (ValueError, KeyError, TypeError, binascii.Error, UnicodeError):
        raise Problem(BAD_CURSOR, "the cursor is not one this API issued") from None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise Problem(BAD_CURSOR, "the cursor is not one this API issued")
    # Positions are ids (which the database must be able to compare) or sequence numbers
    # (which fit a BIGINT): anything else was not issued here.
    if isinstance(value, str) and not _CURSOR_ID.match(value):
        raise Problem(BAD_CURSOR, "the cursor is not one this API issued")
    if isinstance(value, int) and not 0 <= value < 2**63:
        raise Problem(BAD_CURSOR, "the cursor is not one this API issued")
    return value


_CURSOR_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}\Z")


def page_limit(settings: Settings, limit: int | None) -> int:
    """The page size asked for, within ``max_page_size`` (422 ``limit-exceeded`` beyond)."""
    if limit is None:
        return settings.default_page_size
    if limit > settings.max_page_size:
        raise limit_exceeded("max_page_size", settings.max_page_size, limit)
    return limit


CursorQuery = Annotated[
    str | None, Query(max_length=512, description="`next_cursor` of the previous page")
]
LimitQuery = Annotated[
    int | None,
    Query(
        ge=1,
        description="Page size: at most `max_page_size` (200 unless configured; more "
        "is a 422 `limit-exceeded`), 50 when left out",
    ),
]
