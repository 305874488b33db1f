"""Tasks: submit (one, or a batch), status with a long poll, cancel, join and detach, admit, and
the batch result wait."""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Reversible
from typing import Any

from aiohttp import web

from runstate_server.actors import limits, resources
from runstate_server.actors.context import task_key
from runstate_server.actors.runs import subtree
from runstate_server.actors.state import State, Task, TaskState
from runstate_server.node._json import json_response, raw_value
from runstate_server.node.api import _answers as A
from runstate_server.node.api import _paging as paging
from runstate_server.node.api import _request as req
from runstate_server.node.api._poll import WAIT_MS_QUERY, body_wait_ms, long_poll, park, wait
from runstate_server.node.api.messages import RECEIVE_BODY, holds_of, receive, receive_args
from runstate_server.node.api.routes import (
    ANY_JSON,
    ISO_TIME,
    READ,
    SPACE_PREFIX,
    STRING,
    WRITE,
    RouteTable,
    caller_of,
    node_of,
)
from runstate_server.node.api.schemas import (
    KEY,
    NAME,
    REASON,
    REQUIREMENTS,
    STRING_OR_NULL,
    array,
    bounded,
    obj,
)
from runstate_server.node.api.views import in_space, iso, task_view
from runstate_server.node.config import LONG_POLL_MS_MAX
from runstate_server.node.errors import ApiError

routes = RouteTable()

_TASK_FIELDS = {
    "scopeId": NAME, "mailboxId": NAME, "taskKey": KEY, "input": ANY_JSON, "deadline": ISO_TIME,
    "subscriberId": NAME, "requirements": REQUIREMENTS, "workLimit": NAME,
    # Extensions: attempts of this task, and the key alone names it.
    "attempts": bounded(1, limits.attempts_max), "keyOnly": {"type": "boolean"},
}
_TASK_REQUIRED = ("scopeId", "mailboxId", "input")
_SUBMIT_ERRORS = (
    "VALIDATION_FAILED", "NOT_FOUND", "KEY_CONFLICT", "BACKLOG_FULL", "LIMIT_EXCEEDED", "SCOPE_CANCELLED", "DEADLINE_EXCEEDED",
    "CONCURRENCY_LIMITED",
)
_SUBSCRIBER = {"subscriberId": NAME}


def _submit_args(body: dict[str, Any]) -> dict[str, Any]:
    """The core's submit of one task of POST /tasks (or of a batch)."""
    args = {
        "run_id": req.text(body, "scopeId", max_chars=limits.name_chars_max, required=True),
        "mailbox_id": req.text(body, "mailboxId", max_chars=limits.name_chars_max, required=True),
        **req.task_fields(body),
        "deadline_ms": req.timestamp_ms(body, "deadline"),
        "subscriber": req.text(body, "subscriberId", max_chars=limits.name_chars_max),
    }
    work_limit = req.text(body, "workLimit", max_chars=limits.name_chars_max)
    if work_limit is not None:
        args["work_limit"] = work_limit
    requirements = req.requirements(body)
    if requirements is not None:
        if not isinstance(requirements, dict):
            raise ApiError("VALIDATION_FAILED", "requirements must be an object of pools, quotas and budgets")
        args["requirements"] = requirements
    return args


def _submitted(result: dict[str, Any]) -> dict[str, Any]:
    return {"taskId": result["task_id"], "id": result["task_id"], "taskKey": result["key"],
            "created": result["created"], "state": result["state"]}


@routes(
    "POST", SPACE_PREFIX + "/tasks",
    "Submit a task (the same taskKey in the same run and mailbox is the same task)",
    body=_TASK_FIELDS, required=_TASK_REQUIRED, ok=201, errors=_SUBMIT_ERRORS, permission=WRITE, answer=A.SUBMITTED,
)
async def submit(request: web.Request) -> web.Response:
    args = _submit_args(await req.json_body(request))
    result = await req.propose(request, "task.submit", args)
    return json_response(_submitted(result), status=201 if result["created"] else 200)


