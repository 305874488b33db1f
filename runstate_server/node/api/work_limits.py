"""Work limits (actors/work_limits.py): the published protocol's bound on a space's outstanding
tasks that name one (`POST /tasks {workLimit}`). Created by name under a run, listed; a task
past the bound is refused with 429 CONCURRENCY_LIMITED (node/api/tasks.py)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from runstate_server.actors import limits, work_limits
from runstate_server.node._json import json_response
from runstate_server.node.api import _request as req
from runstate_server.node.api.routes import (
    READ,
    RESOURCE_CONFIG,
    SPACE_PREFIX,
    STRING,
    RouteTable,
    caller_of,
    node_of,
)
from runstate_server.node.api.schemas import INTEGER, NAME, array, obj
from runstate_server.node.errors import ApiError

routes = RouteTable()

_MAX_OUTSTANDING = {"type": "integer", "minimum": 1, "maximum": limits.work_limit_outstanding_max}
ROW = obj({"id": STRING, "name": STRING, "scopeId": STRING, "maxOutstanding": INTEGER, "outstanding": INTEGER})


def _row(request: web.Request, name: str) -> dict[str, Any]:
    with node_of(request).read() as state:
        limit = work_limits.find(state, caller_of(request).space, name)
        assert limit is not None, "a work limit is never removed"
        return work_limits.row(limit)


@routes(
    "POST", SPACE_PREFIX + "/work-limits",
    "Create the space's work limit `name` under the run scopeId (the same maxOutstanding again answers the row; "
    "another is CONFLICT): tasks that name it with workLimit are at most maxOutstanding unfinished at once",
    body={"name": NAME, "scopeId": NAME, "maxOutstanding": _MAX_OUTSTANDING}, required=("name", "scopeId", "maxOutstanding"),
    ok=201, errors=("VALIDATION_FAILED", "NOT_FOUND", "CONFLICT", "LIMIT_EXCEEDED", "SCOPE_CANCELLED", "DEADLINE_EXCEEDED"),
    permission=RESOURCE_CONFIG, answer=ROW,
)
async def create(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    args = {
        "name": req.text(body, "name", max_chars=limits.name_chars_max, required=True),
        "run_id": req.text(body, "scopeId", max_chars=limits.name_chars_max, required=True),
        "max_outstanding": req.integer(body, "maxOutstanding", minimum=1, maximum=limits.work_limit_outstanding_max),
    }
    if args["max_outstanding"] is None:
        raise ApiError("VALIDATION_FAILED", "maxOutstanding is required")
    result = await req.propose(request, "work_limit.create", args)
    return json_response(_row(request, result["name"]), status=201 if result["created"] else 200)


@routes(
    "GET", SPACE_PREFIX + "/work-limits", "The space's work limits, oldest first, with their outstanding tasks",
    permission=READ, answer=obj({"workLimits": array(ROW)}),
)
async def list_work_limits(request: web.Request) -> web.Response:
    node, caller = node_of(request), caller_of(request)
    await node.confirm_leadership(caller)
    with node.read() as state:
        rows = work_limits.rows(state, caller.space)
    return json_response({"workLimits": rows})
