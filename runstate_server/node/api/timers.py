"""Durable timers on the published protocol's routes (PROTOCOL.md §5.12): create in a run, or by
name in a run, poll fired ones and ack them with their token, cancel.

`POST /timers {scopeId, afterSeconds | at}`, `PUT /timers/by-name/{name}` (the durable named sleep:
`now` is the server's time, so a client sleeps `fireAt - now`), `POST /timers/poll {scopeId}`, `POST
/timers/{id}/ack {token}`, `POST /timers/{id}/cancel`. Extensions of the one API on the same paths:
`GET /timers/{id}` (a timer's state) and `POST /timers/{id}/wait` (the firing's long poll, which
acknowledges it: it saves polling).

The wait acknowledges, so it is a write (coordination_write), like the ack it replaces: a read
never changes state, and a read-only key that waited would take the firing from the worker that
polls for it. A read-only key watches a timer with `GET /timers/{id}` or `POST /timers/poll`.
"""

from __future__ import annotations

import secrets
import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

from runstate_server.actors import limits, timers
from runstate_server.actors.timers import Timer
from runstate_server.node._json import json_response
from runstate_server.node.api import _paging as paging
from runstate_server.node.api import _request as req
from runstate_server.node.api._poll import WAIT_MS_QUERY, long_poll
from runstate_server.node.api.barriers import NAME_PATH, path_name
from runstate_server.node.api.messages import TOKEN_NONCE_BYTES
from runstate_server.node.api.routes import (
    ISO_TIME,
    READ,
    SPACE_PREFIX,
    WRITE,
    RouteTable,
    caller_of,
    node_of,
)
from runstate_server.node.api.schemas import (
    BOOLEAN,
    KEY,
    NAME,
    STRING,
    STRING_OR_NULL,
    TIME,
    TIME_OR_NULL,
    array,
    enum,
    obj,
)
from runstate_server.node.api.views import in_space, iso
from runstate_server.node.errors import ApiError

_STATES = enum(timers.ARMED, timers.FIRED, timers.ACKED, timers.CANCELLED)
TIMER = obj({
    "id": STRING, "scopeId": STRING, "name": STRING_OR_NULL, "state": _STATES, "fireAt": TIME, "firedAt": TIME_OR_NULL,
    "createdAt": TIME,
})
# A by-name answer: the token once it fired (FIRED or ACKED), the node's time.
_DECLARED = obj({**TIMER["properties"], "created": BOOLEAN, "now": TIME}, optional={"token": STRING})
AFTER_SECONDS_MAX = limits.timer_ms_max // 1000
# When a timer fires: exactly one of a time (at most timer_ms_max after the node's now, which a
# schema cannot state) and a delay.
_TIME_BODY = {"at": ISO_TIME, "afterSeconds": {"type": "number", "minimum": 0, "maximum": AFTER_SECONDS_MAX}}
_TIME_ONE_OF = (("at",), ("afterSeconds",))

routes = RouteTable()

if TYPE_CHECKING:
    from runstate_server.node.server import Node

_INACTIVE = ("SCOPE_CANCELLED", "DEADLINE_EXCEEDED")


def timer_view(timer: Timer) -> dict[str, Any]:
    return {
        "id": timer.id,
        "scopeId": timer.run_id,
        "name": timer.name,
        "state": timer.state,
        "fireAt": iso(timer.fire_at_ms),
        "firedAt": iso(timer.fired_ms),
        "createdAt": iso(timer.created_ms),
    }


def _render(node: Node, space: str, timer_id: str) -> dict[str, Any]:
    with node.read() as state:
        return timer_view(in_space(state.timers, space, timer_id, "timer"))


def _time_args(body: dict[str, Any]) -> dict[str, Any]:
    """fire_at_ms or after_ms (the core refuses both or neither) and a fresh nonce for its token."""
    after = body.get("afterSeconds")
    if after is not None and (isinstance(after, bool) or not isinstance(after, (int, float)) or not 0 <= after <= AFTER_SECONDS_MAX):
        raise ApiError("VALIDATION_FAILED", f"afterSeconds must be a number from 0 to {AFTER_SECONDS_MAX}")
    return {
        "fire_at_ms": req.timestamp_ms(body, "at"),
        "after_ms": None if after is None else round(after * 1000),
        "nonce": secrets.token_hex(TOKEN_NONCE_BYTES),
    }