@routes(
    "POST", SPACE_PREFIX + "/tasks/batch",
    f"Extension: submit up to {limits.submit_batch_max} tasks in one call; each answers on its own. A task its "
    "schema refuses refuses the whole call (400, nothing changes)",
    body={"tasks": {"type": "array", "minItems": 1, "maxItems": limits.submit_batch_max, "items": {
        "type": "object", "properties": _TASK_FIELDS, "required": list(_TASK_REQUIRED), "additionalProperties": False,
    }}},
    required=("tasks",),
    errors=("VALIDATION_FAILED",), permission=WRITE, answer=A.SUBMITTED_MANY,
)
async def submit_batch(request: web.Request) -> web.Response:
    """A task its schema refuses (not an object, an unknown field, a missing or malformed field)
    is a 400 for the whole call, which changes nothing (req.batch_item). Each well-formed task is
    committed like a single submit (the log commits them together); the answer lists, in order,
    each task's submit answer or its own error (a key conflict, an input over its bound)."""
    body = await req.json_body(request)
    items = body.get("tasks")
    if not isinstance(items, list) or not 1 <= len(items) <= limits.submit_batch_max:
        raise ApiError("VALIDATION_FAILED", f"tasks must be a list of 1 to {limits.submit_batch_max} tasks")
    batch_idempotency = await req.idempotency(request)
    answers: list[dict[str, Any] | None] = []
    args_list: list[dict[str, Any]] = []
    idempotencies: list[tuple[str, str] | None] = []
    for index, item in enumerate(items):
        try:
            args_list.append(req.batch_item(index, item, _submit_item_args))
        except req.BoundExceeded as error:  # an input over its bound: this task's own error
            answers.append(_item_error(error))
            continue
        answers.append(None)  # the commit's answer, below
        # Below command level 2 each task is its own command, keyed KEY#index (its place in the
        # request); a retried batch replays each one's first answer either way.
        idempotencies.append(None if batch_idempotency is None else (
            f"{batch_idempotency[0]}#{index}", f"{batch_idempotency[1]}#{index}"
        ))
    if args_list:
        # Committed together, with one wait for the whole batch (not a task and a timeout each).
        outcomes = iter(await node_of(request).propose_many(
            caller_of(request), "task.submit", args_list, batch_idempotency, idempotencies
        ))
        for index, answer in enumerate(answers):
            if answer is None:
                outcome = next(outcomes)
                answers[index] = _item_error(outcome) if isinstance(outcome, ApiError) else _submitted(outcome)
    return json_response({"tasks": answers})


def _submit_item_args(item: Any) -> dict[str, Any]:
    """The core's submit of one task of a batch, or the ApiError that answers it."""
    if not isinstance(item, dict):
        raise ApiError("VALIDATION_FAILED", "must be an object such as {\"input\": ...}")
    unknown = sorted(set(item) - set(_TASK_FIELDS))
    if unknown:
        raise ApiError("VALIDATION_FAILED", f"unknown field {', '.join(unknown)}; a task takes {', '.join(sorted(_TASK_FIELDS))}")
    return _submit_args(item)


def _item_error(error: ApiError) -> dict[str, Any]:
    return {"error": {"code": error.code, "message": error.message}}


def _view(state: State, task: Task) -> dict[str, Any]:
    mailbox = state.spaces[task.space].mailboxes.get(task.mailbox)
    return task_view(task, mailbox.id if mailbox is not None else None)


_TASK_STATES = (TaskState.QUEUED, TaskState.RUNNING, *sorted(TaskState.TERMINAL))
TASKS_PAGE = obj({"tasks": array(A.TASK), "nextCursor": STRING_OR_NULL})


