"""Runs (the API calls them scopes): create, child, status, cancel, complete."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

from runstate_server.actors import limits
from runstate_server.node.api import _request as req
from runstate_server.node.api.routes import (
    INTEGER,
    ISO_TIME,
    READ,
    SPACE_PREFIX,
    STRING,
    WRITE,
    RouteTable,
    caller_of,
    node_of,
)
from runstate_server.node.api.views import run_view
from runstate_server.node.errors import ApiError

routes = RouteTable()

if TYPE_CHECKING:
    from runstate_server.node.server import Node


_INACTIVE = ("SCOPE_CANCELLED", "DEADLINE_EXCEEDED")
_RUN_BODY = {"name": STRING, "deadline": ISO_TIME, "childLimit": INTEGER}


def render_run(node: Node, space: str, run_id: str) -> web.Response:
    with node.read() as state:
        run = state.runs.get(run_id)
        if run is None or run.space != space:
            raise ApiError("NOT_FOUND", f"run {run_id!r} not found")
        view = run_view(state, run, int(time.time() * 1000))
    return web.json_response(view)


def _create_args(body: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": req.text(body, "name", max_chars=limits.name_chars_max),
        "deadline_ms": req.timestamp_ms(body, "deadline"),
        "child_limit": req.integer(
            body, "childLimit", minimum=0, maximum=limits.child_limit_max, default=limits.child_limit_default
        ),
    }


async def _create(request: web.Request, body: dict[str, Any], parent_id: str | None) -> web.Response:
    node, caller = node_of(request), caller_of(request)
    args = _create_args(body)
    args["parent_id"] = parent_id
    result = await node.propose(caller, "run.create", args)
    response = render_run(node, caller.space, result["run_id"])
    response.set_status(201)
    return response


@routes(
    "POST", SPACE_PREFIX + "/scopes", "Create a run (every call creates a new one)",
    body={**_RUN_BODY, "parentScopeId": STRING}, ok=201,
    errors=("VALIDATION_FAILED", "NOT_FOUND", "LIMIT_EXCEEDED", *_INACTIVE), permission=WRITE,
)
async def create_run(request: web.Request) -> web.Response:
    body = await req.json_body(request, required=False)
    parent_id = req.text(body, "parentScopeId", max_chars=limits.name_chars_max)
    return await _create(request, body, parent_id)


@routes(
    "POST", SPACE_PREFIX + "/scopes/{id}/children", "Create a child run", body=_RUN_BODY, ok=201,
    errors=("VALIDATION_FAILED", "NOT_FOUND", "LIMIT_EXCEEDED", *_INACTIVE), permission=WRITE,
)
async def create_child(request: web.Request) -> web.Response:
    body = await req.json_body(request, required=False)
    return await _create(request, body, request.match_info["id"])


@routes("GET", SPACE_PREFIX + "/scopes/{id}", "A run's status", errors=("NOT_FOUND",), permission=READ)
async def run_status(request: web.Request) -> web.Response:
    node = node_of(request)
    await node.confirm_leadership(caller_of(request))
    return render_run(node, caller_of(request).space, request.match_info["id"])


async def _stop(request: web.Request, kind: str, args: dict[str, Any]) -> web.Response:
    node, caller, run_id = node_of(request), caller_of(request), request.match_info["id"]
    args.update(run_id=run_id, retention_ms=node.config.retention_ms)
    await node.propose(caller, kind, args)
    return render_run(node, caller.space, run_id)


@routes(
    "POST", SPACE_PREFIX + "/scopes/{id}/cancel", "Cancel a run and everything below it",
    body={"reason": STRING}, errors=("NOT_FOUND", "CONFLICT"), permission=WRITE,
)
async def cancel_run(request: web.Request) -> web.Response:
    body = await req.json_body(request, required=False)
    reason = req.text(body, "reason", max_chars=limits.error_message_chars_max)
    return await _stop(request, "run.cancel", {"reason": reason})


@routes("POST", SPACE_PREFIX + "/scopes/{id}/complete", "Complete a run", errors=("NOT_FOUND", "CONFLICT"), permission=WRITE)
async def complete_run(request: web.Request) -> web.Response:
    await req.json_body(request, required=False)
    return await _stop(request, "run.complete", {})
