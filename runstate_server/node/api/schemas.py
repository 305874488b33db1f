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

# A minor amount: a decimal-digit string (or an integer) of at most 19 digits.
MINOR_DIGITS_MAX = len(str(limits.budget_limit_minor_max))
MINOR: dict[str, Any] = {"anyOf": [
    {"type": "string", "pattern": f"^[0-9]{{1,{MINOR_DIGITS_MAX - 1}}}$"},  # a shorter one is below the max
    {"type": "integer", "minimum": 0, "maximum": limits.budget_limit_minor_max},
]}
# A minor amount of at least 1 (a limit, a reservation).
MINOR_POSITIVE: dict[str, Any] = {"anyOf": [
    {"type": "string", "pattern": f"^(?=[0-9]*[1-9])[0-9]{{1,{MINOR_DIGITS_MAX - 1}}}$"},
    {"type": "integer", "minimum": 1, "maximum": limits.budget_limit_minor_max},
]}


def closed(properties: dict[str, Any], *, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """A request's nested object: these `properties` and no others, the `required` ones present."""
    schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = list(required)
    return schema


# A job's requirements as tasks.needs_of takes them: pools and one quota by name with their units,
# budgets with the minor units reserved. Not stated here: the units of all pools sum to at most
# needs_slots_max, and each is within what its pool or quota holds now (the node's state).
REQUIREMENTS = closed({
    "pools": {"type": "array", "maxItems": limits.needs_slots_max,
              "items": closed({"name": NAME, "units": bounded(1, limits.needs_slots_max)}, required=("name",))},
    "quotas": {"type": "array", "maxItems": 1,
               "items": closed({"name": NAME, "units": bounded(1, limits.limit_units_max)}, required=("name",))},
    "budgets": {"type": "array", "maxItems": limits.budget_reservations_per_job_max,
                "items": closed({"name": NAME, "reserveMinor": MINOR_POSITIVE}, required=("name", "reserveMinor"))},
})

STRING_OR_NULL = nullable(STRING)
TIME_OR_NULL = nullable(TIME)
INTEGER_OR_NULL = nullable(INTEGER)

# The error envelope every non-2xx answer carries.
ERROR = obj({"error": obj({"code": STRING, "message": STRING, "requestId": STRING})})
