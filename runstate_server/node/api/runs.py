"""Runs (the wire calls them scopes): create (a child with parentId), status, cancel, complete,
and named root runs (`PUT /runs/{name}`)."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from runstate_server.actors import limits, runs
from runstate_server.node.api import _answers as A
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
from runstate_server.node.api.views import in_space, run_view

routes = RouteTable()

_INACTIVE = ("SCOPE_CANCELLED", "DEADLINE_EXCEEDED")


def run_response(result: dict[str, Any], status: int = 200) -> web.Response:
    """A run as the command that created, found or stopped it described it."""
    return web.json_response(run_view(result["run"]), status=status)


@routes(
    "POST", SPACE_PREFIX + "/scopes", "Create a run; with parentId a child run, stopped along with its parent",
    body={"name": STRING, "parentId": STRING, "deadline": ISO_TIME, "childLimit": INTEGER}, ok=201,
    errors=("VALIDATION_FAILED", "NOT_FOUND", "LIMIT_EXCEEDED", *_INACTIVE), permission=WRITE, answer=A.RUN,
)
async def create_run(request: web.Request) -> web.Response:
    body = await req.json_body(request, required=False)
    args = {
        "name": req.text(body, "name", max_chars=limits.run_name_chars_max),
        "parent_id": req.text(body, "parentId", max_chars=limits.name_chars_max),
        "deadline_ms": req.timestamp_ms(body, "deadline"),
        "child_limit": req.integer(
            body, "childLimit", minimum=0, maximum=limits.child_limit_max, default=limits.child_limit_default
        ),
    }
    result = await req.propose(request, "run.create", args)
    return run_response(result, 201)


@routes(
    "PUT", SPACE_PREFIX + "/runs/{name}",
    "The active root run of this name, else a new one (a fresh run once the last one stopped)",
    body={"deadline": ISO_TIME}, errors=("VALIDATION_FAILED", "LIMIT_EXCEEDED"), permission=READ, answer=A.RUN, ok=201,
)
async def named_run(request: web.Request) -> web.Response:
    body = await req.json_body(request, required=False)
    args = {"name": request.match_info["name"], "deadline_ms": req.timestamp_ms(body, "deadline")}
    result = await req.propose(request, "run.named", args)
    return run_response(result, 201 if result["created"] else 200)


@routes("GET", SPACE_PREFIX + "/scopes/{id}", "A run's status", errors=("NOT_FOUND",), permission=READ, answer=A.RUN,)
async def run_status(request: web.Request) -> web.Response:
    node, caller = node_of(request), caller_of(request)
    await node.confirm_leadership(caller)
    with node.read() as state:
        run = in_space(state.runs, caller.space, request.match_info["id"], "run")
        return web.json_response(run_view(runs.describe(state, run, int(time.time() * 1000))))


async def _stop(request: web.Request, kind: str, args: dict[str, Any]) -> web.Response:
    node = node_of(request)
    args.update(run_id=request.match_info["id"], retention_ms=node.config.retention_ms)
    return run_response(await req.propose(request, kind, args))


@routes(
    "POST", SPACE_PREFIX + "/scopes/{id}/cancel", "Cancel a run and everything below it",
    body={"reason": STRING}, errors=("NOT_FOUND", "CONFLICT"), permission=WRITE, answer=A.RUN,
)
async def cancel_run(request: web.Request) -> web.Response:
    body = await req.json_body(request, required=False)
    reason = req.text(body, "reason", max_chars=limits.error_message_chars_max)
    return await _stop(request, "run.cancel", {"reason": reason})


@routes("POST", SPACE_PREFIX + "/scopes/{id}/complete", "Complete a run", body={}, errors=("NOT_FOUND", "CONFLICT"), permission=WRITE, answer=A.RUN,)
async def complete_run(request: web.Request) -> web.Response:
    await req.json_body(request, required=False)
    return await _stop(request, "run.complete", {})
