"""The conversation metadata at the HTTP edge: the configured limits (checked on create,
patch, fork and import, and written into the document) and the ``metadata.KEY=VALUE`` filters
of a listing. Used by :mod:`app.api.routes.conversations` and
:mod:`app.api.routes.portability`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from fastapi import Request

from app.config import Settings

from .limits import refuse_nul
from .problems import limit_exceeded, validation_error
from .schemas import METADATA_KEY_PATTERN


def check_metadata(
    settings: Settings, metadata: Mapping[str, str | None], path: str, *, count: bool = True
) -> None:
    """The configured metadata limits (422 ``limit-exceeded``; the store checks the count
    after a merge patch) and no NUL in a key or a value (422 ``validation-error``: they are
    stored in text columns)."""
    if count and len(metadata) > settings.max_metadata_keys:
        raise limit_exceeded("max_metadata_keys", settings.max_metadata_keys, len(metadata))
    for key, value in metadata.items():
        if len(key) > settings.max_metadata_key_chars:
            raise limit_exceeded(
                "max_metadata_key_chars", settings.max_metadata_key_chars, len(key)
            )
        if value is not None and len(value) > settings.max_metadata_value_chars:
            raise limit_exceeded(
                "max_metadata_value_chars", settings.max_metadata_value_chars, len(value)
            )
        refuse_nul(key, f"{path}.{key}")
        if value is not None:
            refuse_nul(value, f"{path}.{key}")


_METADATA_KEY = re.compile(METADATA_KEY_PATTERN)


def document_metadata(document: dict[str, Any], settings: Settings) -> None:
    """Write the configured metadata limits into every metadata object of the document (the
    committed one is built from the default settings): the key pattern and length as
    ``propertyNames``, no other keys, the value length, and the key count."""

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            pattern = node.get("patternProperties", {})
            if METADATA_KEY_PATTERN in pattern:
                node["additionalProperties"] = False
                node["propertyNames"] = {
                    "pattern": METADATA_KEY_PATTERN,
                    "maxLength": settings.max_metadata_key_chars,
                }
                node["maxProperties"] = settings.max_metadata_keys
                value = pattern[METADATA_KEY_PATTERN]
                for option in value.get("anyOf", [value]):
                    if option.get("type") == "string":
                        option["maxLength"] = settings.max_metadata_value_chars
            for child in node.values():
                visit(child)
        elif isinstance(node, list):
            for child in node:
                visit(child)

    visit(document.get("components", {}))


def metadata_filters(request: Request) -> list[tuple[str, str]]:
    """The ``metadata.KEY=VALUE`` query parameters, in order (422 naming a bad one)."""
    found: list[tuple[str, str]] = []
    for name, value in request.query_params.multi_items():
        if not name.startswith("metadata."):
            continue
        key = name.removeprefix("metadata.")
        if not _METADATA_KEY.match(key):
            raise validation_error(
                [
                    {
                        "path": f"query.{name}",
                        "message": f"metadata key must match {METADATA_KEY_PATTERN}",
                    }
                ]
            )
        if len(value) > 1024:
            raise validation_error(
                [{"path": f"query.{name}", "message": "at most 1024 characters"}]
            )
        refuse_nul(value, f"query.{name}")  # no stored value holds one (check_metadata)
        found.append((key, value))
    return found
