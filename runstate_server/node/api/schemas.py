"""JSON Schema fragments for the OpenAPI document: what each route takes and answers.

Every route declares the schema of its success answer (`answer=`), so a client generated from the
document, and schema fuzzing (schemathesis), can tell a wrong answer from a right one. Answers may
carry more fields than a schema names; the named ones are required and typed.
"""

from __future__ import annotations

from typing import Any

STRING: dict[str, Any] = {"type": "string"}
INTEGER: dict[str, Any] = {"type": "integer"}
NUMBER: dict[str, Any] = {"type": "number"}
BOOLEAN: dict[str, Any] = {"type": "boolean"}
ANY_JSON: dict[str, Any] = {}
TIME: dict[str, Any] = {"type": "string", "format": "date-time"}


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def enum(*values: str) -> dict[str, Any]:
    return {"type": "string", "enum": list(values)}


def array(items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": items}


def obj(properties: dict[str, Any], *, optional: dict[str, Any] | None = None) -> dict[str, Any]:
    """An object whose `properties` are all present (null where the schema allows), plus
    `optional` ones that may be absent."""
    return {
        "type": "object",
        "properties": {**properties, **(optional or {})},
        "required": sorted(properties),
    }


STRING_OR_NULL = nullable(STRING)
TIME_OR_NULL = nullable(TIME)
INTEGER_OR_NULL = nullable(INTEGER)

# The error envelope every non-2xx answer carries.
ERROR = obj({"error": obj({"code": STRING, "message": STRING, "requestId": STRING})})
