"""Task groups on the published protocol's routes (PROTOCOL.md §5.10): create, submit and join
members, close (and the deprecated seal), verdicts by member, status.

`POST /task-groups {mailboxId, condition, threshold?, expectedMembers?, deadline?, parentScopeId?}`,
`GET /task-groups/{groupId}`, `POST /task-groups/{groupId}/tasks {taskKey, input, deadline?,
requirements?}`, `.../close`, `.../seal` (CONFLICT once finalized), `.../tasks/{taskId}/accept|reject`
and `.../join-task {taskId}`. Extensions of the one API on the same paths: `scopeId` in the create
body (the run the group is created from), `holder` in a verdict body (who gives it, else the
X-Runstate-Holder header), `attempts` in a member body, and `GET /task-groups/{groupId}/wait` (the
decision's long poll, which saves polling the status).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from runstate_server.actors import groups, limits
from runstate_server.actors.groups import Group, GroupState
from runstate_server.actors.state import State
from runstate_server.node._json import json_response
from runstate_server.node.api import _paging as paging
from runstate_server.node.api import _request as req
from runstate_server.node.api._poll import WAIT_MS_QUERY, long_poll
from runstate_server.node.api.routes import (
    ANY_JSON,
    ISO_TIME,
    READ,
    SPACE_PREFIX,
    WRITE,
    RouteTable,
    caller_of,
    holder_of,
    node_of,
)
from runstate_server.node.api.schemas import (
    BOOLEAN,
    HOLDER,
    INTEGER_OR_NULL,
    KEY,
    NAME,
    REQUIREMENTS,
    STRING,
    STRING_OR_NULL,
    TIME,
    TIME_OR_NULL,
    array,
    bounded,
    enum,
    nullable,
    obj,
)
from runstate_server.node.api.views import iso
from runstate_server.node.errors import ApiError

GROUP_STATE = enum("OPEN", "SEALED", "FINALIZED")
DECISION = obj({"state": GROUP_STATE, "outcome": nullable(enum("SUCCESS", "FAILURE")), "outcomeReason": STRING_OR_NULL})
GROUP = obj({
    **DECISION["properties"], "id": STRING, "groupId": STRING, "scopeId": STRING, "mailboxId": STRING_OR_NULL, "parentScopeId": STRING_OR_NULL, "mailbox": STRING,
    "condition": STRING, "threshold": INTEGER_OR_NULL, "expectedMembers": INTEGER_OR_NULL, "deadline": TIME_OR_NULL,
    "createdAt": TIME, "finalizedAt": TIME_OR_NULL,
    "members": array(obj({
        "taskId": STRING, "key": STRING, "state": STRING, "verdict": nullable(enum("ACCEPTED", "REJECTED")),
        "late": BOOLEAN, "verdictBy": STRING_OR_NULL,
    })),
})
VERDICT = obj({
    "taskId": STRING, "verdict": STRING, "verdictBy": STRING_OR_NULL, "late": BOOLEAN, "groupState": GROUP_STATE,
    "outcome": nullable(enum("SUCCESS", "FAILURE")), "outcomeReason": STRING_OR_NULL,
})

routes = RouteTable()

if TYPE_CHECKING:
    from runstate_server.node.server import Node

_INACTIVE = ("SCOPE_CANCELLED", "DEADLINE_EXCEEDED")
_MEMBERS = {"type": "integer", "minimum": 1, "maximum": limits.group_members_max}
_TASK_ID = {"taskId": NAME}


def group_view(state: State, group: Group) -> dict[str, Any]:
    space = state.spaces.get(group.space)
    mailbox = space.mailboxes.get(group.mailbox) if space is not None else None
    return {
        "id": group.id,
        "groupId": group.id,
        "scopeId": group.run_id,
        "mailboxId": mailbox.id if mailbox is not None else None,
        "parentScopeId": group.parent_id,
        "mailbox": group.mailbox,
        "condition": group.condition,
        "threshold": group.threshold,
        "expectedMembers": group.expected_members,
        "state": group.state,
        "outcome": group.outcome,
        "outcomeReason": group.outcome_reason,
        "deadline": iso(group.deadline_ms),
        "createdAt": iso(group.created_ms),
        "finalizedAt": iso(group.finalized_ms),
        "members": [
            {
                "taskId": task_id,
                "key": key,
                "state": task_state,
                "verdict": group.verdicts.get(task_id),
                "late": task_id in group.late,
                "verdictBy": group.verdict_by.get(task_id),
            }
            for task_id in group.members
            for key, task_state in (groups.member_state(state, group, task_id),)
        ],
    }


def _render(node: Node, space: str, group_id: str) -> dict[str, Any]:
    with node.read() as state:
        group = state.groups.get(group_id)
        if group is None or group.space != space:
            raise ApiError("NOT_FOUND", f"group {group_id!r} not found")
        return group_view(state, group)


def _decision(result: dict[str, Any]) -> dict[str, Any]:
    return {"state": result["state"], "outcome": result["outcome"], "outcomeReason": result["outcome_reason"]}


def _task_id(body: dict[str, Any]) -> str:
    task_id = req.text(body, "taskId", max_chars=limits.name_chars_max, required=True)
    assert task_id is not None
    return task_id


# -- the published protocol's routes (PROTOCOL.md §5.10) -------------------------------------------

_PROTOCOL = SPACE_PREFIX + "/task-groups"
_MEMBER = obj({
    "taskId": STRING, "id": STRING, "taskKey": STRING, "created": BOOLEAN, "state": STRING, "groupState": GROUP_STATE,
})
_MEMBER_BODY = {
    "taskKey": KEY, "input": ANY_JSON, "deadline": ISO_TIME, "requirements": REQUIREMENTS,
    "attempts": bounded(1, limits.attempts_max),
}
_NO_BODY = {"holder": HOLDER}  # accept/reject take {} or no body; our SDK names who gives the verdict


@routes(
    "POST", _PROTOCOL,
    "Create a task group with a run of its own (a child of parentScopeId when given) delivering its members "
    "through the WORK mailbox mailboxId",
    body={"mailboxId": NAME, "condition": {"type": "string", "enum": list(groups.Condition.ALL)},
          "threshold": _MEMBERS, "expectedMembers": _MEMBERS, "deadline": ISO_TIME, "parentScopeId": NAME,
          # Extension: the run the group is created from (our SDK's run.groups), refused when it stopped.
          "scopeId": NAME},
    required=("mailboxId", "condition"),
    ok=201, errors=("VALIDATION_FAILED", "NOT_FOUND", "LIMIT_EXCEEDED", *_INACTIVE), permission=WRITE, answer=GROUP,
)
async def protocol_create(request: web.Request) -> web.Response:
    node, caller = node_of(request), caller_of(request)
    body = await req.json_body(request)
    members_max = limits.group_members_max
    args = {
        "mailbox_id": req.text(body, "mailboxId", max_chars=limits.name_chars_max, required=True),
        "condition": req.text(body, "condition", max_chars=limits.name_chars_max, required=True),
        "threshold": req.integer(body, "threshold", minimum=1, maximum=members_max),
        "expected_members": req.integer(body, "expectedMembers", minimum=1, maximum=members_max),
        "deadline_ms": req.timestamp_ms(body, "deadline"),
        "parent_id": req.text(body, "parentScopeId", max_chars=limits.name_chars_max),
        "run_id": req.text(body, "scopeId", max_chars=limits.name_chars_max),
        "retention_ms": node.config.retention_ms,
    }
    result = await req.propose(request, "group.create", args)
    return json_response(_render(node, caller.space, result["group_id"]), status=201)


@routes(
    "GET", _PROTOCOL + "/{groupId}", "A group's state, decision, expectedMembers and members (task state, verdict, late)",
    errors=("NOT_FOUND",), permission=READ, answer=GROUP,
)
async def protocol_status(request: web.Request) -> web.Response:
    node, caller = node_of(request), caller_of(request)
    await node.confirm_leadership(caller)
    return json_response(_render(node, caller.space, request.match_info["groupId"]))


@routes(
    "GET", _PROTOCOL + "/{groupId}/wait",
    "Extension (saves polling): a long poll that answers when the group is FINALIZED, or after waitMs with it undecided",
    query=WAIT_MS_QUERY, errors=("NOT_FOUND", "VALIDATION_FAILED"), permission=READ, answer=GROUP,
)
async def protocol_wait(request: web.Request) -> web.Response:
    node, caller, group_id = node_of(request), caller_of(request), request.match_info["groupId"]
    view = await long_poll(
        request, node, groups.group_key(group_id), lambda: _render(node, caller.space, group_id),
        lambda view: view["state"] == GroupState.FINALIZED,
    )
    return json_response(view)


@routes(
    "POST", _PROTOCOL + "/{groupId}/tasks",
    "Add a member: a task of the group's run and mailbox. The same taskKey (and input) again answers the same task, "
    "even once the group is closed",
    body=_MEMBER_BODY, required=("input",), ok=201,
    errors=("VALIDATION_FAILED", "NOT_FOUND", "CONFLICT", "KEY_CONFLICT", "LIMIT_EXCEEDED", "BACKLOG_FULL", *_INACTIVE),
    permission=WRITE, answer=_MEMBER,
)
async def protocol_submit(request: web.Request) -> web.Response:
    node, group_id = node_of(request), request.match_info["groupId"]
    body = await req.json_body(request)
    args = {
        "group_id": group_id,
        **req.task_fields(body),
        "deadline_ms": req.timestamp_ms(body, "deadline"),
        "requirements": req.requirements(body),  # checked by the core (tasks.needs_of)
    }
    result = await req.propose(request, "group.submit", args)
    with node.read() as state:
        task = state.tasks[result["task_id"]]
        answer = {"taskId": task.id, "id": task.id, "taskKey": task.key, "created": result["created"],
                  "state": task.state, "groupState": result["group_state"]}
    return json_response(answer, status=201 if result["created"] else 200)


@routes(
    "POST", _PROTOCOL + "/{groupId}/close",
    "Close the group to new members and decide at once what the full member list decides: {state, outcome, "
    "outcomeReason}. Idempotent; a finalized group answers its decision",
    errors=("NOT_FOUND",), permission=WRITE, answer=DECISION,
)
async def protocol_close(request: web.Request) -> web.Response:
    await req.json_body(request, required=False)
    result = await req.propose(request, "group.close", {"group_id": request.match_info["groupId"]})
    return json_response(_decision(result))


@routes(
    "POST", _PROTOCOL + "/{groupId}/seal",
    "Deprecated close: the same, but CONFLICT when the group was finalized before",
    errors=("NOT_FOUND", "CONFLICT"), permission=WRITE, answer=DECISION,
)
async def protocol_seal(request: web.Request) -> web.Response:
    await req.json_body(request, required=False)
    result = await req.propose(request, "group.seal", {"group_id": request.match_info["groupId"]})
    return json_response(_decision(result))


async def _protocol_judge(request: web.Request, kind: str) -> web.Response:
    node, group_id = node_of(request), request.match_info["groupId"]
    body = await req.json_body(request, required=False)
    args = {"group_id": group_id, "task_id": request.match_info["taskId"], "holder": holder_of(request, body)}
    result = await req.propose(request, kind, args)
    with node.read() as state:
        group = state.groups.get(group_id)  # None only if its retention ended meanwhile
        verdict_by = group.verdict_by.get(result["task_id"]) if group is not None else None
    return json_response({
        "taskId": result["task_id"], "verdict": result["verdict"], "verdictBy": verdict_by, "late": result["late"],
        "groupState": result["state"], "outcome": result["outcome"], "outcomeReason": result["outcome_reason"],
    })


@routes(
    "POST", _PROTOCOL + "/{groupId}/tasks/{taskId}/accept",
    "Accept a SUCCEEDED member (idempotent; recorded as late after the decision, which it never changes)",
    body=_NO_BODY, errors=("VALIDATION_FAILED", "NOT_FOUND", "CONFLICT"), permission=WRITE, answer=VERDICT,
)
async def protocol_accept(request: web.Request) -> web.Response:
    return await _protocol_judge(request, "group.accept")


@routes(
    "POST", _PROTOCOL + "/{groupId}/tasks/{taskId}/reject",
    "Reject a finished member (idempotent; recorded as late after the decision, which it never changes)",
    body=_NO_BODY, errors=("VALIDATION_FAILED", "NOT_FOUND", "CONFLICT"), permission=WRITE, answer=VERDICT,
)
async def protocol_reject(request: web.Request) -> web.Response:
    return await _protocol_judge(request, "group.reject")


@routes(
    "POST", _PROTOCOL + "/{groupId}/join-task",
    "Add an existing task as a member while the group is open: one of the group's run, or an outside one (of any run "
    "of the space, e.g. the run the group was made from) in a WORK mailbox that is no member of another group",
    body=_TASK_ID, required=("taskId",), errors=("VALIDATION_FAILED", "NOT_FOUND", "CONFLICT", "LIMIT_EXCEEDED", *_INACTIVE),
    permission=WRITE, answer=obj({"taskId": STRING, "joined": BOOLEAN, "groupState": GROUP_STATE}),
)
async def protocol_join(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    args = {"group_id": request.match_info["groupId"], "task_id": _task_id(body)}
    result = await req.propose(request, "group.join", args)
    return json_response({"taskId": result["task_id"], "joined": result["joined"], "groupState": result["group_state"]})


# -- the list (an extension for the console) -------------------------------------------------------

_GROUP_STATES = (GroupState.OPEN, GroupState.SEALED, GroupState.FINALIZED)
GROUPS_PAGE = obj({"taskGroups": array(GROUP), "nextCursor": STRING_OR_NULL})


@routes(
    "GET", _PROTOCOL,
    f"Extension: the space's task groups, newest first, {limits.list_page_default} a page (limit: at most "
    f"{limits.list_page_max}); scopeId (the run it was created from, or its own run) and state filter them; "
    "nextCursor resumes",
    query={**paging.PAGE_QUERY, "scopeId": STRING, "state": {"type": "string", "enum": list(_GROUP_STATES)}},
    errors=("VALIDATION_FAILED",), permission=READ, answer=GROUPS_PAGE,
)
async def list_groups(request: web.Request) -> web.Response:
    node, caller = node_of(request), caller_of(request)
    limit, after = paging.page_args(request)
    wanted_state = paging.state_filter(request, _GROUP_STATES)
    scope_id = paging.text_filter(request, "scopeId")
    space = caller.space

    def matches(group: Group) -> bool:
        return (
            group.space == space
            and (wanted_state is None or group.state == wanted_state)
            and (scope_id is None or scope_id in (group.parent_id, group.run_id))
        )

    await node.confirm_leadership(caller)
    with node.read() as state:
        found, next_cursor = paging.page(reversed(state.groups.values()), paging.creation_key, matches, limit, after)
        views = [group_view(state, group) for group in found]
    return json_response({"taskGroups": views, "nextCursor": next_cursor})
