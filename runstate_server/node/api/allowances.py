"""Allowances, the published protocol's rate limits (actors/allowances.py): create, declare and read
them by id; consume units now, wait in their FIFO line, cool them down, and settle a consumption's
estimate with what it really used.

An allowance is a rate limit of resources.py (its `units` = `unitsLimit`, `interval_ms` =
`windowSeconds` x 1000: a fraction of a second is an extension); `PATCH /allowances/{id}` changes
one. Every answer of a
write is rendered from the result its core command returned; the views are read under the node's
read lock after leadership is confirmed.
"""

from __future__ import annotations

import math
import time
from typing import Any

from aiohttp import web

from runstate_server.actors import allowances, limits
from runstate_server.actors.resources import LIMIT
from runstate_server.node._json import json_response
from runstate_server.node.api import _request as req
from runstate_server.node.api._named import listed, look_up, resized, resource_name
from runstate_server.node.api.routes import (
    READ,
    RESOURCE_CONFIG,
    SPACE_PREFIX,
    STRING,
    WRITE,
    RouteTable,
    caller_of,
    holder_of,
    node_of,
    require_permission,
)
from runstate_server.node.api.schemas import (
    BOOLEAN,
    HOLDER,
    INTEGER,
    INTEGER_OR_NULL,
    NAME,
    NUMBER,
    STRING_OR_NULL,
    TIME,
    TIME_OR_NULL,
    array,
    enum,
    obj,
    text,
)
from runstate_server.node.api.views import iso
from runstate_server.node.errors import ApiError

routes = RouteTable()

_INACTIVE = ("SCOPE_CANCELLED", "DEADLINE_EXCEEDED")
_UNITS_LIMIT = {"type": "integer", "minimum": 1, "maximum": limits.limit_units_max}
_WINDOW_SECONDS_MAX = limits.limit_interval_ms_max // 1000
# Whole seconds on the protocol; a fraction down to the millisecond is an extension (a "500ms" limit).
_WINDOW_SECONDS = {
    "type": "number", "minimum": limits.limit_interval_ms_min / 1000, "maximum": _WINDOW_SECONDS_MAX,
    "multipleOf": limits.limit_interval_ms_min / 1000,
}
_MS_TOLERANCE = 1e-6  # a decimal fraction of a second is not exact in binary: 0.003 s x 1000 != 3
_UNITS = {"type": "integer", "minimum": 1, "maximum": limits.limit_units_max}
_ROW = {"id": STRING, "name": STRING, "unitsLimit": INTEGER, "windowSeconds": NUMBER}
ROW = obj(_ROW)
VIEW = obj({
    **_ROW,
    "windowStart": TIME, "remaining": INTEGER, "cooldownUntil": TIME_OR_NULL, "cooldownReason": STRING_OR_NULL,
    "waiting": INTEGER,
    "waiters": array(obj({"waiterId": STRING, "units": INTEGER, "holder": STRING_OR_NULL, "scopeId": STRING})),
})
_DECLARED = obj({**_ROW, "created": BOOLEAN})
_WAITER_STATES = enum("WAITING", "GRANTED", "CANCELLED", "EXPIRED")
_WAITER = obj({
    "waiterId": STRING, "allowanceId": STRING, "scopeId": STRING, "units": INTEGER, "holder": STRING_OR_NULL,
    "state": _WAITER_STATES, "position": INTEGER_OR_NULL, "expiresAt": TIME_OR_NULL, "consumptionId": STRING_OR_NULL,
})
# What a wait or a cancel answers.
_WAITER_STATE = obj({"waiterId": STRING, "state": _WAITER_STATES, "consumptionId": STRING_OR_NULL})
_TTL_SECONDS = {
    "type": "number", "minimum": limits.lease_ms_min / 1000, "maximum": limits.allowance_waiter_ttl_ms_max / 1000,
}
_COOLDOWN_SECONDS = {"type": "number", "exclusiveMinimum": 0, "maximum": limits.allowance_cooldown_ms_max / 1000}
_CONSUMPTION = obj({"consumptionId": STRING, "units": INTEGER, "windowStart": TIME, "remaining": INTEGER})
_SETTLED = obj({
    "consumptionId": STRING, "estimatedUnits": INTEGER, "units": INTEGER, "returnedUnits": INTEGER,
    "overrunUnits": INTEGER,
})


