"""JSON Schema fragments for the OpenAPI document: what each route takes and answers.

Every route declares the schema of its success answer (`answer=`), so a client generated from the
document, and schema fuzzing (schemathesis), can tell a wrong answer from a right one. Answers may
carry more fields than a schema names; the named ones are required and typed.
"""

from __future__ import annotations

from typing import Any

from runstate_server.actors import limits

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


def text(max_chars: int) -> dict[str, Any]:
    """A request's text field as _request.text takes it: 1 to `max_chars` characters."""
    return {"type": "string", "minLength": 1, "maxLength": max_chars}


def bounded(minimum: int, maximum: int) -> dict[str, Any]:
    """A request's integer field as _request.integer takes it: from `minimum` to `maximum`."""
    return {"type": "integer", "minimum": minimum, "maximum": maximum}


# The text fields of requests, bounded by the constants the handlers check them with: names and
# ids (a run's scopeId, a mailboxId, a holder, a claim's token), and keys (a taskKey, a delivery's
# token).
NAME = text(limits.name_chars_max)
KEY = text(limits.key_chars_max)
REASON = text(limits.error_message_chars_max)
# A holder (routes.holder_of): at most name_chars_max characters; an empty one names none.
HOLDER: dict[str, Any] = {"type": "string", "maxLength": limits.name_chars_max}

STRING_OR_NULL = nullable(STRING)
TIME_OR_NULL = nullable(TIME)
INTEGER_OR_NULL = nullable(INTEGER)

# The error envelope every non-2xx answer carries.
ERROR = obj({"error": obj({"code": STRING, "message": STRING, "requestId": STRING})})
