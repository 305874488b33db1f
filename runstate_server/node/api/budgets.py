"""Budgets on the published protocol (actors/budgets.py, PROTOCOL.md §5.9): create, declare, list
and read them by id; reserve an amount under a run until its settleBy, settle it (partially, once
per workKey) and void what is left.

Money travels as minor units: `limitMinor`, `amountMinor`, `reservedMinor`... are decimal-digit
strings (an integer is accepted too) of the budget's minor units, answered as strings. A budget
is a budget of resources.py; jobs whose requirements name it reserve with their admission.
`PATCH /budgets/{id}` changes a limit.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from runstate_server.actors import budgets, limits
from runstate_server.actors.resources import BUDGET
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
    MINOR,
    MINOR_DIGITS_MAX,
    MINOR_POSITIVE,
    NAME,
    STRING_OR_NULL,
    TIME,
    array,
    enum,
    obj,
    text,
)
from runstate_server.node.api.views import iso
from runstate_server.node.errors import ApiError

routes = RouteTable()

_INACTIVE = ("SCOPE_CANCELLED", "DEADLINE_EXCEEDED")
_WORK_KEY = text(limits.budget_work_key_chars_max)
_MINOR_OUT = {"type": "string", "pattern": "^[0-9]+$"}
_STATES = enum("ACTIVE", "STALE", "SETTLED", "VOIDED")
_SCALE = {"type": "integer", "minimum": 0, "maximum": limits.budget_scale_max}
_CURRENCY = {"type": "string", "pattern": "^[A-Z]{3}$"}
_ROW = {"id": STRING, "name": STRING, "currency": STRING, "scale": INTEGER, "limitMinor": _MINOR_OUT}
ROW = obj(_ROW)
VIEW = obj({
    **_ROW, "reservedMinor": _MINOR_OUT, "settledMinor": _MINOR_OUT, "remainingMinor": _MINOR_OUT,
    "waiting": INTEGER,
    "reservations": array(obj({
        "id": STRING, "scopeId": STRING, "holder": STRING_OR_NULL, "taskId": STRING_OR_NULL,
        "reservedMinor": _MINOR_OUT, "settledMinor": _MINOR_OUT, "state": _STATES, "settleBy": TIME,
    })),
})
_DECLARED = obj({**_ROW, "created": BOOLEAN})
_RESERVED = obj({"reservationId": STRING, "reservedMinor": _MINOR_OUT, "state": _STATES, "settleBy": TIME})
_SETTLED = obj({
    "reservationId": STRING, "state": _STATES, "chargedMinor": _MINOR_OUT, "settledMinor": _MINOR_OUT,
    "reservedMinor": _MINOR_OUT,
})


def minor(body: dict[str, Any], field: str, *, minimum: int, required: bool = False) -> int | None:
    """A minor amount of the body: a decimal-digit string or an integer, `minimum` to the limit."""
    value = body.get(field)
    if value is None:
        if required:
            raise ApiError("VALIDATION_FAILED", f"{field} is required")
        return None
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= MINOR_DIGITS_MAX:
        value = int(value)
    value = req.whole_number(value)
    if value is None or not minimum <= value <= limits.budget_limit_minor_max:
        raise ApiError(
            "VALIDATION_FAILED",
            f"{field} must be a decimal-digit string of minor units from {minimum} to {limits.budget_limit_minor_max}",
        )
    return value


def _sizes(body: dict[str, Any]) -> dict[str, Any]:
    """A declaration's limit, scale and currency, as the core takes them (absent: the defaults)."""
    sizes: dict[str, Any] = {"limit_minor": minor(body, "limitMinor", minimum=1, required=True)}
    if body.get("scale") is not None:
        sizes["scale"] = req.integer(body, "scale", minimum=0, maximum=limits.budget_scale_max)
    if body.get("currency") is not None:
        sizes["currency"] = req.text(body, "currency", max_chars=3)
    return sizes