def _scope_id(body: dict[str, Any]) -> str | None:
    return req.text(body, "scopeId", max_chars=limits.name_chars_max, required=True)


@routes(
    "POST", SPACE_PREFIX + "/timers", "Arm a durable timer in run scopeId: at a time (at) or after a delay (afterSeconds)",
    body={"scopeId": NAME, **_TIME_BODY}, required=("scopeId",), one_of=_TIME_ONE_OF, ok=201,
    errors=("VALIDATION_FAILED", "NOT_FOUND", "LIMIT_EXCEEDED", *_INACTIVE), permission=WRITE, answer=TIMER,
)
async def create_timer_in(request: web.Request) -> web.Response:
    node, caller = node_of(request), caller_of(request)
    body = await req.json_body(request)
    args = {"run_id": _scope_id(body), **_time_args(body)}
    result = await req.propose(request, "timer.create", args)
    return json_response(_render(node, caller.space, result["timer_id"]), status=201)


@routes(
    "PUT", SPACE_PREFIX + "/timers/by-name/{name}",
    "The run's durable timer of that name: armed by the first call (at, or afterSeconds from now), returned as it "
    "is by every later one whatever its body. token once it fired (ack it); now is the node's time",
    body={"scopeId": NAME, **_TIME_BODY}, required=("scopeId",), one_of=_TIME_ONE_OF, path_schemas=NAME_PATH,
    errors=("VALIDATION_FAILED", "NOT_FOUND", "LIMIT_EXCEEDED", *_INACTIVE), permission=WRITE, answer=_DECLARED,
)
async def declare_timer(request: web.Request) -> web.Response:
    node, caller = node_of(request), caller_of(request)
    body = await req.json_body(request)
    args = {"run_id": _scope_id(body), "name": path_name(request), **_time_args(body)}
    result = await req.propose(request, "timer.declare", args)
    with node.read() as state:
        timer = in_space(state.timers, caller.space, result["timer_id"], "timer")
        view = {**timer_view(timer), "created": result["created"]}
        if timer.state in (timers.FIRED, timers.ACKED):
            view["token"] = timers.token_of(timer)
        now_ms = max(int(time.time() * 1000), state.clock_ms)
    return json_response({**view, "now": iso(now_ms)})


_FIRED = obj({"id": STRING, "token": STRING, "firedAt": TIME, "fireAt": TIME, "name": STRING_OR_NULL})


@routes(
    "POST", SPACE_PREFIX + "/timers/poll",
    f"The fired, unacknowledged timers of run scopeId with their tokens, oldest firing first (at most "
    f"{limits.timers_poll_max}); changes nothing",
    body={"scopeId": NAME}, required=("scopeId",),
    errors=("VALIDATION_FAILED", "NOT_FOUND"), permission=READ, answer=obj({"timers": array(_FIRED)}),
)
async def poll(request: web.Request) -> web.Response:
    node, caller = node_of(request), caller_of(request)
    body = await req.json_body(request)
    run_id = _scope_id(body)
    assert run_id is not None
    await node.confirm_leadership(caller)
    with node.read() as state:
        found = timers.fired(state, caller.space, run_id)
        if found is None:
            raise ApiError("NOT_FOUND", f"run {run_id!r} not found")
        rows = [
            {"id": timer.id, "token": timers.token_of(timer), "firedAt": iso(timer.fired_ms), "fireAt": iso(timer.fire_at_ms),
             "name": timer.name}
            for timer in found
        ]
    return json_response({"timers": rows})


