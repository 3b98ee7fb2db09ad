"""What makes two run requests with one ``Idempotency-Key`` "the same" (docs/runs.md).

The fingerprint covers what the client *sent*: the request body's JSON, canonicalized, never
the parsed model. A model fills in defaults, so hashing it would change every stored key's
fingerprint whenever a field is added to the request (the repeat of a request sent before an
upgrade would become ``422 idempotency-key-mismatch``). The canonical form:

- object members sorted by name, no whitespace between tokens, strings with ``\\uXXXX``
  escapes for everything outside ASCII (so ``"é"`` and ``"\\u00e9"`` are one string);
- numbers by value: ``1``, ``1.0`` and ``1e0`` are one number (zero-fraction numbers are
  accepted for integer fields, so they are the same request);
- a member given twice counts once, with its last value (as the parser reads it).

Everything else stays as sent: ``"prompts": ["hi"]`` and the same prompt written out as a user
message are two requests, and so are a body with ``"stream": false`` and one without it.

Fingerprints are stored as ``json-sha256:<hex>``. Keys stored before this form existed hold a
bare hex SHA-256 of the parsed model (:func:`legacy_fingerprint`); while such a key is within its
retention, a repeat is compared in that form, so an upgrade turns no stored key into a spurious
mismatch (the model's fields did not change with this form).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel

PREFIX = "json-sha256:"


def _by_value(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _by_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_by_value(v) for v in value]
    return value


def canonical_json(raw: bytes) -> bytes:
    """The canonical form of a JSON text (see the module's docstring)."""
    value = _by_value(json.loads(raw))
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def request_fingerprint(raw: bytes) -> str:
    """The fingerprint of a request body as received."""
    return PREFIX + hashlib.sha256(canonical_json(raw)).hexdigest()


#: request fields added after that form: left out when unset, so an old key still matches
LATER_FIELDS = frozenset(
    {"output_schema", "model", "temperature", "max_output_tokens", "instructions"}
)


def legacy_fingerprint(body: BaseModel) -> str:
    """The form stored before :func:`request_fingerprint`: the parsed model, as JSON (without
    the :data:`LATER_FIELDS` it leaves unset)."""
    unset = {name for name in LATER_FIELDS if getattr(body, name, None) is None}
    dumped = body.model_dump(mode="json", exclude=unset)
    if isinstance(dumped.get("tools"), list):  # client tools as they were dumped then
        dumped["tools"] = [
            {k: t[k] for k in ("name", "description", "parameters") if k in t}
            if t.get("type") == "function" and t.get("strict") is None
            else t
            for t in dumped["tools"]
        ]
    canonical = json.dumps(dumped, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


__all__ = ["PREFIX", "canonical_json", "legacy_fingerprint", "request_fingerprint"]