def render(request: web.Request, budget_id: str) -> dict[str, Any]:
    """The budget's view (settleBy as ISO strings); NOT_FOUND when the space has none of that id."""
    with node_of(request).read() as state:
        budget = budgets.find(state, caller_of(request).space, budget_id)
        if budget is None:
            raise ApiError("NOT_FOUND", f"budget {budget_id!r} not found")
        view = budgets.view(state, budget)
    view["reservations"] = [{**row, "settleBy": iso(row["settleBy"])} for row in view["reservations"]]
    return view


def _row(request: web.Request, budget_id: str) -> dict[str, Any]:
    view = render(request, budget_id)
    return {field: view[field] for field in _ROW}


@routes(
    "POST", SPACE_PREFIX + "/budgets",
    "Create a budget: a limit in minor units of a currency at a scale; CONFLICT when the name is taken",
    body={"name": NAME, "currency": _CURRENCY, "scale": _SCALE, "limitMinor": MINOR_POSITIVE}, required=("name", "limitMinor"),
    ok=201, errors=("VALIDATION_FAILED", "CONFLICT", "LIMIT_EXCEEDED"), permission=RESOURCE_CONFIG, answer=ROW,
)
async def create(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    args = {"name": resource_name(req.text(body, "name", max_chars=limits.name_chars_max, required=True)), **_sizes(body)}
    result = await req.propose(request, "budget.create", args)
    return json_response(_row(request, result["budget_id"]), status=201)


@routes(
    "GET", SPACE_PREFIX + "/budgets", "The space's budgets, oldest first", permission=READ,
    answer=obj({"budgets": array(ROW)}),
)
async def list_budgets(request: web.Request) -> web.Response:
    return await listed(request, "budgets", budgets.rows)


@routes(
    "PUT", SPACE_PREFIX + "/budgets/by-name/{name}",
    "Declare the budget of that name with limitMinor (currency USD and scale 2 unless given): created, or found "
    "when its limit, scale and currency are the same (CONFLICT when one differs); with {} look it up (NOT_FOUND). "
    "A look-up needs read, a declaration resource_config",
    body={"limitMinor": MINOR_POSITIVE, "currency": _CURRENCY, "scale": _SCALE},
    dependent={"currency": ("limitMinor",), "scale": ("limitMinor",)},
    errors=("VALIDATION_FAILED", "FORBIDDEN", "NOT_FOUND", "CONFLICT", "LIMIT_EXCEEDED"), permission=READ,
    answer=_DECLARED,
)
async def declare(request: web.Request) -> web.Response:
    caller = caller_of(request)
    body = await req.json_body(request, required=False)
    name = resource_name(request.match_info["name"])
    req.refuse_nulls(body, "limitMinor", "currency", "scale", absent_means="with {} the call looks the budget up")
    if body.get("limitMinor") is None:  # a look-up
        if body.get("scale") is not None or body.get("currency") is not None:
            raise ApiError("VALIDATION_FAILED", "currency and scale are declared with limitMinor")
        return await look_up(request, BUDGET, name, "budget", _row)
    require_permission(caller, RESOURCE_CONFIG)
    result = await req.propose(request, "budget.declare", {"name": name, **_sizes(body)})
    return json_response({**_row(request, result["budget_id"]), "created": result["created"]})


@routes(
    "GET", SPACE_PREFIX + "/budgets/{budgetId}",
    "A budget: its limit, what is settled, reserved and remaining (minor units), and its open reservations",
    errors=("NOT_FOUND",), permission=READ, answer=VIEW,
)
async def get(request: web.Request) -> web.Response:
    node, caller = node_of(request), caller_of(request)
    await node.confirm_leadership(caller)
    return json_response(render(request, request.match_info["budgetId"]))


@routes(
    "PATCH", SPACE_PREFIX + "/budgets/{budgetId}",
    "Set a budget's limit to limitMinor, in its own minor units (an extension: a declaration never changes one). "
    "A limit below what is settled and reserved grants nothing new",
    body={"limitMinor": MINOR_POSITIVE}, required=("limitMinor",), errors=("VALIDATION_FAILED", "NOT_FOUND"),
    permission=RESOURCE_CONFIG, answer=ROW,
)
async def resize(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    limit_minor = minor(body, "limitMinor", minimum=1, required=True)
    return await resized(request, BUDGET, "budgetId", {"limit_minor": limit_minor}, _row)


@routes(
    "POST", SPACE_PREFIX + "/budgets/{budgetId}/reserve",
    "Hold amountMinor of the budget under a run until settleBy (default now + 1 h); INSUFFICIENT_BUDGET when "
    "less is left. Past its settleBy a reservation is STALE: still held, still settled or voided",
    body={"scopeId": NAME, "holder": HOLDER, "amountMinor": MINOR_POSITIVE, "settleBy": TIME},
    required=("scopeId", "amountMinor"),
    ok=201, errors=("VALIDATION_FAILED", "NOT_FOUND", "INSUFFICIENT_BUDGET", "LIMIT_EXCEEDED", *_INACTIVE),
    permission=WRITE, answer=_RESERVED,
)
async def reserve(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    args = {
        "budget_id": request.match_info["budgetId"],
        "run_id": req.text(body, "scopeId", max_chars=limits.name_chars_max, required=True),
        "holder": holder_of(request, body),
        "amount_minor": minor(body, "amountMinor", minimum=1, required=True),
        "settle_by_ms": req.timestamp_ms(body, "settleBy"),
    }
    result = await req.propose(request, "budget_reservation.reserve", args)
    return json_response(
        {"reservationId": result["reservation_id"], "reservedMinor": str(result["reserved_minor"]),
         "state": result["state"], "settleBy": iso(result["settle_by_ms"])},
        status=201,
    )


def _settled(result: dict[str, Any]) -> dict[str, Any]:
    return {
        "reservationId": result["reservation_id"], "state": result["state"],
        "chargedMinor": str(result["charged_minor"]), "settledMinor": str(result["settled_minor"]),
        "reservedMinor": str(result["reserved_minor"]),
    }


def _reservation_args(request: web.Request, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "budget_id": request.match_info["budgetId"],
        "reservation_id": req.text(body, "reservationId", max_chars=limits.name_chars_max, required=True),
        "work_key": req.text(body, "workKey", max_chars=limits.budget_work_key_chars_max, required=True),
    }


@routes(
    "POST", SPACE_PREFIX + "/budgets/{budgetId}/settle",
    "Charge amountMinor against the reservation, once per workKey (the same workKey again charges nothing more "
    "and answers its charge again; with another amount CONFLICT); ACTIVE while part of it is still held. More than it holds: INSUFFICIENT_BUDGET, "
    "or with allowOverrun charged up to what the budget can still cover. An ended reservation: CONFLICT",
    body={"reservationId": NAME, "amountMinor": MINOR, "workKey": _WORK_KEY, "allowOverrun": BOOLEAN},
    required=("reservationId", "amountMinor", "workKey"),
    errors=("VALIDATION_FAILED", "NOT_FOUND", "CONFLICT", "INSUFFICIENT_BUDGET", "LIMIT_EXCEEDED"),
    permission=WRITE, answer=_SETTLED,
)
async def settle(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    args = {
        **_reservation_args(request, body),
        "amount_minor": minor(body, "amountMinor", minimum=0, required=True),
        "allow_overrun": req.flag(body, "allowOverrun"),
    }
    return json_response(_settled(await req.propose(request, "budget_reservation.settle", args)))


@routes(
    "POST", SPACE_PREFIX + "/budgets/{budgetId}/void",
    "Release what the reservation still holds: VOIDED, or SETTLED when something of it was charged; the same "
    "workKey again answers the same; an ended reservation: CONFLICT",
    body={"reservationId": NAME, "workKey": _WORK_KEY}, required=("reservationId", "workKey"),
    errors=("VALIDATION_FAILED", "NOT_FOUND", "CONFLICT"), permission=WRITE, answer=_SETTLED,
)
async def void(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    return json_response(_settled(await req.propose(request, "budget_reservation.void", _reservation_args(request, body))))
