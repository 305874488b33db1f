"""Permits, the published protocol's slot pools (actors/permits.py): create, declare and read them
by id, and acquire grants of units under a lease, renewed and released with their token.

A permit is a pool of resources.py (its `size` is `unitsTotal`); jobs whose requirements name it
take grants of it with their delivery. `PATCH /permits/{id}` resizes one. Every answer of a write is rendered from the result its core
command returned; the views are read under the node's read lock after leadership is confirmed.
"""

from __future__ import annotations

import secrets
from typing import Any

from aiohttp import web

from runstate_server.actors import limits, permits
from runstate_server.actors.resources import POOL
from runstate_server.node._json import json_response
from runstate_server.node.api import _request as req
from runstate_server.node.api._named import listed, look_up, resized, resource_name
from runstate_server.node.api.messages import TOKEN_NONCE_BYTES
from runstate_server.node.api.routes import (
    ANY_JSON,
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
    KEY,
    NAME,
    STRING_OR_NULL,
    TIME,
    TIME_OR_NULL,
    array,
    obj,
)
from runstate_server.node.api.views import iso
from runstate_server.node.errors import ApiError

routes = RouteTable()

_INACTIVE = ("SCOPE_CANCELLED", "DEADLINE_EXCEEDED")
_UNITS = {"type": "integer", "minimum": 1, "maximum": limits.pool_size_max}
_ROW = {"id": STRING, "name": STRING, "unitsTotal": INTEGER, "unitsInUse": INTEGER, "waiting": INTEGER}
ROW = obj(_ROW)
VIEW = obj({
    **_ROW,
    "grants": array(obj({
        "grantId": STRING, "units": INTEGER, "holder": STRING_OR_NULL, "scopeId": STRING, "taskId": STRING_OR_NULL,
        "leaseExpiresAt": TIME,
    })),
    "waiters": array(obj({
        "waiterId": STRING, "units": INTEGER, "holder": STRING_OR_NULL, "scopeId": STRING, "state": STRING,
    })),
})
_DECLARED = obj({**_ROW, "created": BOOLEAN})
_WAITER_STATES = {"type": "string", "enum": ["WAITING", "SIGNALED", "GRANTED", "CANCELLED", "EXPIRED"]}
_WAITER = obj({
    "waiterId": STRING, "permitId": STRING, "scopeId": STRING, "units": INTEGER, "holder": STRING_OR_NULL,
    "state": _WAITER_STATES, "position": INTEGER_OR_NULL, "expiresAt": TIME_OR_NULL,
})
_WAITER_STATE = obj({"waiterId": STRING, "state": _WAITER_STATES})  # what a wait or a cancel answers
_TTL_SECONDS = {"type": "number", "minimum": limits.lease_ms_min / 1000, "maximum": limits.permit_waiter_ttl_ms_max / 1000}
_GRANT = obj({"grantId": STRING, "token": STRING, "units": INTEGER, "leaseExpiresAt": TIME})


def _render(request: web.Request, permit_id: str) -> dict[str, Any]:
    """The permit's view (times as ISO strings); NOT_FOUND when the space has none of that id."""
    with node_of(request).read() as state:
        pool = permits.find(state, caller_of(request).space, permit_id)
        if pool is None:
            raise ApiError("NOT_FOUND", f"permit {permit_id!r} not found")
        view = permits.view(state, pool)
    view["grants"] = [{**grant, "leaseExpiresAt": iso(grant["leaseExpiresAt"])} for grant in view["grants"]]
    return view


def _row(request: web.Request, permit_id: str) -> dict[str, Any]:
    view = _render(request, permit_id)
    return {field: view[field] for field in ("id", "name", "unitsTotal", "unitsInUse", "waiting")}


