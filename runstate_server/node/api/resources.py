"""Resources of a space: pools of slots, rate limits and spend budgets. Configure and read them,
and use them directly under a run: acquire a slot, take rate-limit units, reserve and settle an
amount of a budget. (Jobs that need resources take them with their delivery: tasks.py.)"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from runstate_server.actors import limits, resources
from runstate_server.actors.context import resource_key
from runstate_server.actors.resources import BUDGET, LIMIT, POOL
from runstate_server.actors.state import State
from runstate_server.node.api import _request as req
from runstate_server.node.api import budgets
from runstate_server.node.api._poll import body_wait_ms, client_gone, park, wait
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
)
from runstate_server.node.api.schemas import (
    BOOLEAN,
    INTEGER,
    NUMBER,
    STRING_OR_NULL,
    TIME,
    TIME_OR_NULL,
    array,
    obj,
)
from runstate_server.node.api.schemas import STRING as _STRING
from runstate_server.node.api.views import iso
from runstate_server.node.config import LONG_POLL_MS_MAX
from runstate_server.node.errors import ApiError

_HOLDER = {"holder": STRING_OR_NULL, "scopeId": _STRING, "taskId": STRING_OR_NULL, "leaseExpiresAt": TIME}
POOL_VIEW = obj({
    "name": _STRING, "size": INTEGER, "inUse": INTEGER, "waiting": INTEGER,
    "holders": array(obj({"leaseId": _STRING, **_HOLDER})),
})
LIMIT_VIEW = obj({
    "name": _STRING, "units": INTEGER, "intervalMs": INTEGER, "available": INTEGER, "takenInWindow": INTEGER,
    "waiting": INTEGER,
})
BUDGET_VIEW = obj({
    "name": _STRING, "total": NUMBER, "spent": NUMBER, "reserved": NUMBER, "remaining": NUMBER, "waiting": INTEGER,
    "reservations": array(obj({"reservationId": _STRING, "amount": NUMBER, **_HOLDER})),
})

routes = RouteTable()

if TYPE_CHECKING:
    from runstate_server.node.server import Node

_INACTIVE = ("SCOPE_CANCELLED", "DEADLINE_EXCEEDED")
_LEASE_MS = {"type": "integer", "minimum": limits.lease_ms_min, "maximum": limits.lease_ms_max}
_WAIT_MS = {"type": "integer", "minimum": 0, "maximum": LONG_POLL_MS_MAX}
_AMOUNT = {"type": "number", "minimum": 0, "maximum": req.AMOUNT_MAX}
_RESERVE = {"type": "number", "exclusiveMinimum": 0, "maximum": req.AMOUNT_MAX}
# A blocked take retries when its units are due; never sooner than this after the last try, so a
# leader clock a little ahead of this one does not make it spin.
TAKE_RETRY_MS_MIN = 5

_HOLD_NAMES = {POOL: "slot lease", BUDGET: "reservation"}
_HOLD_PARAMETERS = {POOL: "lease", BUDGET: "id"}  # the path parameter that names the hold
_HOLD_ARGS = {POOL: "lease_id", BUDGET: "reservation_id"}  # and the command's argument

# A rate limit's interval as text: a count and a unit ("1s", "500ms", "1m", "1h").
_PER = re.compile(r"^([1-9][0-9]{0,9})(ms|s|m|h)$")
_UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000}


# -- views -----------------------------------------------------------------------------------------


def _view(state: State, space: str, kind: str, name: str) -> dict[str, Any] | None:
    if kind == POOL:
        view = resources.pool_view(state, space, name)
        holds = "holders"
    elif kind == LIMIT:
        # Available now: by this clock, or the state's if a leader's clock ran ahead of it.
        return resources.limit_view(state, space, name, max(int(time.time() * 1000), state.clock_ms))
    else:
        view = resources.budget_view(state, space, name)
        holds = "reservations"
    if view is not None:  # the core's times are ms
        view[holds] = [{**hold, "leaseExpiresAt": iso(hold["leaseExpiresAt"])} for hold in view[holds]]
    return view


def _render(node: Node, space: str, kind: str, name: str) -> dict[str, Any]:
    """The resource's view; NOT_FOUND when the space has no such resource."""
    with node.read() as state:
        view = _view(state, space, kind, name)
    if view is None:
        raise ApiError("NOT_FOUND", f"{kind} {name!r} not found")
    return view


