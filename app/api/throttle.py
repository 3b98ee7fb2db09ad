"""Failed authentication, throttled per client address (docs/security.md, "Key guessing").

Every request that presents a credential which is refused (a wrong or revoked key, an
``Authorization`` header that is not ``Bearer <key>``) is a *failure* of its client address.
An address may fail ``limit`` times in ``window`` seconds; past that, every request from it
that needs a key is ``429 too-many-auth-failures`` with ``Retry-After``, **without its key
being checked** — a valid key passes no more than a guess does, or the answer would tell a
guesser when it guessed right. The budget refills steadily: one failure's worth every
``window / limit`` seconds (a generic cell rate: an address that keeps guessing gets one try
per ``window / limit`` seconds at most, a burst of ``limit`` after a quiet ``window``).

A request without any credential is not a failure (it is not a guess: a misconfigured client
keeps its plain 401). A success does not reset the count (else a tenant holding one key could
guess others' between its own requests).

Addresses: the socket peer as the server sees it (``--proxy-headers`` behind a trusted proxy
makes it the forwarded one); IPv6 addresses count per ``/64``, the block one host is usually
given. The state is per process, bounded to :data:`MAX_TRACKED` addresses: one float each;
entries whose budget is full again are forgotten first.

Failures are counted (``carryover_auth_failures{outcome="unauthorized"|"throttled"}``) and
logged: each refused credential at INFO (at most ``limit`` per window per address, since the
throttle bounds them), the start of an address's throttling at WARNING, once per episode.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

#: addresses remembered at most (an attacker with many addresses must not grow the table)
MAX_TRACKED = 100_000


def client_key(address: str | None) -> str:
    """What failures are counted by: the address, an IPv6 one by its ``/64``."""
    if not address:
        return "unknown"
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class AuthThrottle:
    """Failed authentications per client address (see the module's docstring)."""

    def __init__(
        self,
        limit: int,
        window: float,
        clock: Callable[[], float] = time.monotonic,
        max_tracked: int = MAX_TRACKED,
    ) -> None:
        self.limit = limit
        self.window = window
        self.clock = clock
        self.max_tracked = max_tracked
        # the theoretical arrival time of the next failure, per address: ``now`` plus the
        # budget spent (each failure spends ``window / limit`` seconds of it)
        self._due: dict[str, float] = {}
        self._throttled: set[str] = set()

    @property
    def enabled(self) -> bool:
        return self.limit > 0

    def retry_after(self, address: str | None) -> int | None:
        """Seconds until ``address`` may try again, or ``None`` when it may now."""
        if not self.enabled:
            return None
        key = client_key(address)
        due = self._due.get(key)
        if due is None:
            return None
        wait = due - self.clock() - self.window + self.window / self.limit
        if wait <= 0:
            self._throttled.discard(key)
            return None
        if key not in self._throttled:
            self._throttled.add(key)
            log.warning(
                "authentication: throttling client %s: more than %d failed attempts in %g s; "
                "its requests are refused for %d s",
                key,
                self.limit,
                self.window,
                math.ceil(wait),
            )
        return max(1, math.ceil(wait))

    def failed(self, address: str | None) -> None:
        """One more refused credential from ``address``."""
        if not self.enabled:
            return
        key = client_key(address)
        now = self.clock()
        due = max(self._due.pop(key, now), now) + self.window / self.limit
        if len(self._due) >= self.max_tracked:
            self._forget(now)
        self._due[key] = due  # re-inserted: the table's order is the last failure's

    def _forget(self, now: float) -> None:
        """Make room: addresses whose budget is whole again, else the longest quiet ones."""
        self._due = {k: v for k, v in self._due.items() if v > now}
        while len(self._due) >= self.max_tracked:
            oldest = next(iter(self._due))
            del self._due[oldest]
            self._throttled.discard(oldest)
        self._throttled &= self._due.keys()

    def __len__(self) -> int:
        return len(self._due)


__all__ = ["MAX_TRACKED", "AuthThrottle", "client_key"]
