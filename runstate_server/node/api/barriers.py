"""Barriers on the published protocol's routes (PROTOCOL.md §5.11): create in a run, or by name in
a run, status, arrive.

`POST /barriers {scopeId, target}`, `PUT /barriers/by-name/{name} {scopeId, target}`, `GET
/barriers/{id}`, `POST /barriers/{id}/arrive {arrivalKey}`. Extensions of the one API on the same
paths: `key` as arrivalKey's other name, `GET /barriers/{id}/wait` (the release's long poll, which
saves polling the status) and `POST /barriers/{id}/nextEpoch` (reuse after a release).

Permissions, as the docs give them: creating a barrier (`POST /barriers`) and starting its next
epoch are configuration, resource_config; arriving is coordination_write, reading and waiting
coordination_read. The by-name declaration stays a worker's call (coordination_write): the
published 0.3.0 client's `together()` declares its barrier from a worker's key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from runstate_server.actors import barriers, limits
from runstate_server.actors.barriers import Barrier
from runstate_server.node._json import json_response
from runstate_server.node.api import _paging as paging
from runstate_server.node.api import _request as req
from runstate_server.node.api._poll import WAIT_MS_QUERY, long_poll
from runstate_server.node.api.routes import (
    READ,
    RESOURCE_CONFIG,
    SPACE_PREFIX,
    WRITE,
    RouteTable,
    caller_of,
    node_of,
)
from runstate_server.node.api.schemas import (
    BOOLEAN,
    INTEGER,
    KEY,
    NAME,
    STRING,
    STRING_OR_NULL,
    TIME,
    TIME_OR_NULL,
    array,
    bounded,
    enum,
    obj,
    text,
)
from runstate_server.node.api.views import in_space, iso
from runstate_server.node.errors import ApiError

BARRIER = obj({
    "id": STRING, "scopeId": STRING, "name": STRING_OR_NULL, "target": INTEGER, "arrivals": INTEGER, "epoch": INTEGER,
    "state": enum("WAITING", "RELEASED", "CANCELLED"), "releasedAt": TIME_OR_NULL, "createdAt": TIME,
})
_TARGET = bounded(1, limits.barrier_target_max)
# A by-name path's {name} as path_name takes it (timers.py declares its by-name path with it too).
NAME_PATH = {"name": text(limits.barrier_timer_name_chars_max)}

routes = RouteTable()

if TYPE_CHECKING:
    from runstate_server.node.server import Node

_INACTIVE = ("SCOPE_CANCELLED", "DEADLINE_EXCEEDED")


def barrier_view(barrier: Barrier) -> dict[str, Any]:
    return {
        "id": barrier.id,
        "scopeId": barrier.run_id,
        "name": barrier.name,
        "target": barrier.target,
        "arrivals": len(barrier.arrivals),
        "epoch": barrier.epoch,
        "state": barrier.state,
        "releasedAt": iso(barrier.released_ms),
        "createdAt": iso(barrier.created_ms),
    }


def _render(node: Node, space: str, barrier_id: str, **extra: Any) -> dict[str, Any]:
    with node.read() as state:
        return {**barrier_view(in_space(state.barriers, space, barrier_id, "barrier")), **extra}


def path_name(request: web.Request) -> str | None:
    """The `{name}` of a by-name path: 1 to barrier_timer_name_chars_max characters of valid Unicode."""
    return req.text({"name": request.match_info["name"]}, "name", max_chars=limits.barrier_timer_name_chars_max, required=True)


def _target(body: dict[str, Any]) -> int:
    target = req.integer(body, "target", minimum=1, maximum=limits.barrier_target_max)
    if target is None:
        raise ApiError("VALIDATION_FAILED", "target is required")
    return target


def _scope_id(body: dict[str, Any]) -> str | None:
    return req.text(body, "scopeId", max_chars=limits.name_chars_max, required=True)


@routes(
    "POST", SPACE_PREFIX + "/barriers",
    "Create a barrier in run scopeId that releases once target distinct keys arrived (configuration: "
    "resource_config; the workers' call is the by-name declaration)",
    body={"scopeId": NAME, "target": _TARGET}, required=("scopeId", "target"), ok=201,
    errors=("VALIDATION_FAILED", "NOT_FOUND", "LIMIT_EXCEEDED", *_INACTIVE), permission=RESOURCE_CONFIG, answer=BARRIER,
)
async def create_barrier_in(request: web.Request) -> web.Response:
    node, caller = node_of(request), caller_of(request)
    body = await req.json_body(request)
    args = {"run_id": _scope_id(body), "target": _target(body)}
    result = await req.propose(request, "barrier.create", args)
    return json_response(_render(node, caller.space, result["barrier_id"]), status=201)


@routes(
    "PUT", SPACE_PREFIX + "/barriers/by-name/{name}",
    "Join or create the run's barrier of that name (the same name in the same run is the same barrier, whatever "
    "its state); CONFLICT when its target is another",
    body={"scopeId": NAME, "target": _TARGET}, required=("scopeId", "target"), path_schemas=NAME_PATH,
    errors=("VALIDATION_FAILED", "NOT_FOUND", "CONFLICT", "LIMIT_EXCEEDED", *_INACTIVE), permission=WRITE,
    answer=obj({**BARRIER["properties"], "created": BOOLEAN}),
)
async def declare_barrier(request: web.Request) -> web.Response:
    node, caller = node_of(request), caller_of(request)
    body = await req.json_body(request)
    name = path_name(request)
    args = {"run_id": _scope_id(body), "name": name, "target": _target(body)}
    result = await req.propose(request, "barrier.declare", args)
    return json_response({**_render(node, caller.space, result["barrier_id"]), "created": result["created"]})


@routes("GET", SPACE_PREFIX + "/barriers/{id}", "A barrier's state and arrivals", errors=("NOT_FOUND",), permission=READ, answer=BARRIER,)
async def barrier_status(request: web.Request) -> web.Response:
    node = node_of(request)
    await node.confirm_leadership(caller_of(request))
    return json_response(_render(node, caller_of(request).space, request.match_info["id"]))


@routes(
    "POST", SPACE_PREFIX + "/barriers/{id}/arrive",
    "Arrive as arrivalKey (idempotent per key: arrived is false for a key that arrived in this epoch, even after "
    "the release); the arrival reaching the target releases. Extension: key is arrivalKey's other name",
    # One of the two: the node takes both only when they are the same key, which a schema cannot say.
    body={"arrivalKey": KEY, "key": KEY}, one_of=(("arrivalKey",), ("key",)),
    errors=("VALIDATION_FAILED", "NOT_FOUND", "BARRIER_RELEASED", "BARRIER_CANCELLED", *_INACTIVE), permission=WRITE, answer=obj({**BARRIER["properties"], "arrived": BOOLEAN}),
)
async def arrive(request: web.Request) -> web.Response:
    node, caller, barrier_id = node_of(request), caller_of(request), request.match_info["id"]
    body = await req.json_body(request)
    key = req.text(body, "arrivalKey", max_chars=limits.key_chars_max)
    older = req.text(body, "key", max_chars=limits.key_chars_max)
    if key is not None and older is not None and key != older:
        raise ApiError("VALIDATION_FAILED", "give arrivalKey (or its older name key), not two different keys")
    key = key if key is not None else older
    if not key:
        raise ApiError("VALIDATION_FAILED", "arrivalKey is required")
    result = await req.propose(request, "barrier.arrive", {"barrier_id": barrier_id, "key": key})
    return json_response(_render(node, caller.space, barrier_id, arrived=result["arrived"]))


# Epochs a waiter may name (a barrier starts at 1 and gains one per nextEpoch).
_EPOCH_MAX = 2**53


@routes(
    "GET", SPACE_PREFIX + "/barriers/{id}/wait",
    "Extension (saves polling): a long poll that answers when the barrier's epoch (`epoch`, default the current one) is RELEASED, even if the next "
    "epoch has begun since (then `currentEpoch` says which), or BARRIER_CANCELLED, or after waitMs",
    query={**WAIT_MS_QUERY, "epoch": {"type": "integer", "minimum": 1, "maximum": _EPOCH_MAX}},
    errors=("NOT_FOUND", "VALIDATION_FAILED", "BARRIER_CANCELLED"), permission=READ, answer=obj(BARRIER["properties"], optional={"currentEpoch": INTEGER}),
)
async def wait(request: web.Request) -> web.Response:
    node, caller, barrier_id = node_of(request), caller_of(request), request.match_info["id"]
    # Absent: 0, then the epoch current at the first look.
    awaited = req.query_integer(request, "epoch", minimum=1, maximum=_EPOCH_MAX, default=0) or None

    def look() -> dict[str, Any]:
        nonlocal awaited
        view = _render(node, caller.space, barrier_id)
        if awaited is None:
            awaited = view["epoch"]  # the epoch current when the wait began
        if view["epoch"] > awaited:
            # nextEpoch needs a release: the awaited epoch was released, though it is over now (a
            # waiter woken late must not wait for the next round, which may need its own arrival).
            return {**view, "epoch": awaited, "state": barriers.RELEASED, "arrivals": view["target"],
                    "releasedAt": None, "currentEpoch": view["epoch"]}
        if view["epoch"] < awaited:
            raise ApiError("VALIDATION_FAILED", f"barrier {barrier_id} is in epoch {view['epoch']}; epoch {awaited} has not begun")
        if view["state"] == barriers.CANCELLED:
            raise ApiError("BARRIER_CANCELLED", f"barrier {barrier_id} was cancelled with its run")
        return view

    view = await long_poll(
        request, node, barriers.barrier_key(barrier_id), look, lambda view: view["state"] == barriers.RELEASED
    )
    return json_response(view)


@routes(
    "POST", SPACE_PREFIX + "/barriers/{id}/nextEpoch", "Extension: reuse a released barrier, a new epoch with no arrivals",
    errors=("NOT_FOUND", "CONFLICT", "BARRIER_CANCELLED", *_INACTIVE), permission=RESOURCE_CONFIG, answer=BARRIER,
)
async def next_epoch(request: web.Request) -> web.Response:
    node, caller, barrier_id = node_of(request), caller_of(request), request.match_info["id"]
    await req.json_body(request, required=False)
    await req.propose(request, "barrier.next_epoch", {"barrier_id": barrier_id})
    return json_response(_render(node, caller.space, barrier_id))


# -- the list (an extension for the console) -------------------------------------------------------

_BARRIER_STATES = (barriers.WAITING, barriers.RELEASED, barriers.CANCELLED)
BARRIERS_PAGE = obj({"barriers": array(BARRIER), "nextCursor": STRING_OR_NULL})


@routes(
    "GET", SPACE_PREFIX + "/barriers",
    f"Extension: the space's barriers, newest first, {limits.list_page_default} a page (limit: at most "
    f"{limits.list_page_max}); scopeId (its run) and state filter them; nextCursor resumes",
    query={**paging.PAGE_QUERY, "scopeId": STRING, "state": {"type": "string", "enum": list(_BARRIER_STATES)}},
    errors=("VALIDATION_FAILED",), permission=READ, answer=BARRIERS_PAGE,
)
async def list_barriers(request: web.Request) -> web.Response:
    node, caller = node_of(request), caller_of(request)
    views, next_cursor = await paging.run_owned_page(
        request, node, caller, _BARRIER_STATES, lambda state: state.barriers, lambda run: run.barriers, barrier_view,
    )
    return json_response({"barriers": views, "nextCursor": next_cursor})
