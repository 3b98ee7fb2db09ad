"""Conditional requests over HTTP: the logic is :mod:`app.etag` (one module for the API and the
store); this module only names it for the routes."""

from __future__ import annotations

from app.etag import (
    EntityTag,
    ETagCondition,
    HeaderValue,
    MalformedHeader,
    Outcome,
    evaluate_preconditions,
    if_match_passes,
    if_none_match_passes,
    make_etag,
    parse_condition,
)

__all__ = [
    "ETagCondition",
    "EntityTag",
    "HeaderValue",
    "MalformedHeader",
    "Outcome",
    "evaluate_preconditions",
    "if_match_passes",
    "if_none_match_passes",
    "make_etag",
    "parse_condition",
]
