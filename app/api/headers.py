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
