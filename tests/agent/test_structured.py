"""app.agent.structured on its own: schemas checked, the first violation named, and the echo
provider's instances matching the schemas they were made from."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.agent.structured import broken_instance, instance_of, schema_problem, violation

SCHEMAS: list[dict[str, Any]] = [
    {"type": "string", "minLength": 9, "maxLength": 12},
    {"type": "integer", "minimum": 3, "maximum": 7},
    {"type": "number", "exclusiveMinimum": 0},
    {"type": ["null", "boolean"]},
    {"enum": ["b", "a"]},
    {"const": {"x": 1}},
    {"type": "array", "items": {"type": "integer"}, "minItems": 3, "maxItems": 3},
    {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}},
            "either": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
        },
        "required": ["name", "tags", "either"],
        "additionalProperties": False,
        "$defs": {"tag": {"type": "object", "properties": {"v": {"type": "string"}}}},
    },
]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_an_instance_matches_its_schema_and_a_broken_one_does_not(schema: dict[str, Any]) -> None:
    assert schema_problem(schema) is None
    assert violation(schema, json.dumps(instance_of(schema))) is None
    assert instance_of(schema) == instance_of(schema)  # deterministic
    if "const" not in schema and "enum" not in schema:
        assert violation(schema, json.dumps(broken_instance(schema))) is not None


def test_the_first_violation_is_named_by_its_path() -> None:
    schema = SCHEMAS[-1]
    found = violation(schema, '{"name": "n", "tags": [{"v": 3}], "either": []}')
    assert found is not None and found.startswith("at $.either: "), found
    found = violation(schema, '{"name": "n", "tags": [{"v": 3}], "either": 1}')
    assert found == "at $.tags[0].v: 3 is not of type 'string'"
    assert violation(schema, "{'not': json}") is not None
    assert "not JSON" in (violation(schema, "nope") or "")


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ({"type": "nope"}, "not a valid JSON Schema at /type"),
        ({"properties": {"a": {"minimum": "x"}}}, "not a valid JSON Schema"),
        ({"$ref": "#/$defs/missing"}, "cannot be applied"),
        (["a list"], "a JSON object"),
    ],
)
def test_a_schema_that_is_not_json_schema_is_named(schema: Any, says: str) -> None:
    problem = schema_problem(schema)
    assert problem is not None and says in problem, problem