@routes(
    "GET", SPACE_PREFIX + "/tasks",
    f"Extension: the space's tasks and messages, newest first, {limits.list_page_default} a page (limit: at most "
    f"{limits.list_page_max}); mailboxId, scopeId (with includeDescendants=true: and the runs below it), state "
    "and groupId filter them; nextCursor resumes",
    query={
        **paging.PAGE_QUERY, "mailboxId": STRING, "scopeId": STRING,
        "includeDescendants": {"type": "string", "enum": ["true", "false"]},
        "state": {"type": "string", "enum": list(_TASK_STATES)}, "groupId": STRING,
    },
    errors=("VALIDATION_FAILED",), permission=READ, answer=TASKS_PAGE,
)
async def list_tasks(request: web.Request) -> web.Response:
    """With groupId only the group's members are read; with scopeId only the tasks of those runs
    (their queues); else only the space's (its mailboxes' task index): each from its newest end,
    until the page is full (_paging.py)."""
    node, caller = node_of(request), caller_of(request)
    limit, after = paging.page_args(request)
    wanted_state = paging.state_filter(request, _TASK_STATES)
    mailbox_id = paging.text_filter(request, "mailboxId")
    scope_id = paging.text_filter(request, "scopeId")
    descendants = paging.bool_filter(request, "includeDescendants") or False
    group_id = paging.text_filter(request, "groupId")
    space = caller.space
    await node.confirm_leadership(caller)
    with node.read() as state:
        found_space = state.spaces.get(space)
        mailbox: str | None = None
        if mailbox_id is not None:
            mailbox = found_space.mailbox_names.get(mailbox_id) if found_space is not None else None
            if mailbox is None:
                return json_response({"tasks": [], "nextCursor": None})
        group = state.groups.get(group_id) if group_id is not None else None
        if group_id is not None and (group is None or group.space != space):
            return json_response({"tasks": [], "nextCursor": None})

        run_ids: set[str] | None = None
        if scope_id is not None:
            run = state.runs.get(scope_id)
            if run is None or run.space != space:
                return json_response({"tasks": [], "nextCursor": None})
            run_ids = {member.id for member in subtree(state, run)} if descendants else {run.id}

        def matches(task: Task) -> bool:
            return (
                task.space == space
                and (mailbox is None or task.mailbox == mailbox)
                and (wanted_state is None or task.state == wanted_state)
                and (run_ids is None or task.run_id in run_ids)
            )

        if group is not None:  # its members (at most group_members_max)
            chosen = (state.tasks[task_id] for task_id in group.members if task_id in state.tasks)
            found, next_cursor = paging.page_sorted(chosen, paging.creation_key, matches, limit, after)
        else:
            # Streams of ids in creation order, each read from its newest end and merged: a run's
            # queues (scopeId), else the space's mailboxes' task index (state.mailbox_tasks).
            streams: list[Reversible[str]]
            if run_ids is not None:
                streams = [
                    queue.by_key.values()
                    for run_id in run_ids
                    for name, queue in state.runs[run_id].queues.items() if mailbox is None or name == mailbox
                ]
            else:
                names = [mailbox] if mailbox is not None else list(found_space.mailboxes) if found_space else []
                streams = [state.mailbox_tasks.get((space, name), {}).keys() for name in names]
            newest_first = heapq.merge(
                *((state.tasks[task_id] for task_id in reversed(ids)) for ids in streams),
                key=paging.creation_key, reverse=True,
            )
            found, next_cursor = paging.page(newest_first, paging.creation_key, matches, limit, after)
        views = [_view(state, task) for task in found]
    return json_response({"tasks": views, "nextCursor": next_cursor})


@routes(
    "GET", SPACE_PREFIX + "/tasks/{id}", "A task's view; with waitMs, answers once it is terminal or the wait ran out",
    query=WAIT_MS_QUERY, errors=("NOT_FOUND", "VALIDATION_FAILED"), permission=READ, answer=A.TASK,
)
async def task_status(request: web.Request) -> web.Response:
    node, caller, task_id = node_of(request), caller_of(request), request.match_info["id"]

    def look() -> dict[str, Any]:
        with node.read() as state:
            return _view(state, in_space(state.tasks, caller.space, task_id, "task"))

    view = await long_poll(request, node, task_key(task_id), look, lambda view: bool(view["done"]))
    return json_response(view)


