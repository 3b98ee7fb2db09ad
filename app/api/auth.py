"""Who is calling (contract §6): ``Authorization: Bearer <key>``, each key bound to one tenant.

Keys come from two places, and either kind is accepted:

- ``CARRYOVER_API_KEYS`` (``tenant:key,...``), compared in constant time
  (:meth:`app.config.ApiKeys.tenant_for`);
- the ``api_keys`` table (``carryover keys create --tenant NAME``), looked up by SHA-256.
  A lookup is cached for ``api_key_cache_seconds`` (default 2), so a revoked key stops working
  within that time on every replica, and a flood of requests costs one query per key per period.

Authentication is *required* once keys are configured: when ``CARRYOVER_API_KEYS`` is set, or
the database holds a key that is not revoked. The app checks the database when it starts, and
while it runs without keys it looks again at most every ``api_key_cache_seconds``, so the first
``carryover keys create`` turns authentication on in a running server too. Once on, it stays on
for the life of the process, even if every key is revoked (then every request is 401): revoking
keys never opens a server up.

:class:`AuthMiddleware` runs before routing, body parsing and the body-size check, so an
unauthenticated caller learns nothing about routes, ids or validation rules, and costs no more
than reading its headers. Public without a key: ``/healthz``, ``/readyz``, the OpenAPI document
and its viewers (``/openapi.json``, ``/docs``, ``/redoc`` and their files under ``/docs/assets/``),
the console's page and files (``/console``, ``/console/static/``: they hold no data; the page
asks for a key before it reads any), and ``/metrics`` only when ``CARRYOVER_PUBLIC_METRICS`` is
set. Without keys configured every request belongs to the tenant
``default``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from app.config import ApiKeys
from app.observability import observe_auth_failure
from app.store.faults import classify
from app.store.keys import KeyStore, hash_key

from .problems import NOT_READY, TOO_MANY_AUTH_FAILURES, UNAUTHORIZED, Problem, database_unavailable
from .throttle import AuthThrottle, client_key

log = logging.getLogger(__name__)

DEFAULT_TENANT = "default"
#: where the middleware leaves the authenticated tenant for the ``tenant`` dependency
TENANT_SCOPE_KEY = "carryover.tenant"
PUBLIC_PATHS = frozenset(
    {
        "/healthz",
        "/readyz",
        "/openapi.json",
        "/docs",
        "/docs/oauth2-redirect",
        "/redoc",
        "/console",
        "/console/",
    }
)
#: public folders: static files that hold nothing of a tenant (the viewers', the console's)
PUBLIC_PREFIXES = ("/docs/assets/", "/console/static/")
METRICS_PATH = "/metrics"
#: a presented key longer than this is refused without a lookup
MAX_KEY_LENGTH = 512
#: lookups remembered at most (a cache of attacker-chosen strings must stay bounded)
MAX_CACHED_LOOKUPS = 10_000

_CHALLENGE = 'Bearer realm="carryover"'


def _unauthorized(detail: str, *, invalid: bool = False) -> Problem:
    challenge = _CHALLENGE + (', error="invalid_token"' if invalid else "")
    return Problem(UNAUTHORIZED, detail, headers={"WWW-Authenticate": challenge})


def bearer_token(authorization: str | None) -> str:
    """The key in an ``Authorization: Bearer <key>`` header; 401 for anything else."""
    if authorization is None or not authorization.strip():
        raise _unauthorized("send an API key as 'Authorization: Bearer <key>'")
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise _unauthorized("the Authorization header must be 'Bearer <key>'", invalid=True)
    return token


class Authenticator:
    """Decides whether keys are required and which tenant a key belongs to."""

    def __init__(
        self,
        env_keys: ApiKeys,
        store: KeyStore,
        cache_seconds: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        *,
        failure_limit: int = 0,
        failure_window: float = 60.0,
    ) -> None:
        self.env_keys = env_keys
        self.store = store
        self.cache_seconds = cache_seconds
        self.clock = clock
        #: refused credentials per client address (app/api/throttle.py); 0: not throttled
        self.throttle = AuthThrottle(failure_limit, failure_window, clock)
        self._db_keys_seen = False
        self._next_check = float("-inf")
        self._lookups: dict[str, tuple[str | None, float]] = {}

    async def refresh(self) -> int:
        """Count the database's active keys now (at start, and while none were seen)."""
        count = await self.store.active_count()
        if count:
            self._db_keys_seen = True
        self._next_check = self.clock() + self.cache_seconds
        return count

    async def required(self) -> bool:
        """Whether requests must carry a key."""
        if self.env_keys or self._db_keys_seen:
            return True
        if self.clock() >= self._next_check:
            await self.refresh()
        return self._db_keys_seen

    async def tenant_for(self, key: str) -> str | None:
        """The tenant of a valid key, else ``None``."""
        if len(key) > MAX_KEY_LENGTH:
            return None
        found = self.env_keys.tenant_for(key)
        if found is not None:
            return found
        digest = hash_key(key)
        now = self.clock()
        cached = self._lookups.get(digest)
        if cached is not None and cached[1] > now:
            return cached[0]
        tenant = await self.store.tenant_for_hash(digest)
        if tenant is not None:
            self._db_keys_seen = True
        if self.cache_seconds > 0:
            if len(self._lookups) >= MAX_CACHED_LOOKUPS:
                self._lookups = {k: v for k, v in self._lookups.items() if v[1] > now}
                if len(self._lookups) >= MAX_CACHED_LOOKUPS:
                    self._lookups.clear()
            self._lookups[digest] = (tenant, now + self.cache_seconds)
        return tenant

    async def authenticate(self, authorization: str | None, client: str | None = None) -> str:
        """The caller's tenant, from its ``Authorization`` header (401 ``unauthorized``).

        ``client``: the caller's address. One that presented too many refused credentials
        lately is 429 ``too-many-auth-failures`` without its key being checked
        (app/api/throttle.py). A database that cannot be asked is a 503
        ``database-unavailable`` (any other failure a 503 ``not-ready``), never a pass.
        """
        try:
            if not await self.required():
                return DEFAULT_TENANT
            wait = self.throttle.retry_after(client)
            if wait is not None:
                observe_auth_failure("throttled")
                raise Problem(
                    TOO_MANY_AUTH_FAILURES,
                    "too many requests from this address presented a wrong API key; "
                    f"try again in {wait} s",
                    headers={"Retry-After": str(wait)},
                )
            try:
                key = bearer_token(authorization)
            except Problem:
                if authorization is not None and authorization.strip():
                    self._failed(client, "the Authorization header is not 'Bearer <key>'")
                raise
            tenant = await self.tenant_for(key)
        except Problem:
            raise
        except Exception as exc:
            fault = classify(exc)
            if fault is not None:  # 503 database-unavailable, with the fault's Retry-After
                log.warning("could not check an API key: database %s", fault.kind)
                raise database_unavailable(
                    "the API key could not be checked: the database is not available "
                    f"({fault.kind.replace('_', ' ')})",
                    fault.retry_after,
                ) from None
            log.exception("could not check an API key")
            raise Problem(
                NOT_READY,
                "the API key could not be checked: the database is not available",
                headers={"Retry-After": "1"},
            ) from None
        if tenant is None:
            self._failed(client, "unknown or revoked API key")
            raise _unauthorized("the API key is not valid (unknown or revoked)", invalid=True)
        return tenant

    def _failed(self, client: str | None, why: str) -> None:
        observe_auth_failure("unauthorized")
        log.info("authentication failed from %s: %s", client_key(client), why)
        self.throttle.failed(client)

    def describe(self, db_keys: int) -> str:
        """The access rule, for the start message."""
        if self.env_keys or db_keys:
            sources = []
            if self.env_keys:
                sources.append(f"{len(self.env_keys)} from CARRYOVER_API_KEYS")
            if db_keys:
                sources.append(f"{db_keys} in the database")
            return "API keys required (" + ", ".join(sources) + ")"
        return (
            "no API keys configured: no authentication, every request is tenant 'default' "
            "(the first 'carryover keys create' turns authentication on)"
        )