@routes(
    "POST", SPACE_PREFIX + "/permits", "Create a permit (a pool of units); CONFLICT when the name is taken",
    body={"name": NAME, "units": _UNITS}, required=("name", "units"),
    ok=201, errors=("VALIDATION_FAILED", "CONFLICT", "LIMIT_EXCEEDED"), permission=RESOURCE_CONFIG, answer=ROW,
)
async def create(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    args = {
        "name": resource_name(req.text(body, "name", max_chars=limits.name_chars_max, required=True)),
        "units": req.integer(body, "units", minimum=1, maximum=limits.pool_size_max),
    }
    if args["units"] is None:
        raise ApiError("VALIDATION_FAILED", "units is required")
    result = await req.propose(request, "permit.create", args)
    return json_response(_row(request, result["permit_id"]), status=201)


@routes(
    "GET", SPACE_PREFIX + "/permits", "The space's permits, oldest first", permission=READ,
    answer=obj({"permits": array(ROW)}),
)
async def list_permits(request: web.Request) -> web.Response:
    return await listed(request, "permits", permits.rows)


@routes(
    "PUT", SPACE_PREFIX + "/permits/by-name/{name}",
    "Declare the permit of that name with units (created, or found when its size is the same; CONFLICT when it "
    "differs), or with {} look it up (NOT_FOUND when none). A look-up needs read, a declaration resource_config",
    body={"units": _UNITS},
    errors=("VALIDATION_FAILED", "FORBIDDEN", "NOT_FOUND", "CONFLICT", "LIMIT_EXCEEDED"), permission=READ,
    answer=_DECLARED,
)
async def declare(request: web.Request) -> web.Response:
    caller = caller_of(request)
    body = await req.json_body(request, required=False)
    name = resource_name(request.match_info["name"])
    req.refuse_nulls(body, "units", absent_means="with {} the call looks the permit up")
    units = req.integer(body, "units", minimum=1, maximum=limits.pool_size_max)
    if units is None:  # a look-up
        return await look_up(request, POOL, name, "permit", _row)
    require_permission(caller, RESOURCE_CONFIG)
    result = await req.propose(request, "permit.declare", {"name": name, "units": units})
    return json_response({**_row(request, result["permit_id"]), "created": result["created"]})


@routes(
    "PATCH", SPACE_PREFIX + "/permits/{permitId}",
    "Resize a permit to units (an extension: a declaration never changes one). Fewer units than are in use "
    "grant nothing new until enough return; more wake its waiters",
    body={"units": _UNITS}, required=("units",), errors=("VALIDATION_FAILED", "NOT_FOUND"), permission=RESOURCE_CONFIG,
    answer=ROW,
)
async def resize(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    units = req.integer(body, "units", minimum=1, maximum=limits.pool_size_max)
    if units is None:
        raise ApiError("VALIDATION_FAILED", "units is required")
    return await resized(request, POOL, "permitId", {"size": units}, _row)


@routes(
    "GET", SPACE_PREFIX + "/permits/{permitId}", "A permit: its units, those in use, its grants and waiters",
    errors=("NOT_FOUND",), permission=READ, answer=VIEW,
)
async def get(request: web.Request) -> web.Response:
    node, caller = node_of(request), caller_of(request)
    await node.confirm_leadership(caller)
    return json_response(_render(request, request.match_info["permitId"]))


@routes(
    "POST", SPACE_PREFIX + "/permits/{permitId}/acquire",
    "Acquire units of the permit under a lease: a grant and its token; CAPACITY_UNAVAILABLE (with Retry-After) "
    "when they are not free now",
    body={"scopeId": NAME, "units": _UNITS, "holder": HOLDER, "holderSession": NAME,
          "leaseSeconds": req.LEASE_SECONDS, "waiterId": NAME},
    required=("scopeId",),
    ok=201, errors=("VALIDATION_FAILED", "NOT_FOUND", "CAPACITY_UNAVAILABLE", *_INACTIVE), permission=WRITE, answer=_GRANT,
)
async def acquire(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    units = req.integer(body, "units", minimum=1, maximum=limits.pool_size_max, default=1)
    args = {
        "permit_id": request.match_info["permitId"],
        "run_id": req.text(body, "scopeId", max_chars=limits.name_chars_max, required=True),
        "units": units,
        "lease_ms": req.lease_seconds_ms(body),
        "holder": holder_of(request, body),
        "holder_session": req.holder_session(body),
        "nonce": secrets.token_hex(TOKEN_NONCE_BYTES),
    }
    waiter_id = req.text(body, "waiterId", max_chars=limits.name_chars_max)
    if waiter_id is not None:  # the units of a SIGNALED waiter, set aside for it
        args["waiter_id"] = waiter_id
    result = await req.propose(request, "permit.acquire", args)
    if not result["granted"]:
        raise ApiError("CAPACITY_UNAVAILABLE", f"permit {args['permit_id']} has not {units} units free now")
    return json_response(
        {"grantId": result["grant_id"], "token": result["token"], "units": result["units"],
         "leaseExpiresAt": iso(result["lease_expires_ms"])},
        status=201,
    )


def _grant_args(request: web.Request, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "grant_id": request.match_info["grantId"],
        "token": req.text(body, "token", max_chars=limits.key_chars_max, required=True),
    }


@routes(
    "POST", SPACE_PREFIX + "/grants/{grantId}/renew",
    "Extend the grant's lease from now (by leaseSeconds, else its last length); STALE_CLAIM for a token that is "
    "not the grant's",
    body={"token": KEY, "leaseSeconds": req.LEASE_SECONDS}, required=("token",),
    errors=("VALIDATION_FAILED", "STALE_CLAIM", *_INACTIVE), permission=WRITE, answer=obj({"leaseExpiresAt": TIME}),
)
async def renew(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    args = {**_grant_args(request, body), "lease_ms": req.optional_lease_seconds_ms(body)}
    result = await req.propose(request, "permit.renew", args)
    return json_response({"leaseExpiresAt": iso(result["lease_expires_ms"])})


@routes(
    "POST", SPACE_PREFIX + "/grants/{grantId}/release",
    "Give the grant's units back; STALE_CLAIM for a token that is not the grant's (released, lapsed)",
    body={"token": KEY, "observation": ANY_JSON}, required=("token",),
    errors=("VALIDATION_FAILED", "STALE_CLAIM"), permission=WRITE, answer=obj({"released": BOOLEAN}),
)
async def release(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    # The observation of a [0.2] client is accepted and bounded, not kept: nothing reads it back.
    _, encoded = req.payload(body, "observation", code="VALIDATION_FAILED", required=False)
    if len(encoded) > limits.observation_bytes_max:
        raise ApiError("VALIDATION_FAILED", f"observation exceeds {limits.observation_bytes_max} bytes")
    result = await req.propose(request, "permit.release", _grant_args(request, body))
    return json_response({"released": result["released"]})


# -- waiters ---------------------------------------------------------------------------------------


def _waiter_answer(request: web.Request, waiter_id: str) -> dict[str, Any]:
    with node_of(request).read() as state:
        view = permits.waiter_view(state, caller_of(request).space, waiter_id)
    if view is None:
        raise ApiError("NOT_FOUND", f"permit waiter {waiter_id!r} not found")
    return {**view, "expiresAt": None if view["expiresAt"] is None else iso(view["expiresAt"])}


@routes(
    "POST", SPACE_PREFIX + "/permits/{permitId}/wait",
    "Join the permit's FIFO line for units: a waiter, SIGNALED when its turn comes (then acquire with its waiterId)",
    body={"scopeId": NAME, "units": _UNITS, "holder": HOLDER, "ttlSeconds": _TTL_SECONDS}, required=("scopeId",),
    ok=201, errors=("VALIDATION_FAILED", "NOT_FOUND", "LIMIT_EXCEEDED", *_INACTIVE), permission=WRITE,
    answer=_WAITER_STATE,
)
async def wait(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    ttl_s = body.get("ttlSeconds")
    if ttl_s is not None and (
        isinstance(ttl_s, bool) or not isinstance(ttl_s, (int, float))
        or not limits.lease_ms_min <= ttl_s * 1000 <= limits.permit_waiter_ttl_ms_max
    ):
        raise ApiError(
            "VALIDATION_FAILED",
            f"ttlSeconds must be a number from {limits.lease_ms_min / 1000} to {limits.permit_waiter_ttl_ms_max // 1000}",
        )
    args = {
        "permit_id": request.match_info["permitId"],
        "run_id": req.text(body, "scopeId", max_chars=limits.name_chars_max, required=True),
        "units": req.integer(body, "units", minimum=1, maximum=limits.pool_size_max, default=1),
        "holder": holder_of(request, body),
        "ttl_ms": None if ttl_s is None else round(ttl_s * 1000),
    }
    result = await req.propose(request, "permit.wait", args)
    return json_response({"waiterId": result["waiter_id"], "state": result["state"]}, status=201)


@routes(
    "GET", SPACE_PREFIX + "/permit-waiters/{waiterId}",
    "A permit waiter: WAITING, SIGNALED (acquire now with its waiterId), GRANTED, CANCELLED or EXPIRED",
    errors=("NOT_FOUND",), permission=READ, answer=_WAITER,
)
async def get_waiter(request: web.Request) -> web.Response:
    node, caller = node_of(request), caller_of(request)
    await node.confirm_leadership(caller)
    return json_response(_waiter_answer(request, request.match_info["waiterId"]))


@routes(
    "POST", SPACE_PREFIX + "/permit-waiters/{waiterId}/cancel",
    "Leave the line (units set aside for it return); a waiter that ended keeps its state",
    errors=("NOT_FOUND",), permission=WRITE, answer=_WAITER_STATE,
)
async def cancel_waiter(request: web.Request) -> web.Response:
    await req.json_body(request, required=False)
    waiter_id = request.match_info["waiterId"]
    result = await req.propose(request, "permit_waiter.cancel", {"waiter_id": waiter_id})
    return json_response({"waiterId": waiter_id, "state": result["state"]})