@routes(
    "POST", SPACE_PREFIX + "/timers/{id}/ack",
    "Acknowledge a fired timer with its token (FIRED -> ACKED). STALE_CLAIM for a token that is not its own; "
    "CONFLICT when it was acked already, has not fired or was cancelled",
    body={"token": KEY}, required=("token",),
    errors=("VALIDATION_FAILED", "NOT_FOUND", "CONFLICT", "STALE_CLAIM"), permission=WRITE, answer=TIMER,
)
async def ack(request: web.Request) -> web.Response:
    node, caller, timer_id = node_of(request), caller_of(request), request.match_info["id"]
    body = await req.json_body(request)
    token = req.text(body, "token", max_chars=limits.key_chars_max, required=True)
    await req.propose(request, "timer.ack", {"timer_id": timer_id, "token": token})
    return json_response(_render(node, caller.space, timer_id))


@routes("GET", SPACE_PREFIX + "/timers/{id}", "Extension: a timer's state", errors=("NOT_FOUND",), permission=READ, answer=TIMER,)
async def timer_status(request: web.Request) -> web.Response:
    node = node_of(request)
    await node.confirm_leadership(caller_of(request))
    return json_response(_render(node, caller_of(request).space, request.match_info["id"]))


@routes(
    "POST", SPACE_PREFIX + "/timers/{id}/wait",
    "Extension (saves polling): a long poll for the firing that acknowledges it in the same call (a write: "
    "coordination_write). done=false after waitMs",
    query=WAIT_MS_QUERY,
    errors=("NOT_FOUND", "VALIDATION_FAILED", "CONFLICT"), permission=WRITE, answer=obj({**TIMER["properties"], "done": BOOLEAN}),
)
async def wait(request: web.Request) -> web.Response:
    node, caller, timer_id = node_of(request), caller_of(request), request.match_info["id"]
    await req.json_body(request, required=False)

    def look() -> dict[str, Any]:
        view = _render(node, caller.space, timer_id)
        if view["state"] == timers.CANCELLED:
            raise ApiError("CONFLICT", f"timer {timer_id} was cancelled")
        return view

    fired = (timers.FIRED, timers.ACKED)
    view = await long_poll(request, node, timers.timer_key(timer_id), look, lambda view: view["state"] in fired)
    if view["state"] not in fired:
        return json_response({**view, "done": False})
    await req.propose(request, "timer.acknowledge", {"timer_id": timer_id})
    return json_response({**_render(node, caller.space, timer_id), "done": True})


@routes(
    "POST", SPACE_PREFIX + "/timers/{id}/cancel", "Disarm a timer that has not fired (idempotent)",
    errors=("NOT_FOUND", "CONFLICT"), permission=WRITE, answer=TIMER,
)
async def cancel(request: web.Request) -> web.Response:
    node, caller, timer_id = node_of(request), caller_of(request), request.match_info["id"]
    await req.json_body(request, required=False)
    await req.propose(request, "timer.cancel", {"timer_id": timer_id})
    return json_response(_render(node, caller.space, timer_id))


# -- the list (an extension for the console) -------------------------------------------------------

_TIMER_STATES = (timers.ARMED, timers.FIRED, timers.ACKED, timers.CANCELLED)
TIMERS_PAGE = obj({"timers": array(TIMER), "nextCursor": STRING_OR_NULL})


@routes(
    "GET", SPACE_PREFIX + "/timers",
    f"Extension: the space's timers, newest first, {limits.list_page_default} a page (limit: at most "
    f"{limits.list_page_max}); scopeId (its run) and state filter them; nextCursor resumes",
    query={**paging.PAGE_QUERY, "scopeId": STRING, "state": {"type": "string", "enum": list(_TIMER_STATES)}},
    errors=("VALIDATION_FAILED",), permission=READ, answer=TIMERS_PAGE,
)
async def list_timers(request: web.Request) -> web.Response:
    node, caller = node_of(request), caller_of(request)
    views, next_cursor = await paging.run_owned_page(
        request, node, caller, _TIMER_STATES, lambda state: state.timers, lambda run: run.timers, timer_view,
    )
    return json_response({"timers": views, "nextCursor": next_cursor})