async def announce_access(auth: Authenticator) -> None:
    """Learn at start whether the database holds keys, and say which access rule applies.

    A database that cannot be reached now is not fatal (``/readyz`` reports it); requests are
    then refused with 503 until it answers, never let through.
    """
    try:
        db_keys = await auth.refresh()
    except Exception as exc:
        log.warning(
            "access: could not count the API keys in the database (%s); requests "
            "will be refused until it answers",
            type(exc).__name__,
        )
        return
    log.info("access: %s", auth.describe(db_keys))


class AuthMiddleware:
    """Authenticate every request but the public paths before anything else reads it.

    The authenticator is the app's (``app.state.services.auth``, set when it starts).
    """

    def __init__(self, app: ASGIApp, public_metrics: bool = False) -> None:
        self.app = app
        self.public = PUBLIC_PATHS | ({METRICS_PATH} if public_metrics else frozenset())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"] if scope["type"] == "http" else ""
        if scope["type"] != "http" or path in self.public or path.startswith(PUBLIC_PREFIXES):
            await self.app(scope, receive, send)
            return
        authorization = None
        for name, value in scope.get("headers") or ():
            if name == b"authorization":
                authorization = value.decode("latin-1")
                break
        authenticator: Authenticator = scope["app"].state.services.auth
        peer = scope.get("client")
        try:
            scope[TENANT_SCOPE_KEY] = await authenticator.authenticate(
                authorization, peer[0] if peer else None
            )
        except Problem as problem:
            await problem.response(instance=scope["path"])(scope, receive, send)
            return
        await self.app(scope, receive, send)


__all__ = ["DEFAULT_TENANT", "AuthMiddleware", "Authenticator", "bearer_token"]
