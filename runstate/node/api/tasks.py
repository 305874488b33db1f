"""Tasks: submit, status, and the result long poll."""

from __future__ import annotations

import time

from aiohttp import web

from runstate.actors import limits
from runstate.actors.context import task_key
from runstate.actors.state import TaskState
from runstate.node.api import _request as req
from runstate.node.api.errors import ApiError
from runstate.node.api.routes import ANY_JSON, INTEGER, STRING, node_of, route, space_of
from runstate.node.api.views import result_view, task_view
from runstate.node.config import LONG_POLL_MS_MAX


@route(
    "POST", "/v1/scopes/{id}/mailboxes/{name}/tasks",
    "Submit a task (idempotent per key; without a key the key is the input's hash)",
    body={"input": ANY_JSON, "key": STRING, "attempts": INTEGER}, ok=201,
    errors=("VALIDATION", "NOT_FOUND", "KEY_CONFLICT", "LIMIT_EXCEEDED", "SCOPE_CANCELLED", "DEADLINE_EXCEEDED"),
)
async def submit(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    task_input, encoded = req.payload(body, "input", code="VALIDATION")
    input_hash = req.sha256_hex(encoded)
    key = req.text(body, "key", max_chars=limits.key_chars_max) or input_hash
    attempts = req.integer(
        body, "attempts", minimum=1, maximum=limits.attempts_max, default=limits.attempts_default
    )
    args = {
        "run_id": request.match_info["id"],
        "mailbox": request.match_info["name"],
        "key": key,
        "input": task_input,
        "input_hash": input_hash,
        "attempts": attempts,
    }
    result = await node_of(request).propose(space_of(request), "task.submit", args)
    created = result["created"]
    return web.json_response(
        {"id": result["task_id"], "key": key, "created": created, "state": _state_of(request, result["task_id"])},
        status=201 if created else 200,
    )


def _state_of(request: web.Request, task_id: str) -> str | None:
    with node_of(request).read() as state:
        task = state.tasks.get(task_id)
        return task.state if task else None


@route("GET", "/v1/tasks/{id}", "A task's status", errors=("NOT_FOUND",))
async def task_status(request: web.Request) -> web.Response:
    node, space, task_id = node_of(request), space_of(request), request.match_info["id"]
    with node.read() as state:
        task = state.tasks.get(task_id)
        if task is None or task.space != space:
            raise ApiError("NOT_FOUND", f"task {task_id!r} not found")
        return web.json_response(task_view(task))


@route(
    "GET", "/v1/tasks/{id}/result",
    "A task's result: answers when the task is finished, or after waitMs with done=false",
    query={"waitMs": {"type": "integer", "minimum": 0, "maximum": LONG_POLL_MS_MAX}},
    errors=("NOT_FOUND", "VALIDATION"),
)
async def task_result(request: web.Request) -> web.Response:
    node, space, task_id = node_of(request), space_of(request), request.match_info["id"]
    wait_ms = req.query_integer(request, "waitMs", minimum=0, maximum=LONG_POLL_MS_MAX, default=0)
    deadline = time.monotonic() + wait_ms / 1000
    while True:
        with node.waiters.register(task_key(task_id)) as waiter:
            with node.read() as state:
                task = state.tasks.get(task_id)
                if task is None or task.space != space:
                    raise ApiError("NOT_FOUND", f"task {task_id!r} not found")
                view = result_view(task)
            remaining_s = deadline - time.monotonic()
            if task.state in TaskState.TERMINAL or remaining_s <= 0:
                return web.json_response(view)
            await waiter.wait(remaining_s)