async def _status(request: web.Request, kind: str) -> web.Response:
    node, caller = node_of(request), caller_of(request)
    await node.confirm_leadership(caller)
    return web.json_response(_render(node, caller.space, kind, request.match_info["name"]))


async def _ensure(request: web.Request, kind: str, args: dict[str, Any]) -> web.Response:
    node, caller = node_of(request), caller_of(request)
    args["name"] = _name(request)
    result = await req.propose(request, f"{kind}.ensure", args)
    return web.json_response({**_render(node, caller.space, kind, args["name"]), "created": result["created"]})


def _name(request: web.Request) -> str:
    name = request.match_info["name"]
    if not 0 < len(name) <= limits.name_chars_max:
        raise ApiError("VALIDATION_FAILED", f"name must be 1 to {limits.name_chars_max} characters")
    return name


# -- configuration ---------------------------------------------------------------------------------


@routes(
    "PUT", SPACE_PREFIX + "/pools/{name}", "Create a pool of size slots, or resize it (idempotent)",
    body={"size": {"type": "integer", "minimum": 1, "maximum": limits.pool_size_max}},
    errors=("VALIDATION_FAILED", "LIMIT_EXCEEDED"), permission=RESOURCE_CONFIG, answer=obj({**POOL_VIEW["properties"], "created": BOOLEAN}),
)
async def ensure_pool(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    size = req.integer(body, "size", minimum=1, maximum=limits.pool_size_max)
    if size is None:
        raise ApiError("VALIDATION_FAILED", "size is required")
    return await _ensure(request, POOL, {"size": size})


@routes("GET", SPACE_PREFIX + "/pools/{name}", "A pool: its size, holders and waiting jobs", errors=("NOT_FOUND",), permission=READ, answer=POOL_VIEW,)
async def pool_status(request: web.Request) -> web.Response:
    return await _status(request, POOL)


@routes(
    "PUT", SPACE_PREFIX + "/limits/{name}", "Create a rate limit of units per interval, or change it (idempotent)",
    body={
        "units": {"type": "integer", "minimum": 1, "maximum": limits.limit_units_max},
        "per": {"type": "string", "pattern": _PER.pattern},
        "intervalMs": {"type": "integer", "minimum": limits.limit_interval_ms_min,
                       "maximum": limits.limit_interval_ms_max},
    },
    errors=("VALIDATION_FAILED", "LIMIT_EXCEEDED"), permission=RESOURCE_CONFIG, answer=obj({**LIMIT_VIEW["properties"], "created": BOOLEAN}),
)
async def ensure_limit(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    units = req.integer(body, "units", minimum=1, maximum=limits.limit_units_max)
    if units is None:
        raise ApiError("VALIDATION_FAILED", "units is required")
    return await _ensure(request, LIMIT, {"units": units, "interval_ms": _interval_ms(body)})


def _interval_ms(body: dict[str, Any]) -> int:
    """The interval of a rate limit: `per` ("1s", "500ms", "1m", "1h") or `intervalMs`, exactly one."""
    per, interval_ms = body.get("per"), body.get("intervalMs")
    if (per is None) == (interval_ms is None):
        raise ApiError("VALIDATION_FAILED", "give the interval as exactly one of per (\"1s\", \"500ms\", \"1m\") and intervalMs")
    if per is not None:
        match = _PER.match(per) if isinstance(per, str) else None
        if match is None:
            raise ApiError("VALIDATION_FAILED", "per must be a count and a unit (ms, s, m or h), such as \"1s\" or \"500ms\"")
        interval_ms = int(match.group(1)) * _UNIT_MS[match.group(2)]
        if not limits.limit_interval_ms_min <= interval_ms <= limits.limit_interval_ms_max:
            raise ApiError(
                "VALIDATION_FAILED",
                f"per must be from {limits.limit_interval_ms_min} ms to {limits.limit_interval_ms_max} ms",
            )
        return int(interval_ms)
    checked = req.integer(
        body, "intervalMs", minimum=limits.limit_interval_ms_min, maximum=limits.limit_interval_ms_max
    )
    assert checked is not None
    return checked


@routes("GET", SPACE_PREFIX + "/limits/{name}", "A rate limit: its units, interval and what is available now",
       errors=("NOT_FOUND",), permission=READ, answer=LIMIT_VIEW,
)
async def limit_status(request: web.Request) -> web.Response:
    return await _status(request, LIMIT)


@routes(
    "PUT", SPACE_PREFIX + "/budgets/{name}", "Create a spend budget of a total, or change the total (idempotent)",
    body={"total": _AMOUNT}, errors=("VALIDATION_FAILED", "LIMIT_EXCEEDED"), permission=RESOURCE_CONFIG, answer=obj({**BUDGET_VIEW["properties"], "created": BOOLEAN}),
)
async def ensure_budget(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    total = req.amount_micros(body, "total", required=True)
    return await _ensure(request, BUDGET, {"total_micros": total})


@routes("GET", SPACE_PREFIX + "/budgets/{name}",
       "A budget. By its id (\"bdg_...\"): the protocol's view in minor units (node/api/budgets.py); by its name: "
       "total, spent, reserved, remaining (decimals) and its leased reservations",
       errors=("NOT_FOUND",), permission=READ, answer={"anyOf": [BUDGET_VIEW, budgets.VIEW]},
)
async def budget_status(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name.startswith(resources.BUDGET_PREFIX):  # an id: no budget name starts with the prefix
        node, caller = node_of(request), caller_of(request)
        await node.confirm_leadership(caller)
        return web.json_response(budgets.render(request, name))
    return await _status(request, BUDGET)


# -- use under a run: the long polls ---------------------------------------------------------------


async def _until_granted(
    request: web.Request,
    kind: str,
    command: str,
    args: dict[str, Any],
    wait_ms: int,
    granted: str,
    retry_at_ms: Callable[[dict[str, Any]], int | None] = lambda result: None,
) -> dict[str, Any] | None:
    """Propose `command` until its result's `granted` field is true or `wait_ms` ran out; its last
    result (None when the client left and nothing is granted to it). The waiter on the resource is
    registered before each proposal, so a slot or an amount returned meanwhile wakes the wait;
    `retry_at_ms` is a time (the leader's ms) to try again at without a wake, as a rate-limit
    window opens."""
    caller = caller_of(request)
    key = resource_key(caller.space, kind, args["name"])
    deadline = time.monotonic() + wait_ms / 1000
    while True:
        with park(request, key) as waiter:
            if client_gone(request):
                return None
            result: dict[str, Any] = await req.propose(request, command, args)
            remaining_s = deadline - time.monotonic()
            if result[granted]:
                if client_gone(request) and kind in _HOLD_ARGS:
                    await _give_back(request, kind, result)
                    return None
                return result
            if remaining_s <= 0 or not waiter.parked:
                return result
            retry_at = retry_at_ms(result)
            if retry_at is not None:
                due_s = max(retry_at - time.time() * 1000, TAKE_RETRY_MS_MIN) / 1000
                remaining_s = min(remaining_s, due_s)
            await wait(request, waiter, remaining_s)


async def _give_back(request: web.Request, kind: str, result: dict[str, Any]) -> None:
    """The client left while its slot or reservation was granted: release it at once rather than
    leave it held until its lease lapses."""
    hold_arg = _HOLD_ARGS[kind]
    try:
        await node_of(request).propose(caller_of(request), f"{kind}.release", {hold_arg: result[hold_arg]})
    except ApiError:
        pass  # lapsed meanwhile: nothing left to give back


@routes(
    "POST", SPACE_PREFIX + "/scopes/{id}/pools/{name}/acquire",
    "Acquire a slot of the pool under a lease, waiting up to waitMs for one (granted=false after)",
    body={"leaseMs": _LEASE_MS, "waitMs": _WAIT_MS, "holder": STRING},
    errors=("VALIDATION_FAILED", "NOT_FOUND", *_INACTIVE), permission=WRITE, answer=obj({"granted": BOOLEAN, "leaseId": STRING_OR_NULL, "leaseExpiresAt": TIME_OR_NULL}),
)
async def acquire_slot(request: web.Request) -> web.Response:
    body = await req.json_body(request, required=False)
    args = {
        "name": _name(request),
        "run_id": request.match_info["id"],
        "lease_ms": req.lease_ms(body),
        "holder": holder_of(request, body),
    }
    result = await _until_granted(request, POOL, "pool.acquire", args, body_wait_ms(body), "granted")
    if result is None or not result["granted"]:
        return web.json_response({"granted": False, "leaseId": None, "leaseExpiresAt": None})
    return web.json_response(
        {"granted": True, "leaseId": result["lease_id"], "leaseExpiresAt": iso(result["lease_expires_ms"])}
    )


@routes(
    "POST", SPACE_PREFIX + "/scopes/{id}/limits/{name}/take",
    "Take units of the rate limit, waiting up to waitMs for them (taken=false after)",
    body={"units": {"type": "integer", "minimum": 1, "maximum": limits.limit_units_max}, "waitMs": _WAIT_MS},
    errors=("VALIDATION_FAILED", "NOT_FOUND", *_INACTIVE), permission=WRITE, answer=obj({"taken": BOOLEAN, "availableAt": TIME_OR_NULL}),
)
async def take(request: web.Request) -> web.Response:
    body = await req.json_body(request, required=False)
    args = {
        "name": _name(request),
        "run_id": request.match_info["id"],
        "units": req.integer(body, "units", minimum=1, maximum=limits.limit_units_max, default=1),
    }
    result = await _until_granted(
        request, LIMIT, "limit.take", args, body_wait_ms(body),
        granted="taken", retry_at_ms=lambda result: result["available_ms"],
    )
    if result is None:
        return web.json_response({"taken": False, "availableAt": None})
    return web.json_response({"taken": result["taken"], "availableAt": iso(result["available_ms"])})


@routes(
    "POST", SPACE_PREFIX + "/scopes/{id}/budgets/{name}/reserve",
    "Reserve an amount of the budget under a lease, waiting up to waitMs for it (granted=false after)",
    body={"amount": _RESERVE, "leaseMs": _LEASE_MS, "waitMs": _WAIT_MS, "holder": STRING},
    errors=("VALIDATION_FAILED", "NOT_FOUND", *_INACTIVE), permission=WRITE, answer=obj({"granted": BOOLEAN, "reservationId": STRING_OR_NULL, "amount": NUMBER, "leaseExpiresAt": TIME_OR_NULL}),
)
async def reserve(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    amount = req.amount_micros(body, "amount", required=True, positive=True)
    assert amount is not None
    args = {
        "name": _name(request),
        "run_id": request.match_info["id"],
        "amount_micros": amount,
        "lease_ms": req.lease_ms(body),
        "holder": holder_of(request, body),
    }
    result = await _until_granted(request, BUDGET, "budget.reserve", args, body_wait_ms(body), "granted")
    reserved = resources.from_micros(amount)
    if result is None or not result["granted"]:
        return web.json_response({"granted": False, "reservationId": None, "amount": reserved, "leaseExpiresAt": None})
    return web.json_response({
        "granted": True,
        "reservationId": result["reservation_id"],
        "amount": reserved,
        "leaseExpiresAt": iso(result["lease_expires_ms"]),
    })


# -- slot leases and reservations ------------------------------------------------------------------


async def _hold_command(request: web.Request, kind: str, action: str, args: dict[str, Any]) -> dict[str, Any]:
    """`<kind>.<action>` on the direct slot lease or reservation the path names. A hold is removed
    when it ends, so an id that is not held (ended, lapsed or never issued) answers STALE_CLAIM, or
    released false; a hold of another space answers exactly the same, so ids of other spaces
    cannot be told from ids that do not exist."""
    hold_id = request.match_info[_HOLD_PARAMETERS[kind]]
    command = {_HOLD_ARGS[kind]: hold_id, **args}
    try:
        result: dict[str, Any] = await req.propose(request, f"{kind}.{action}", command)
    except ApiError as error:
        if error.code != "NOT_FOUND":
            raise
        if action == "release":
            return {"released": False}
        raise ApiError("STALE_CLAIM", f"{_HOLD_NAMES[kind]} {hold_id!r} is not held: it ended or lapsed") from None
    return result


async def _renew(request: web.Request, kind: str) -> web.Response:
    body = await req.json_body(request, required=False)
    result = await _hold_command(request, kind, "renew", {"lease_ms": req.lease_ms(body)})
    return web.json_response({"leaseExpiresAt": iso(result["lease_expires_ms"])})


async def _release(request: web.Request, kind: str) -> web.Response:
    await req.json_body(request, required=False)
    result = await _hold_command(request, kind, "release", {})
    return web.json_response({"released": result["released"]})


_RENEW_ERRORS = ("VALIDATION_FAILED", "STALE_CLAIM", "CONFLICT", *_INACTIVE)  # CONFLICT: a job's hold, ended by its delivery


@routes(
    "POST", SPACE_PREFIX + "/slots/{lease}/renew", "Extend a slot's lease", body={"leaseMs": _LEASE_MS},
    errors=_RENEW_ERRORS, permission=WRITE, answer=obj({"leaseExpiresAt": TIME}),
)
async def renew_slot(request: web.Request) -> web.Response:
    return await _renew(request, POOL)


@routes(
    "POST", SPACE_PREFIX + "/slots/{lease}/release", "Give the slot back (released=false when it was not held: lapsed, ended)",
    errors=("CONFLICT",), permission=WRITE, answer=obj({"released": BOOLEAN}),
)
async def release_slot(request: web.Request) -> web.Response:
    return await _release(request, POOL)


@routes(
    "POST", SPACE_PREFIX + "/reservations/{id}/renew", "Extend a reservation's lease", body={"leaseMs": _LEASE_MS},
    errors=_RENEW_ERRORS, permission=WRITE, answer=obj({"leaseExpiresAt": TIME}),
)
async def renew_reservation(request: web.Request) -> web.Response:
    return await _renew(request, BUDGET)


@routes(
    "POST", SPACE_PREFIX + "/reservations/{id}/settle",
    "Charge what was spent (over the reservation only up to what the budget has) and return the rest",
    body={"spent": _AMOUNT}, errors=("VALIDATION_FAILED", "STALE_CLAIM", "CONFLICT"), permission=WRITE, answer=obj({"charged": NUMBER, "returned": NUMBER}),
)
async def settle(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    spent = req.amount_micros(body, "spent", required=True)
    result = await _hold_command(request, BUDGET, "settle", {"spent_micros": spent})
    charged, returned = result["charged_micros"], result["returned_micros"]
    return web.json_response({"charged": resources.from_micros(charged), "returned": resources.from_micros(returned)})


@routes(
    "POST", SPACE_PREFIX + "/reservations/{id}/release",
    "Return the whole reservation, nothing spent (released=false when it was not held: lapsed, ended)",
    errors=("CONFLICT",), permission=WRITE, answer=obj({"released": BOOLEAN}),
)
async def release_reservation(request: web.Request) -> web.Response:
    return await _release(request, BUDGET)
