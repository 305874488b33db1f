"""Mailboxes of a space (list, create, declare by name, view) and their messages (send, list,
recv)."""

from __future__ import annotations

import itertools
import time
from typing import Any

from aiohttp import web

from runstate_server.actors import limits, tasks
from runstate_server.actors.state import Mailbox, State, TaskState
from runstate_server.node._json import json_response, stored_value
from runstate_server.node.api import _answers as A
from runstate_server.node.api import _request as req
from runstate_server.node.api.messages import RECEIVE_BODY, message_of, receive, receive_args
from runstate_server.node.api.metrics import queue_now
from runstate_server.node.api.routes import (
    ANY_JSON,
    ISO_TIME,
    READ,
    RESOURCE_CONFIG,
    SPACE_PREFIX,
    STRING,
    WRITE,
    RouteTable,
    caller_of,
    node_of,
)
from runstate_server.node.api.schemas import KEY, NAME, REQUIREMENTS, bounded
from runstate_server.node.api.views import iso, mailbox_view
from runstate_server.node.errors import ApiError

routes = RouteTable()

_INACTIVE = ("SCOPE_CANCELLED", "DEADLINE_EXCEEDED")
_MODE = {"type": "string", "enum": list(tasks.MAILBOX_MODES)}
# A message's state as the message list shows it: a completed one is ACKED.
_MESSAGE_STATES = {TaskState.QUEUED: "QUEUED", TaskState.RUNNING: "LEASED", TaskState.SUCCEEDED: "ACKED"}


def stats_of(state: State, space: str, name: str, now_ms: int) -> dict[str, Any]:
    """A mailbox's stats: what it holds now as the queue metrics count it (metrics.queue_now), and
    the ended tasks it still holds (those of runs not yet removed; state.ended_figures)."""
    depth, running, age_s = queue_now(state.queue_figures.get((space, name)), now_ms)
    ended = state.ended_figures.get((space, name))
    by_state = ended.by_state if ended is not None else {}
    return {
        "queued": depth,
        "inFlight": running,
        "oldestQueuedAgeSeconds": age_s,
        "succeeded": by_state.get(TaskState.SUCCEEDED, 0),
        "failed": by_state.get(TaskState.FAILED, 0),
        "cancelled": by_state.get(TaskState.CANCELLED, 0),
        "expired": by_state.get(TaskState.EXPIRED, 0),
        "attemptsTotal": ended.attempts if ended is not None else 0,
    }


def _with_stats(state: State, space: str, mailbox: Mailbox, now_ms: int) -> dict[str, Any]:
    return {**mailbox_view(tasks.describe_mailbox(mailbox)), "stats": stats_of(state, space, mailbox.name, now_ms)}


def _answer(request: web.Request, mailbox: dict[str, Any]) -> dict[str, Any]:
    """A created or declared mailbox (tasks.describe_mailbox) as GET /mailboxes/{id} shows it."""
    space = caller_of(request).space
    with node_of(request).read() as state:
        stats = stats_of(state, space, mailbox["name"], int(time.time() * 1000))
    return {**mailbox_view(mailbox), "stats": stats}


def _mailboxes(state: State, space: str) -> list[dict[str, Any]]:
    found = state.spaces.get(space)
    now_ms = int(time.time() * 1000)
    return [_with_stats(state, space, m, now_ms) for m in found.mailboxes.values()] if found else []


@routes(
    "GET", SPACE_PREFIX + "/mailboxes", "The space's mailboxes (at most 1000), each with its stats (an extension); ?name= picks one by name",
    query={"name": STRING}, permission=READ, answer=A.MAILBOXES_WITH_STATS,
)
async def list_mailboxes(request: web.Request) -> web.Response:
    node, caller = node_of(request), caller_of(request)
    name = request.query.get("name")
    await node.confirm_leadership(caller)
    with node.read() as state:
        views = _mailboxes(state, caller.space)
    return json_response({"mailboxes": [view for view in views if name is None or view["name"] == name]})


