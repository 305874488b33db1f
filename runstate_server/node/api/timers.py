"""Durable timers: create, wait for the firing (and acknowledge it), cancel."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from runstate_server.actors import timers
from runstate_server.actors.timers import Timer
from runstate_server.node.api import _request as req
from runstate_server.node.api._poll import WAIT_MS_QUERY, long_poll
from runstate_server.node.api.routes import (
    ISO_TIME,
    READ,
    RESOURCE_CONFIG,
    SPACE_PREFIX,
    WRITE,
    RouteTable,
    caller_of,
    node_of,
)
from runstate_server.node.api.schemas import BOOLEAN, STRING, TIME, TIME_OR_NULL, obj
from runstate_server.node.api.views import in_space, iso
from runstate_server.node.errors import ApiError

TIMER = obj({"id": STRING, "scopeId": STRING, "state": STRING, "fireAt": TIME, "firedAt": TIME_OR_NULL, "createdAt": TIME})

routes = RouteTable()

if TYPE_CHECKING:
    from runstate_server.node.server import Node

_INACTIVE = ("SCOPE_CANCELLED", "DEADLINE_EXCEEDED")
AFTER_SECONDS_MAX = 365 * 24 * 3600


def timer_view(timer: Timer) -> dict[str, Any]:
    return {
        "id": timer.id,
        "scopeId": timer.run_id,
        "state": timer.state,
        "fireAt": iso(timer.fire_at_ms),
        "firedAt": iso(timer.fired_ms),
        "createdAt": iso(timer.created_ms),
    }


def _render(node: Node, space: str, timer_id: str) -> dict[str, Any]:
    with node.read() as state:
        return timer_view(in_space(state.timers, space, timer_id, "timer"))


@routes(
    "POST", SPACE_PREFIX + "/scopes/{id}/timers", "Arm a durable timer: at a time (at) or after a delay (afterSeconds)",
    body={"at": ISO_TIME, "afterSeconds": {"type": "number", "minimum": 0, "maximum": AFTER_SECONDS_MAX}}, ok=201,
    errors=("VALIDATION_FAILED", "NOT_FOUND", "LIMIT_EXCEEDED", *_INACTIVE), permission=RESOURCE_CONFIG, answer=TIMER,
)
async def create_timer(request: web.Request) -> web.Response:
    node, caller = node_of(request), caller_of(request)
    body = await req.json_body(request)
    after = body.get("afterSeconds")
    if after is not None and (isinstance(after, bool) or not isinstance(after, (int, float)) or not 0 <= after <= AFTER_SECONDS_MAX):
        raise ApiError("VALIDATION_FAILED", f"afterSeconds must be a number from 0 to {AFTER_SECONDS_MAX}")
    args = {
        "run_id": request.match_info["id"],
        "fire_at_ms": req.timestamp_ms(body, "at"),
        "after_ms": None if after is None else round(after * 1000),
    }
    result = await req.propose(request, "timer.create", args)
    return web.json_response(_render(node, caller.space, result["timer_id"]), status=201)


@routes("GET", SPACE_PREFIX + "/timers/{id}", "A timer's state", errors=("NOT_FOUND",), permission=READ, answer=TIMER,)
async def timer_status(request: web.Request) -> web.Response:
    node = node_of(request)
    await node.confirm_leadership(caller_of(request))
    return web.json_response(_render(node, caller_of(request).space, request.match_info["id"]))


@routes(
    "POST", SPACE_PREFIX + "/timers/{id}/wait",
    "Long poll for the firing; acknowledges it in the same call. done=false after waitMs",
    query=WAIT_MS_QUERY,
    errors=("NOT_FOUND", "VALIDATION_FAILED", "CONFLICT"), permission=READ, answer=obj({**TIMER["properties"], "done": BOOLEAN}),
)
async def wait(request: web.Request) -> web.Response:
    node, caller, timer_id = node_of(request), caller_of(request), request.match_info["id"]
    await req.json_body(request, required=False)

    def look() -> dict[str, Any]:
        view = _render(node, caller.space, timer_id)
        if view["state"] == timers.CANCELLED:
            raise ApiError("CONFLICT", f"timer {timer_id} was cancelled")
        return view

    fired = (timers.FIRED, timers.ACKNOWLEDGED)
    view = await long_poll(request, node, timers.timer_key(timer_id), look, lambda view: view["state"] in fired)
    if view["state"] not in fired:
        return web.json_response({**view, "done": False})
    await req.propose(request, "timer.acknowledge", {"timer_id": timer_id})
    return web.json_response({**_render(node, caller.space, timer_id), "done": True})


@routes(
    "POST", SPACE_PREFIX + "/timers/{id}/cancel", "Disarm a timer that has not fired (idempotent)",
    errors=("NOT_FOUND", "CONFLICT"), permission=WRITE, answer=TIMER,
)
async def cancel(request: web.Request) -> web.Response:
    node, caller, timer_id = node_of(request), caller_of(request), request.match_info["id"]
    await req.json_body(request, required=False)
    await req.propose(request, "timer.cancel", {"timer_id": timer_id})
    return web.json_response(_render(node, caller.space, timer_id))
