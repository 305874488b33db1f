"""Tasks: submit, status, and the result long poll."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

from aiohttp import web

from runstate_server.actors import limits, resources
from runstate_server.actors.context import task_key
from runstate_server.actors.state import TaskState
from runstate_server.node.api import _request as req
from runstate_server.node.api._poll import WAIT_MS_QUERY, body_wait_ms, long_poll
from runstate_server.node.api.routes import (
    ANY_JSON,
    INTEGER,
    READ,
    SPACE_PREFIX,
    STRING,
    WRITE,
    RouteTable,
    caller_of,
    node_of,
)
from runstate_server.node.api.views import result_view, task_view
from runstate_server.node.config import LONG_POLL_MS_MAX
from runstate_server.node.errors import ApiError

routes = RouteTable()

_TASK_FIELDS = {
    "input": ANY_JSON, "key": STRING, "attempts": INTEGER, "keyOnly": {"type": "boolean"},
    # What each delivery of the job takes with its lease (the resources must exist).
    "slots": {"oneOf": [STRING, {"type": "array", "items": STRING, "minItems": 1,
                                 "maxItems": limits.needs_slots_max}]},
    "limit": {"type": "object", "required": ["name"], "properties": {
        "name": STRING, "units": {"type": "integer", "minimum": 1, "maximum": limits.limit_units_max}}},
    "budget": {"type": "object", "required": ["name", "reserve"], "properties": {
        "name": STRING, "reserve": {"type": "number", "exclusiveMinimum": 0, "maximum": req.AMOUNT_MAX}}},
}
_SUBMIT_ERRORS = ("VALIDATION_FAILED", "NOT_FOUND", "KEY_CONFLICT", "LIMIT_EXCEEDED", "SCOPE_CANCELLED", "DEADLINE_EXCEEDED")


def _submit_args(request: web.Request, body: dict[str, Any]) -> dict[str, Any]:
    args = {"run_id": request.match_info["id"], "mailbox": request.match_info["name"], **req.task_fields(body)}
    needs = _needs(body)
    if needs is not None:
        args["needs"] = needs
    return args


def _needs(body: dict[str, Any]) -> dict[str, Any] | None:
    """The resources a job takes with each delivery, as the core's `needs`: `slots` (a pool name or
    a list of them), `limit` ({"name", "units"?: 1}) and `budget` ({"name", "reserve"}, a decimal
    in the API, micro-units in the core). None when the job names none."""
    slots, limit, budget = body.get("slots"), body.get("limit"), body.get("budget")
    if slots is None and limit is None and budget is None:
        return None
    names = [slots] if isinstance(slots, str) else [] if slots is None else slots
    if (
        not isinstance(names, list)
        or len(names) > limits.needs_slots_max
        or (slots is not None and not names)
        or not all(isinstance(name, str) and 0 < len(name) <= limits.name_chars_max for name in names)
    ):
        raise ApiError(
            "VALIDATION_FAILED",
            f"slots must be a pool name or a list of 1 to {limits.needs_slots_max} pool names",
        )
    needs: dict[str, Any] = {"slots": names, "limit": None, "budget": None}
    if limit is not None:
        if not isinstance(limit, dict):
            raise ApiError("VALIDATION_FAILED", "limit must be an object such as {\"name\": \"search-api\", \"units\": 1}")
        with _field_of("limit"):
            name = req.text(limit, "name", max_chars=limits.name_chars_max, required=True)
            units = req.integer(limit, "units", minimum=1, maximum=limits.limit_units_max, default=1)
        needs["limit"] = [name, units]
    if budget is not None:
        if not isinstance(budget, dict):
            raise ApiError("VALIDATION_FAILED", "budget must be an object such as {\"name\": \"model-usd\", \"reserve\": 0.4}")
        with _field_of("budget"):
            name = req.text(budget, "name", max_chars=limits.name_chars_max, required=True)
            reserve = req.amount_micros(budget, "reserve", required=True, positive=True)
        needs["budget"] = [name, reserve]
    problem = resources.needs_problem(needs)  # the core's own check of the shape, before proposing
    if problem is not None:
        raise ApiError("VALIDATION_FAILED", problem)
    return needs


@contextlib.contextmanager
def _field_of(outer: str) -> Iterator[None]:
    """Validation errors of a nested object name the field in full (`limit.units`)."""
    try:
        yield
    except ApiError as error:
        raise ApiError(error.code, f"{outer}.{error.message}") from None


def _submitted(request: web.Request, args: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    task_id = result["task_id"]
    return {"id": task_id, "key": args["key"], "created": result["created"], "state": _state_of(request, task_id)}


@routes(
    "POST", SPACE_PREFIX + "/scopes/{id}/mailboxes/{name}/tasks",
    "Submit a task (idempotent per key; without a key the key is the input's hash)",
    body=_TASK_FIELDS, ok=201, errors=_SUBMIT_ERRORS, permission=WRITE,
)
async def submit(request: web.Request) -> web.Response:
    args = _submit_args(request, await req.json_body(request))
    result = await node_of(request).propose(caller_of(request), "task.submit", args)
    answer = _submitted(request, args, result)
    return web.json_response(answer, status=201 if answer["created"] else 200)


@routes(
    "POST", SPACE_PREFIX + "/scopes/{id}/mailboxes/{name}/tasks/batch",
    f"Submit up to {limits.submit_batch_max} tasks in one call; each answers on its own",
    body={"tasks": {"type": "array", "maxItems": limits.submit_batch_max,
                    "items": {"type": "object", "properties": _TASK_FIELDS}}},
    errors=("VALIDATION_FAILED",), permission=WRITE,
)
async def submit_batch(request: web.Request) -> web.Response:
    """Each task is validated and committed like a single submit (the log commits them together);
    the answer lists, in order, each task's submit answer or its own error."""
    body = await req.json_body(request)
    items = body.get("tasks")
    if not isinstance(items, list) or not 1 <= len(items) <= limits.submit_batch_max:
        raise ApiError("VALIDATION_FAILED", f"tasks must be a list of 1 to {limits.submit_batch_max} tasks")
    node, caller = node_of(request), caller_of(request)

    async def one(item: Any) -> dict[str, Any]:
        try:
            if not isinstance(item, dict):
                raise ApiError("VALIDATION_FAILED", "each task must be an object such as {\"input\": ...}")
            args = _submit_args(request, item)
            return _submitted(request, args, await node.propose(caller, "task.submit", args))
        except ApiError as error:
            return {"error": {"code": error.code, "message": error.message}}

    return web.json_response({"tasks": await asyncio.gather(*(one(item) for item in items))})