@routes(
    "POST", SPACE_PREFIX + "/mailboxes", "Create a mailbox (CONFLICT if the name exists)",
    body={"name": NAME, "mode": _MODE, "backlogLimit": bounded(1, limits.backlog_limit_max)}, required=("name",), ok=201,
    errors=("VALIDATION_FAILED", "CONFLICT", "LIMIT_EXCEEDED"), permission=RESOURCE_CONFIG, answer=A.MAILBOX_WITH_STATS,
)
async def create_mailbox(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    args = {
        "name": req.text(body, "name", max_chars=limits.name_chars_max, required=True),
        "mode": req.text(body, "mode", max_chars=limits.name_chars_max),
        "backlog_limit": req.integer(body, "backlogLimit", minimum=1, maximum=limits.backlog_limit_max),
    }
    result = await req.propose(request, "mailbox.create", args)
    return json_response(_answer(request, result["mailbox"]), status=201)


@routes(
    "PUT", SPACE_PREFIX + "/mailboxes/by-name/{name}",
    "Declare a WORK mailbox (created when missing; a declared setting that differs is CONFLICT)",
    body={"maxAttempts": bounded(1, limits.attempts_max), "requirements": REQUIREMENTS}, path_schemas={"name": NAME},
    errors=("VALIDATION_FAILED", "CONFLICT", "LIMIT_EXCEEDED"), permission=WRITE, answer=A.MAILBOX_WITH_STATS, ok=201,
)
async def declare_mailbox(request: web.Request) -> web.Response:
    body = await req.json_body(request, required=False)
    requirements = req.requirements(body)
    if requirements is not None and not isinstance(requirements, dict):
        raise ApiError("VALIDATION_FAILED", "requirements must be an object of pools, quotas and budgets")
    args = {
        "name": request.match_info["name"],
        "max_attempts": req.integer(body, "maxAttempts", minimum=1, maximum=limits.attempts_max),
        "requirements": requirements,
    }
    result = await req.propose(request, "mailbox.declare", args)
    return json_response(_answer(request, result["mailbox"]), status=201 if result["created"] else 200)


def _mailbox_named(state: State, space: str, mailbox_id: str) -> str:
    found = state.spaces.get(space)
    name = found.mailbox_names.get(mailbox_id) if found is not None else None
    if name is None:
        raise ApiError("NOT_FOUND", f"mailbox {mailbox_id!r} not found")
    return name


@routes(
    "GET", SPACE_PREFIX + "/mailboxes/{id}", "A mailbox, with its stats (an extension)", errors=("NOT_FOUND",),
    permission=READ, answer=A.MAILBOX_WITH_STATS,
)
async def get_mailbox(request: web.Request) -> web.Response:
    node, caller = node_of(request), caller_of(request)
    await node.confirm_leadership(caller)
    with node.read() as state:
        name = _mailbox_named(state, caller.space, request.match_info["id"])
        mailbox = state.spaces[caller.space].mailboxes[name]
        return json_response(_with_stats(state, caller.space, mailbox, int(time.time() * 1000)))


@routes(
    "POST", SPACE_PREFIX + "/mailboxes/{id}/messages",
    "Send a message (keyless, or keyed by workKey: the same workKey in the run is the same message)",
    body={"scopeId": NAME, "payload": ANY_JSON, "workKey": KEY, "deadline": ISO_TIME}, required=("scopeId", "payload"), ok=201,
    errors=("VALIDATION_FAILED", "NOT_FOUND", "KEY_CONFLICT", "BACKLOG_FULL", "LIMIT_EXCEEDED", *_INACTIVE),
    permission=WRITE, answer=A.SENT,
)
async def send(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    _, encoded = req.payload(body, "payload", code="VALIDATION_FAILED")
    args = {
        "run_id": req.text(body, "scopeId", max_chars=limits.name_chars_max, required=True),
        "mailbox_id": request.match_info["id"],
        "message": True,
        "key": req.text(body, "workKey", max_chars=limits.key_chars_max),
        "input": encoded,
        "input_hash": req.sha256_hex(encoded),
        "deadline_ms": req.timestamp_ms(body, "deadline"),
    }
    result = await req.propose(request, "task.submit", args)
    answer = {"id": result["task_id"], "taskId": result["task_id"], "state": result["state"], "created": result["created"]}
    return json_response(answer, status=201 if result["created"] else 200)


@routes(
    "GET", SPACE_PREFIX + "/mailboxes/{id}/messages",
    f"The mailbox's messages and tasks, the newest {limits.messages_list_max}, oldest first",
    errors=("NOT_FOUND",), permission=READ, answer=A.MESSAGES,
)
async def list_messages(request: web.Request) -> web.Response:
    node, caller = node_of(request), caller_of(request)
    await node.confirm_leadership(caller)
    with node.read() as state:
        name = _mailbox_named(state, caller.space, request.match_info["id"])
        # Tasks are kept in creation order; a bounded look at the newest of this mailbox.
        found = (
            task for task in reversed(state.tasks.values()) if task.space == caller.space and task.mailbox == name
        )
        views = [
            {
                "id": task.id,
                "scopeId": task.run_id,
                "state": _MESSAGE_STATES.get(task.state, task.state),
                "attempt": task.attempt,
                "workKey": task.key,
                "payload": stored_value(task.input),
                "createdAt": iso(task.created_ms),
            }
            for task in itertools.islice(found, limits.messages_list_max)
        ]
    return json_response({"messages": views[::-1]})


@routes(
    "POST", SPACE_PREFIX + "/mailboxes/{id}/recv",
    "Take the oldest message under a lease, waiting up to waitMs; 204 when there is none",
    body=RECEIVE_BODY, required=("scopeId",), ok=200,
    errors=("VALIDATION_FAILED", "NOT_FOUND", *_INACTIVE), permission=WRITE, answer=A.RECEIVED_ONE_OR_MANY, empty=True,
)
async def recv(request: web.Request) -> web.StreamResponse:
    body = await req.json_body(request)
    args = receive_args(request, body, request.match_info["id"], include_descendants=False, tasks_only=False)
    given = await receive(request, body, args)
    if not given:
        return web.Response(status=204)
    if "max" in body:  # the batch extension
        return json_response({"messages": [message_of(one) for one in given]})
    return json_response(message_of(given[0]))
