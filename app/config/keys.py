"""API keys bound to tenants (``CARRYOVER_API_KEYS``): :class:`ApiKeys`, re-exported by
:mod:`app.config`."""

from __future__ import annotations

import hmac
import re
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
#: the shortest key ``carryover serve`` accepts in ``CARRYOVER_API_KEYS`` (docs/security.md)
MIN_API_KEY_LENGTH = 16
#: what a tenant (and a profile) may be called
TENANT_NAME = _NAME


class ApiKeys:
    """API keys and the tenant each one is bound to (``CARRYOVER_API_KEYS``).

    Parsed from comma-separated ``tenant:key`` pairs; a tenant may have several keys (rotation),
    a key belongs to exactly one tenant. The repr names tenants, never keys.
    """

    __slots__ = ("_tenant_by_key",)

    def __init__(self, tenant_by_key: Mapping[str, str] | None = None) -> None:
        self._tenant_by_key: dict[str, str] = dict(tenant_by_key or {})

    @classmethod
    def parse(cls, value: str | Iterable[str]) -> ApiKeys:
        """Parse ``"acme:k1,globex:k2"`` (or an iterable of ``tenant:key`` items)."""
        items = value.split(",") if isinstance(value, str) else list(value)
        tenant_by_key: dict[str, str] = {}
        for position, raw in enumerate(items, start=1):
            item = raw.strip()
            if not item:
                continue
            tenant, sep, key = item.partition(":")
            tenant, key = tenant.strip(), key.strip()
            if not sep or not tenant or not key:
                raise ValueError(
                    f"API key entry {position} must look like 'tenant:key' "
                    "(the entry itself is not shown: it may be a secret)"
                )
            if not _NAME.match(tenant):
                raise ValueError(
                    f"API key entry {position}: tenant {tenant!r} must be 1-64 letters, digits, "
                    "'.', '_' or '-', starting with a letter or digit"
                )
            if any(c.isspace() for c in key):
                raise ValueError(f"API key entry {position}: the key contains whitespace")
            if tenant_by_key.get(key, tenant) != tenant:
                raise ValueError(f"API key entry {position}: the same key is bound to two tenants")
            tenant_by_key[key] = tenant
        return cls(tenant_by_key)

    def tenant_for(self, key: str) -> str | None:
        """The tenant a presented key belongs to, or ``None``; compared in constant time."""
        found: str | None = None
        presented = key.encode()
        for candidate, tenant in self._tenant_by_key.items():
            if hmac.compare_digest(candidate.encode(), presented):
                found = tenant
        return found

    def short_key_tenants(self, minimum: int = MIN_API_KEY_LENGTH) -> list[str]:
        """The tenants (sorted, each once) holding a key shorter than ``minimum`` characters."""
        return sorted({t for k, t in self._tenant_by_key.items() if len(k) < minimum})

    @property
    def tenants(self) -> frozenset[str]:
        return frozenset(self._tenant_by_key.values())

    def secret_values(self) -> tuple[str, ...]:
        return tuple(self._tenant_by_key)

    def __len__(self) -> int:
        return len(self._tenant_by_key)

    def __bool__(self) -> bool:
        return bool(self._tenant_by_key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ApiKeys) and other._tenant_by_key == self._tenant_by_key

    def __hash__(self) -> int:
        return hash(frozenset(self._tenant_by_key.items()))

    def __repr__(self) -> str:
        return f"ApiKeys(tenants={sorted(self.tenants)!r}, keys={len(self)})"

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        def validate(value: Any) -> ApiKeys:
            if isinstance(value, ApiKeys):
                return value
            if value is None:
                return cls()
            if isinstance(value, str) or (
                isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)
            ):
                return cls.parse(value)
            raise ValueError("expected comma-separated 'tenant:key' pairs")

        return core_schema.no_info_plain_validator_function(
            validate,
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda v: "**********" if v else ""
            ),
        )