def _now_ms(state: Any) -> int:
    """Now by this clock, or the state's if a leader's clock ran ahead of it."""
    return max(int(time.time() * 1000), state.clock_ms)


def _render(request: web.Request, allowance_id: str) -> dict[str, Any]:
    """The allowance's view (times as ISO strings); NOT_FOUND when the space has none of that id."""
    with node_of(request).read() as state:
        limit = allowances.find(state, caller_of(request).space, allowance_id)
        if limit is None:
            raise ApiError("NOT_FOUND", f"allowance {allowance_id!r} not found")
        view = allowances.view(state, limit, _now_ms(state))
    return {**view, "windowStart": iso(view["windowStart"]), "cooldownUntil": iso(view["cooldownUntil"])}


def _row(request: web.Request, allowance_id: str) -> dict[str, Any]:
    view = _render(request, allowance_id)
    return {field: view[field] for field in _ROW}


def _sizes(body: dict[str, Any]) -> dict[str, int] | None:
    """{units, interval_ms} from unitsLimit and windowSeconds (both, or neither: None)."""
    units = req.integer(body, "unitsLimit", minimum=1, maximum=limits.limit_units_max)
    window_ms = _window_ms(body)
    if units is None and window_ms is None:
        return None
    if units is None or window_ms is None:
        raise ApiError("VALIDATION_FAILED", "give both unitsLimit and windowSeconds")
    return {"units": units, "interval_ms": window_ms}


def _window_ms(body: dict[str, Any]) -> int | None:
    """windowSeconds in ms: a number of seconds that is a whole number of ms, 1 ms to 24 h."""
    window_s = body.get("windowSeconds")
    if window_s is None:
        return None
    low, high = limits.limit_interval_ms_min, limits.limit_interval_ms_max
    in_range = type(window_s) in (int, float) and low <= window_s * 1000 <= high  # NaN and inf: False
    if not in_range or abs(window_s * 1000 - round(window_s * 1000)) > _MS_TOLERANCE:
        raise ApiError(
            "VALIDATION_FAILED",
            f"windowSeconds must be a number of seconds from {low / 1000} to {high // 1000}, in whole milliseconds",
        )
    return int(round(window_s * 1000))


