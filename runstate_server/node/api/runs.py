"""Runs (the wire calls them scopes): create (a child with parentId), status, cancel, complete,
and named root runs (`PUT /runs/{name}`)."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from runstate_server.actors import limits, runs
from runstate_server.actors.state import Run
from runstate_server.node._json import json_response
from runstate_server.node.api import _answers as A
from runstate_server.node.api import _paging as paging
from runstate_server.node.api import _request as req
from runstate_server.node.api.routes import (
    ISO_TIME,
    READ,
    SPACE_PREFIX,
    STRING,
    WRITE,
    RouteTable,
    caller_of,
    node_of,
)
from runstate_server.node.api.schemas import NAME, REASON, STRING_OR_NULL, array, bounded, obj, text
from runstate_server.node.api.views import in_space, run_view

routes = RouteTable()

_INACTIVE = ("SCOPE_CANCELLED", "DEADLINE_EXCEEDED")


def run_response(result: dict[str, Any], status: int = 200) -> web.Response:
    """A run as the command that created, found or stopped it described it."""
    return json_response(run_view(result["run"]), status=status)


@routes(
    "POST", SPACE_PREFIX + "/scopes", "Create a run; with parentId a child run, stopped along with its parent",
    body={"name": text(limits.run_name_chars_max), "parentId": NAME, "deadline": ISO_TIME,
          "childLimit": bounded(0, limits.child_limit_max)}, ok=201,
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


_RUN_STATES = ("ACTIVE", "CANCELLED", "COMPLETED")
RUNS_PAGE = obj({"scopes": array(A.RUN), "nextCursor": STRING_OR_NULL})


@routes(
    "GET", SPACE_PREFIX + "/scopes",
    f"Extension: the space's runs, newest first, {limits.list_page_default} a page (limit: at most "
    f"{limits.list_page_max}); state (stored), name (a case-insensitive part of it), parentId, root=true "
    "(runs without a parent) filter them; nextCursor resumes",
    query={
        **paging.PAGE_QUERY, "state": {"type": "string", "enum": list(_RUN_STATES)}, "name": STRING, "parentId": STRING,
        "root": {"type": "string", "enum": ["true", "false"]},
    },
    errors=("VALIDATION_FAILED",), permission=READ, answer=RUNS_PAGE,
)
async def list_runs(request: web.Request) -> web.Response:
    node, caller = node_of(request), caller_of(request)
    limit, after = paging.page_args(request)
    wanted_state = paging.state_filter(request, _RUN_STATES)
    name = paging.text_filter(request, "name")
    folded = name.casefold() if name is not None else None
    parent_id = paging.text_filter(request, "parentId")
    root = paging.bool_filter(request, "root")
    space = caller.space

    def matches(run: Run) -> bool:
        return (
            run.space == space
            and (wanted_state is None or run.stored_state == wanted_state)
            and (folded is None or (run.name is not None and folded in run.name.casefold()))
            and (root is None or (run.parent_id is None) == root)
            and (parent_id is None or run.parent_id == parent_id)
        )

    await node.confirm_leadership(caller)
    now_ms = int(time.time() * 1000)
    with node.read() as state:
        if parent_id is not None:
            parent = state.runs.get(parent_id)
            # Its children, in creation order (appended as they are created), from the newest.
            children = parent.children if parent is not None and parent.space == space else []
            found, next_cursor = paging.page(
                (state.runs[child] for child in reversed(children)), paging.creation_key, matches, limit, after
            )
        else:
            found, next_cursor = paging.page(reversed(state.runs.values()), paging.creation_key, matches, limit, after)
        views = [run_view(runs.describe(state, run, now_ms)) for run in found]
    return json_response({"scopes": views, "nextCursor": next_cursor})


@routes("GET", SPACE_PREFIX + "/scopes/{id}", "A run's status", errors=("NOT_FOUND",), permission=READ, answer=A.RUN,)
async def run_status(request: web.Request) -> web.Response:
    node, caller = node_of(request), caller_of(request)
    await node.confirm_leadership(caller)
    with node.read() as state:
        run = in_space(state.runs, caller.space, request.match_info["id"], "run")
        return json_response(run_view(runs.describe(state, run, int(time.time() * 1000))))


async def _stop(request: web.Request, kind: str, args: dict[str, Any]) -> web.Response:
    node = node_of(request)
    args.update(run_id=request.match_info["id"], retention_ms=node.config.retention_ms)
    return run_response(await req.propose(request, kind, args))


@routes(
    "POST", SPACE_PREFIX + "/scopes/{id}/cancel", "Cancel a run and everything below it",
    body={"reason": REASON}, errors=("NOT_FOUND", "CONFLICT"), permission=WRITE, answer=A.RUN,
)
async def cancel_run(request: web.Request) -> web.Response:
    body = await req.json_body(request, required=False)
    reason = req.text(body, "reason", max_chars=limits.error_message_chars_max)
    return await _stop(request, "run.cancel", {"reason": reason})


@routes("POST", SPACE_PREFIX + "/scopes/{id}/complete", "Complete a run", body={}, errors=("NOT_FOUND", "CONFLICT"), permission=WRITE, answer=A.RUN,)
async def complete_run(request: web.Request) -> web.Response:
    await req.json_body(request, required=False)
    return await _stop(request, "run.complete", {})