def _state_of(request: web.Request, task_id: str) -> str | None:
    with node_of(request).read() as state:
        task = state.tasks.get(task_id)
        return task.state if task else None


@routes("GET", SPACE_PREFIX + "/tasks/{id}", "A task's status", errors=("NOT_FOUND",), permission=READ)
async def task_status(request: web.Request) -> web.Response:
    node, caller, task_id = node_of(request), caller_of(request), request.match_info["id"]
    await node.confirm_leadership(caller)
    with node.read() as state:
        task = state.tasks.get(task_id)
        if task is None or task.space != caller.space:
            raise ApiError("NOT_FOUND", f"task {task_id!r} not found")
        return web.json_response(task_view(task))


@routes(
    "GET", SPACE_PREFIX + "/tasks/{id}/result",
    "A task's result: answers when the task is finished, or after waitMs with done=false",
    query=WAIT_MS_QUERY,
    errors=("NOT_FOUND", "VALIDATION_FAILED"), permission=READ,
)
async def task_result(request: web.Request) -> web.Response:
    node, caller, task_id = node_of(request), caller_of(request), request.match_info["id"]

    def look() -> dict[str, Any]:
        with node.read() as state:
            task = state.tasks.get(task_id)
            if task is None or task.space != caller.space:
                raise ApiError("NOT_FOUND", f"task {task_id!r} not found")
            return result_view(task)

    view = await long_poll(request, node, task_key(task_id), look, lambda view: bool(view["done"]))
    return web.json_response(view)


@routes(
    "POST", SPACE_PREFIX + "/tasks/results",
    "Results of many tasks: answers when all are finished, or after waitMs with what is known",
    body={"ids": {"type": "array", "items": STRING, "maxItems": limits.results_batch_max},
          "waitMs": {"type": "integer", "minimum": 0, "maximum": LONG_POLL_MS_MAX}},
    errors=("VALIDATION_FAILED",), permission=READ,
)
async def task_results(request: web.Request) -> web.Response:
    """One result view per id, in order (`{"id", "error"}` for an unknown id)."""
    body = await req.json_body(request)
    ids = body.get("ids")
    if (
        not isinstance(ids, list)
        or not 1 <= len(ids) <= limits.results_batch_max
        or not all(isinstance(task_id, str) for task_id in ids)
    ):
        raise ApiError("VALIDATION_FAILED", f"ids must be a list of 1 to {limits.results_batch_max} task ids")
    wait_ms = body_wait_ms(body)
    node, caller = node_of(request), caller_of(request)
    deadline = time.monotonic() + wait_ms / 1000
    await node.confirm_leadership(caller)
    while True:
        pending: str | None = None
        views: list[dict[str, Any]] = []
        with node.read() as state:
            for task_id in ids:
                task = state.tasks.get(task_id)
                if task is None or task.space != caller.space:
                    views.append({"id": task_id, "error": {"code": "NOT_FOUND", "message": f"task {task_id!r} not found"}})
                    continue
                views.append(result_view(task))
                if pending is None and task.state not in TaskState.TERMINAL:
                    pending = task_id
        remaining_s = deadline - time.monotonic()
        if pending is None or remaining_s <= 0:
            return web.json_response({"results": views})
        # Wait for the first unfinished one; the others are looked at again when it is done.
        with node.waiters.register(task_key(pending)) as waiter:
            with node.read() as state:
                task = state.tasks.get(pending)
                finished = task is None or task.state in TaskState.TERMINAL
            if not finished:
                await waiter.wait(remaining_s)