@routes(
    "POST", SPACE_PREFIX + "/allowances",
    "Create an allowance (a rate limit: unitsLimit per sliding window of windowSeconds); CONFLICT when the name "
    "is taken",
    body={"name": NAME, "unitsLimit": _UNITS_LIMIT, "windowSeconds": _WINDOW_SECONDS},
    required=("name", "unitsLimit", "windowSeconds"),
    ok=201, errors=("VALIDATION_FAILED", "CONFLICT", "LIMIT_EXCEEDED"), permission=RESOURCE_CONFIG, answer=ROW,
)
async def create(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    name = resource_name(req.text(body, "name", max_chars=limits.name_chars_max, required=True))
    sizes = _sizes(body)
    if sizes is None:
        raise ApiError("VALIDATION_FAILED", "unitsLimit and windowSeconds are required")
    result = await req.propose(request, "allowance.create", {"name": name, **sizes})
    return json_response(_row(request, result["allowance_id"]), status=201)


@routes(
    "GET", SPACE_PREFIX + "/allowances", "The space's allowances, oldest first", permission=READ,
    answer=obj({"allowances": array(ROW)}),
)
async def list_allowances(request: web.Request) -> web.Response:
    return await listed(request, "allowances", allowances.rows)


@routes(
    "PUT", SPACE_PREFIX + "/allowances/by-name/{name}",
    "Declare the allowance of that name with unitsLimit and windowSeconds (created, or found when they are the "
    "same; CONFLICT when they differ), or with {} look it up (NOT_FOUND when none). A look-up needs read, a "
    "declaration resource_config",
    body={"unitsLimit": _UNITS_LIMIT, "windowSeconds": _WINDOW_SECONDS},
    dependent={"unitsLimit": ("windowSeconds",), "windowSeconds": ("unitsLimit",)},
    errors=("VALIDATION_FAILED", "FORBIDDEN", "NOT_FOUND", "CONFLICT", "LIMIT_EXCEEDED"), permission=READ,
    answer=_DECLARED,
)
async def declare(request: web.Request) -> web.Response:
    caller = caller_of(request)
    body = await req.json_body(request, required=False)
    name = resource_name(request.match_info["name"])
    req.refuse_nulls(body, "unitsLimit", "windowSeconds", absent_means="with {} the call looks the allowance up")
    sizes = _sizes(body)
    if sizes is None:  # a look-up
        return await look_up(request, LIMIT, name, "allowance", _row)
    require_permission(caller, RESOURCE_CONFIG)
    result = await req.propose(request, "allowance.declare", {"name": name, **sizes})
    return json_response({**_row(request, result["allowance_id"]), "created": result["created"]})


@routes(
    "PATCH", SPACE_PREFIX + "/allowances/{allowanceId}",
    "Change an allowance's unitsLimit and windowSeconds (an extension: a declaration never changes one). From "
    "now on: what its window already holds counts; more room wakes its waiters",
    body={"unitsLimit": _UNITS_LIMIT, "windowSeconds": _WINDOW_SECONDS}, required=("unitsLimit", "windowSeconds"),
    errors=("VALIDATION_FAILED", "NOT_FOUND"), permission=RESOURCE_CONFIG, answer=ROW,
)
async def resize(request: web.Request) -> web.Response:
    sizes = _sizes(await req.json_body(request))
    if sizes is None:
        raise ApiError("VALIDATION_FAILED", "unitsLimit and windowSeconds are required")
    return await resized(request, LIMIT, "allowanceId", sizes, _row)


@routes(
    "GET", SPACE_PREFIX + "/allowances/{allowanceId}",
    "An allowance now: its sliding window's start, what a consume could take, its cooldown and its waiters in line",
    errors=("NOT_FOUND",), permission=READ, answer=VIEW,
)
async def get(request: web.Request) -> web.Response:
    node, caller = node_of(request), caller_of(request)
    await node.confirm_leadership(caller)
    return json_response(_render(request, request.match_info["allowanceId"]))


def _use_args(request: web.Request, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "allowance_id": request.match_info["allowanceId"],
        "run_id": req.text(body, "scopeId", max_chars=limits.name_chars_max, required=True),
        "units": req.integer(body, "units", minimum=1, maximum=limits.limit_units_max, default=1),
        "holder": holder_of(request, body),
    }


@routes(
    "POST", SPACE_PREFIX + "/allowances/{allowanceId}/consume",
    "Take units now, irrevocably (an estimate may be settled later); ALLOWANCE_EXHAUSTED when the window has not "
    "room or waiters are in line, ALLOWANCE_COOLDOWN under a cooldown (both with Retry-After)",
    body={"scopeId": NAME, "units": _UNITS, "holder": HOLDER}, required=("scopeId",),
    ok=201, errors=("VALIDATION_FAILED", "NOT_FOUND", "ALLOWANCE_EXHAUSTED", "ALLOWANCE_COOLDOWN", *_INACTIVE),
    permission=WRITE, answer=_CONSUMPTION,
)
async def consume(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    result = await req.propose(request, "allowance.consume", _use_args(request, body))
    return json_response(
        {"consumptionId": result["consumption_id"], "units": result["units"],
         "windowStart": iso(result["window_start_ms"]), "remaining": result["remaining"]},
        status=201,
    )


@routes(
    "POST", SPACE_PREFIX + "/allowances/{allowanceId}/wait",
    "Join the allowance's FIFO line for units: GRANTED at once (with its consumptionId) when they can be taken now, "
    "else WAITING until the server grants it as the window allows",
    body={"scopeId": NAME, "units": _UNITS, "holder": HOLDER, "ttlSeconds": _TTL_SECONDS}, required=("scopeId",),
    ok=201, errors=("VALIDATION_FAILED", "NOT_FOUND", "LIMIT_EXCEEDED", *_INACTIVE), permission=WRITE,
    answer=_WAITER_STATE,
)
async def wait(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    ttl_s = body.get("ttlSeconds")
    if ttl_s is not None and (
        isinstance(ttl_s, bool) or not isinstance(ttl_s, (int, float))
        or not limits.lease_ms_min <= ttl_s * 1000 <= limits.allowance_waiter_ttl_ms_max
    ):
        raise ApiError(
            "VALIDATION_FAILED",
            f"ttlSeconds must be a number from {limits.lease_ms_min / 1000} to {limits.allowance_waiter_ttl_ms_max // 1000}",
        )
    args = {**_use_args(request, body), "ttl_ms": None if ttl_s is None else round(ttl_s * 1000)}
    result = await req.propose(request, "allowance.wait", args)
    return json_response(
        {"waiterId": result["waiter_id"], "state": result["state"], "consumptionId": result["consumption_id"]},
        status=201,
    )


@routes(
    "POST", SPACE_PREFIX + "/allowances/{allowanceId}/cooldown",
    "Grant nothing of the allowance for seconds from now (a shorter cooldown never shortens a longer one)",
    body={"seconds": _COOLDOWN_SECONDS, "reason": text(limits.allowance_reason_chars_max)}, required=("seconds",),
    errors=("VALIDATION_FAILED", "NOT_FOUND"), permission=WRITE,
    answer=obj({"cooldownUntil": TIME, "reason": STRING_OR_NULL}),
)
async def cooldown(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    seconds = body.get("seconds")
    if (
        isinstance(seconds, bool) or not isinstance(seconds, (int, float))
        or not 0 < seconds * 1000 <= limits.allowance_cooldown_ms_max
    ):
        raise ApiError(
            "VALIDATION_FAILED", f"seconds must be a number above 0, at most {limits.allowance_cooldown_ms_max // 1000}"
        )
    args = {
        "allowance_id": request.match_info["allowanceId"],
        "cooldown_ms": min(max(math.ceil(seconds * 1000), 1), limits.allowance_cooldown_ms_max),
        "reason": req.text(body, "reason", max_chars=limits.allowance_reason_chars_max),
    }
    result = await req.propose(request, "allowance.cooldown", args)
    return json_response({"cooldownUntil": iso(result["cooldown_until_ms"]), "reason": result["reason"]})


@routes(
    "POST", SPACE_PREFIX + "/allowance-consumptions/{consumptionId}/settle",
    "Settle a consumption with the units it really used: the unused part goes back to its window, an overrun is "
    "taken now (even past the limit); once (the same units again answer the same, others are CONFLICT)",
    body={"units": {"type": "integer", "minimum": 0, "maximum": limits.limit_units_max}}, required=("units",),
    errors=("VALIDATION_FAILED", "NOT_FOUND", "CONFLICT"), permission=WRITE, answer=_SETTLED,
)
async def settle(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    units = req.integer(body, "units", minimum=0, maximum=limits.limit_units_max)
    if units is None:
        raise ApiError("VALIDATION_FAILED", "units is required")
    args = {"consumption_id": request.match_info["consumptionId"], "units": units}
    result = await req.propose(request, "allowance_consumption.settle", args)
    return json_response({
        "consumptionId": result["consumption_id"], "estimatedUnits": result["units"], "units": result["settled_units"],
        "returnedUnits": result["returned_units"], "overrunUnits": result["overrun_units"],
    })


# -- waiters ---------------------------------------------------------------------------------------


@routes(
    "GET", SPACE_PREFIX + "/allowance-waiters/{waiterId}",
    "An allowance waiter: WAITING, GRANTED (with its consumptionId), CANCELLED or EXPIRED",
    errors=("NOT_FOUND",), permission=READ, answer=_WAITER,
)
async def get_waiter(request: web.Request) -> web.Response:
    node, caller = node_of(request), caller_of(request)
    await node.confirm_leadership(caller)
    waiter_id = request.match_info["waiterId"]
    with node.read() as state:
        view = allowances.waiter_view(state, caller.space, waiter_id)
    if view is None:
        raise ApiError("NOT_FOUND", f"allowance waiter {waiter_id!r} not found")
    return json_response({**view, "expiresAt": iso(view["expiresAt"])})


@routes(
    "POST", SPACE_PREFIX + "/allowance-waiters/{waiterId}/cancel",
    "Leave the line (best effort: a waiter granted already stays GRANTED, with its consumptionId)",
    errors=("NOT_FOUND",), permission=WRITE, answer=_WAITER_STATE,
)
async def cancel_waiter(request: web.Request) -> web.Response:
    await req.json_body(request, required=False)
    waiter_id = request.match_info["waiterId"]
    result = await req.propose(request, "allowance_waiter.cancel", {"waiter_id": waiter_id})
    return json_response({"waiterId": waiter_id, "state": result["state"], "consumptionId": result["consumption_id"]})
