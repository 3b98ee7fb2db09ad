"""Structured outputs: a run's answer in the shape of a JSON Schema (docs/runs.md, "Structured
outputs").

- :class:`OutputSchema`: the schema a run asks for (``name``, ``schema``, ``strict``);
  :func:`schema_problem` says why a schema is not valid JSON Schema (422 at request time);
- :func:`violation`: the first way an answer breaks the schema (None: it validates), and
  :func:`correction`, the user message a run sends back to the model to retry;
- :func:`parsed_output`: the answer as JSON, only when it validates;
- :func:`instance_of`: a deterministic instance of a schema (the ``echo`` provider's answer).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import jsonschema  # type: ignore[import-untyped]
from jsonschema.exceptions import SchemaError  # type: ignore[import-untyped]

from .messages import AssistantMessage, UserMessage, text_of

#: how a correction starts: the echo provider tells it from a prompt by this
CORRECTION_PREFIX = "Your answer does not match the required JSON schema"
#: stop reasons that end a structured run without a retry
NOT_RETRIED = frozenset({"refusal", "max_tokens", "content_filter"})


@dataclass(frozen=True)
class OutputSchema:
    """The JSON Schema a run's answer must match. ``name``: how the provider is told of it."""

    name: str
    schema: dict[str, Any] = field(hash=False)
    strict: bool = True

    def dump(self) -> dict[str, Any]:
        return {"name": self.name, "schema": self.schema, "strict": self.strict}

    @classmethod
    def load(cls, value: dict[str, Any]) -> OutputSchema:
        return cls(str(value["name"]), dict(value["schema"]), bool(value.get("strict", True)))


def schema_problem(schema: Any) -> str | None:
    """Why ``schema`` is not a valid JSON Schema (its own metaschema says), or None."""
    if not isinstance(schema, dict):
        return "a schema is a JSON object"
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        where = "".join(f"/{p}" for p in exc.absolute_path) or "/"
        return f"not a valid JSON Schema at {where}: {exc.message}"
    try:  # a schema that cannot be applied (a $ref to nowhere, or to another document)
        _first_error(schema, instance_of(schema))
    except Exception as exc:  # jsonschema's referencing errors share no public base
        return f"the schema cannot be applied: {exc}"
    return None


def _first_error(schema: dict[str, Any], value: Any) -> Any:
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = sorted(validator.iter_errors(value), key=lambda e: (list(map(str, e.path)), e.message))
    return errors[0] if errors else None


def _where(path: Any) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)


def violation(schema: dict[str, Any], text: str) -> str | None:
    """The first way ``text`` breaks ``schema`` (None: it is JSON that validates)."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        return f"the answer is not JSON: {exc}"
    try:
        first = _first_error(schema, value)
    except Exception as exc:  # checked at request time; a stored schema may still fail here
        return f"the schema cannot be applied: {exc}"
    if first is None:
        return None
    return f"at {_where(first.absolute_path)}: {first.message}"


def answer_violation(schema: OutputSchema, message: AssistantMessage) -> str | None:
    return violation(schema.schema, text_of(message))


def correction(problem: str) -> UserMessage:
    """What the model is told when its answer does not validate, to answer again."""
    return UserMessage.text(
        f"{CORRECTION_PREFIX} ({problem}). Answer again with only a JSON value that matches it."
    )


def parsed_output(schema: dict[str, Any] | None, message: AssistantMessage | None) -> Any:
    """The answer as JSON when it validates against ``schema``; None otherwise (nothing
    invalid is ever presented as parsed)."""
    if schema is None or message is None:
        return None
    text = text_of(message)
    if violation(schema, text) is not None:
        return None
    return json.loads(text)


# --- a deterministic instance (echo) -------------------------------------------------------


def instance_of(schema: Any, root: Any = None, depth: int = 0) -> Any:
    """A value that matches ``schema`` for the common keywords: ``type``, ``properties``,
    ``required``, ``enum``, ``const``, ``items``, ``minItems``, ``minimum``/``maximum``,
    ``minLength``, ``anyOf``/``oneOf``/``allOf`` (the first), local ``$ref``s."""
    root = schema if root is None else root
    if not isinstance(schema, dict) or depth > 16:
        return None
    if "$ref" in schema and isinstance(schema["$ref"], str) and schema["$ref"].startswith("#"):
        target: Any = root
        for part in schema["$ref"].lstrip("#").strip("/").split("/"):
            if part:
                target = target.get(part.replace("~1", "/").replace("~0", "~"), {})
        return instance_of(target, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            return instance_of(schema[key][0], root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), kind[0] if kind else None)
    if kind is None:
        kind = "object" if "properties" in schema else "string"
    if kind == "object":
        props = schema.get("properties") or {}
        return {name: instance_of(sub, root, depth + 1) for name, sub in props.items()}
    if kind == "array":
        count = max(int(schema.get("minItems", 1)), 0)
        if "maxItems" in schema:
            count = min(count, int(schema["maxItems"]))
        return [instance_of(schema.get("items") or {}, root, depth + 1) for _ in range(count)]
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum"))
        high = schema.get("maximum", schema.get("exclusiveMaximum"))
        value: float = 0 if low is None else low
        if "exclusiveMinimum" in schema and value == schema["exclusiveMinimum"]:
            value += 1
        if high is not None and value > high:
            value = high
        return int(value) if kind == "integer" else value
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    text = "echo"
    if "minLength" in schema:
        text = text.ljust(int(schema["minLength"]), "o")
    if "maxLength" in schema:
        text = text[: int(schema["maxLength"])]
    return text


def broken_instance(schema: Any) -> Any:
    """A value that does NOT match ``schema`` (the echo provider's ``/invalid``)."""
    value = instance_of(schema)
    if isinstance(schema, dict):
        required = schema.get("required") or []
        if isinstance(value, dict) and required:
            return {k: v for k, v in value.items() if k != required[0]}
        if isinstance(value, str | bool | int | float) or value is None:
            return [value]
    return "not the schema's shape"


__all__ = [
    "CORRECTION_PREFIX",
    "NOT_RETRIED",
    "OutputSchema",
    "answer_violation",
    "broken_instance",
    "correction",
    "instance_of",
    "parsed_output",
    "schema_problem",
    "violation",
]