def _task_answer(result: dict[str, Any]) -> dict[str, Any]:
    answer = {"taskId": result["task_id"], "state": result["state"]}
    if "outcome_reason" in result:
        answer["outcomeReason"] = result["outcome_reason"]
    if "subscribers" in result:
        answer["subscribers"] = result["subscribers"]
    return answer


@routes(
    "POST", SPACE_PREFIX + "/tasks/{id}/cancel", "Cancel an unfinished task (a finished one stays as it is)",
    body={"reason": REASON}, errors=("VALIDATION_FAILED", "NOT_FOUND"), permission=WRITE, answer=A.TASK_CHANGED,
)
async def cancel(request: web.Request) -> web.Response:
    body = await req.json_body(request, required=False)
    args = {"task_id": request.match_info["id"], "reason": req.text(body, "reason", max_chars=limits.error_message_chars_max)}
    return json_response(_task_answer(await req.propose(request, "task.cancel", args)))


@routes(
    "POST", SPACE_PREFIX + "/tasks/{id}/join",
    f"Subscribe to a task (idempotent; at most {limits.subscribers_per_task_max} subscribers)",
    body={**_SUBSCRIBER, "scopeId": NAME}, required=("subscriberId", "scopeId"), errors=("VALIDATION_FAILED", "NOT_FOUND", "LIMIT_EXCEEDED"), permission=WRITE, answer=A.TASK_CHANGED,
)
async def join(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    args = {
        "task_id": request.match_info["id"],
        "subscriber": req.text(body, "subscriberId", max_chars=limits.name_chars_max, required=True),
        "run_id": req.text(body, "scopeId", max_chars=limits.name_chars_max, required=True),
    }
    return json_response(_task_answer(await req.propose(request, "task.join", args)))


@routes(
    "POST", SPACE_PREFIX + "/tasks/{id}/detach", "Unsubscribe from a task (idempotent; the task goes on)",
    body=_SUBSCRIBER, required=("subscriberId",), errors=("VALIDATION_FAILED", "NOT_FOUND"), permission=WRITE,
    answer=A.TASK_CHANGED,
)
async def detach(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    args = {
        "task_id": request.match_info["id"],
        "subscriber": req.text(body, "subscriberId", max_chars=limits.name_chars_max, required=True),
    }
    return json_response(_task_answer(await req.propose(request, "task.detach", args)))


def _admitted(given: dict[str, Any]) -> dict[str, Any]:
    holds = holds_of(given)
    return {
        "taskId": given["task_id"],
        "messageId": given["task_id"],
        "token": given["token"],
        "payload": raw_value(given["input"]),
        "attempt": given["attempt"],
        "attempts": given["attempts"],
        "taskKey": given["key"],
        "scopeId": given["run_id"],
        "leaseExpiresAt": iso(given["lease_expires_ms"]),
        "grants": holds["slots"],
        "consumptions": [],
        # The budget reservations to settle or void: those of requirements.budgets (budgets.py),
        # and the leased one of a `budget` need (which ends with the delivery).
        "reservations": [
            *given.get("budget_reservations", []), *([] if holds["reservationId"] is None else [holds["reservationId"]])
        ],
        "needs": resources.needs_view(given["needs"]),
        "holds": holds,
    }


@routes(
    "POST", SPACE_PREFIX + "/tasks/admit",
    "Take the oldest task of the mailbox whose needs can all be taken now, with them, under a lease; 204 when none",
    body={**RECEIVE_BODY, "mailboxId": NAME, "includeDescendants": {"type": "boolean"}}, required=("scopeId", "mailboxId"),
    errors=("VALIDATION_FAILED", "NOT_FOUND", "SCOPE_CANCELLED", "DEADLINE_EXCEEDED"), permission=WRITE, answer=A.ADMITTED_ONE_OR_MANY, empty=True,
)
async def admit(request: web.Request) -> web.StreamResponse:
    body = await req.json_body(request)
    mailbox_id = req.text(body, "mailboxId", max_chars=limits.name_chars_max, required=True)
    assert mailbox_id is not None
    args = receive_args(request, body, mailbox_id, include_descendants=req.flag(body, "includeDescendants"), tasks_only=True)
    given = await receive(request, body, args)
    if not given:
        return web.Response(status=204)
    if "max" in body:  # the batch extension
        return json_response({"tasks": [_admitted(one) for one in given]})
    return json_response(_admitted(given[0]))


def _result_view(task: Task) -> dict[str, Any]:
    """What a result wait shows of a task (the fields of the task view it needs)."""
    return {
        "id": task.id,
        "state": task.state,
        "done": task.state in TaskState.TERMINAL,
        "outcome": raw_value(task.outcome),
        "outcomeReason": task.outcome_reason,
        "error": task.error if task.state != TaskState.SUCCEEDED else None,
        "attempt": task.attempt,
    }


@routes(
    "POST", SPACE_PREFIX + "/tasks/results",
    "Extension: results of many tasks; answers when all are terminal, or after waitMs with what is known; "
    "with view=task each is the task's view as GET /tasks/{id} shows it",
    required=("ids",),
    body={"ids": {"type": "array", "items": STRING, "minItems": 1, "maxItems": limits.results_batch_max},
          "waitMs": {"type": "integer", "minimum": 0, "maximum": LONG_POLL_MS_MAX},
          "view": {"type": "string", "enum": ["result", "task"]}},
    errors=("VALIDATION_FAILED",), permission=READ, answer=A.RESULTS,
)
async def task_results(request: web.Request) -> web.Response:
    """One result view per id, in order (`{"id", "error"}` for an unknown id); with `view: task`
    the whole task view instead (what the SDK's coalesced `Ticket.result()` hands each caller)."""
    body = await req.json_body(request)
    view_kind = body.get("view", "result")
    if view_kind not in ("result", "task"):
        raise ApiError("VALIDATION_FAILED", "view must be \"result\" or \"task\"")
    render = _result_view if view_kind == "result" else None
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
        with node.read() as state:
            pending = _first_unfinished(state, caller.space, ids)
            remaining_s = deadline - time.monotonic()
            # Rendered only to answer: a wait whose tasks end one by one looks again at each end.
            views = _results(state, caller.space, ids, render) if pending is None or remaining_s <= 0 else None
        if views is not None:
            return json_response({"results": views})
        assert pending is not None
        # Wait for the first unfinished one; the others are looked at again when it is done.
        with park(request, task_key(pending)) as waiter:
            with node.read() as state:
                task = state.tasks.get(pending)
                finished = task is None or task.state in TaskState.TERMINAL
                if not finished and not waiter.parked:  # too many wait here: answer now
                    views = _results(state, caller.space, ids, render)
            if views is not None:
                return json_response({"results": views})
            if not finished:
                await wait(request, waiter, remaining_s)


def _first_unfinished(state: State, space: str, ids: list[str]) -> str | None:
    """The first of the ids that names a task of the space not yet terminal; None when none does."""
    for task_id in ids:
        task = state.tasks.get(task_id)
        if task is not None and task.space == space and task.state not in TaskState.TERMINAL:
            return task_id
    return None


def _results(
    state: State, space: str, ids: list[str], render: Callable[[Task], dict[str, Any]] | None
) -> list[dict[str, Any]]:
    """One view per id, in order: `render`'s (None: the task view), or NOT_FOUND's."""
    views: list[dict[str, Any]] = []
    for task_id in ids:
        task = state.tasks.get(task_id)
        if task is None or task.space != space:
            views.append({"id": task_id, "error": {"code": "NOT_FOUND", "message": f"task {task_id!r} not found"}})
        else:
            views.append(render(task) if render is not None else _view(state, task))
    return views
