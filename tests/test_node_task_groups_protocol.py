"""Task groups on the published protocol's routes (PROTOCOL.md §5.10), against a real dev node:
create, status, members, close (and the deprecated seal), verdicts by member, join-task, and a
gather as 0.3.0 drives it: the group's run a child of the caller's run, its members admitted by a
worker serving that run with includeDescendants."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tests._http import Api, call, mailbox_id, new_space
from tests._nodes import DevNode


@pytest.fixture
def api(dev_node: DevNode) -> Api:
    return Api(dev_node.url, space=new_space(dev_node.url, "groups"))


@pytest.fixture
def mailbox(api: Api) -> str:
    return mailbox_id(api, "work")


def new_run(api: Api, **body: Any) -> str:
    return str(api.ok("POST", "/v1/scopes", body)["id"])


def create(api: Api, mailbox: str, **body: Any) -> dict[str, Any]:
    body.setdefault("condition", "FIRST_ACCEPTED")
    return dict(api.ok("POST", "/v1/task-groups", {"mailboxId": mailbox, **body}))


def member(api: Api, group_id: str, key: str, task_input: Any = None, **body: Any) -> dict[str, Any]:
    return dict(api.ok("POST", f"/v1/task-groups/{group_id}/tasks", {"taskKey": key, "input": task_input, **body}))


def admit(api: Api, run_id: str, mailbox: str, **body: Any) -> dict[str, Any] | None:
    """One admission of a worker serving `run_id` (and the runs below it: includeDescendants)."""
    wire = {"scopeId": run_id, "mailboxId": mailbox, "holder": "w", "holderSession": "s1", "leaseSeconds": 30,
            "includeDescendants": True, **body}
    status, answer = api("POST", "/v1/tasks/admit", wire)
    if status == 204:
        return None
    assert status == 200, (status, answer)
    return dict(answer)


def complete(api: Api, given: dict[str, Any], payload: Any) -> None:
    api.ok("POST", f"/v1/messages/{given['messageId']}/complete", {"token": given["token"], "result": {"payload": payload}})


def bare_post(api: Api, path: str) -> tuple[int, Any]:
    """A POST with no body at all (no content-type), as the 0.2 client sends close, seal and verdicts."""
    return call(api.base_url, "POST", api.space_path(path))


def test_create_status_and_members(api: Api, mailbox: str) -> None:
    parent = new_run(api)
    created = create(api, mailbox, condition="N_ACCEPTED", threshold=2, expectedMembers=3, parentScopeId=parent)
    group_id, scope_id = created["groupId"], created["scopeId"]
    assert group_id.startswith("grp_") and created["id"] == group_id
    assert (created["state"], created["outcome"], created["outcomeReason"]) == ("OPEN", None, None)
    assert (created["mailboxId"], created["parentScopeId"], created["expectedMembers"]) == (mailbox, parent, 3)
    assert api.ok("GET", f"/v1/scopes/{scope_id}")["parentId"] == parent

    first = member(api, group_id, "m-1", {"n": 1})
    assert set(first) == {"taskId", "id", "taskKey", "created", "state", "groupState"}
    assert (first["taskKey"], first["created"], first["state"], first["groupState"]) == ("m-1", True, "QUEUED", "OPEN")
    # The member is a task of the group's run and mailbox; the same key and input is the same task.
    task = api.ok("GET", f"/v1/tasks/{first['taskId']}")
    assert (task["scopeId"], task["mailboxId"], task["input"]) == (scope_id, mailbox, {"n": 1})
    again = member(api, group_id, "m-1", {"n": 1})
    assert (again["taskId"], again["created"]) == (first["taskId"], False)
    assert api.error("POST", f"/v1/task-groups/{group_id}/tasks", {"taskKey": "m-1", "input": 2}) == (409, "KEY_CONFLICT")

    deadline = (datetime.now(timezone.utc) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    member(api, group_id, "m-2", 2, deadline=deadline)
    third = member(api, group_id, "m-3", 3, requirements={"pools": []})
    assert third["groupState"] == "SEALED"  # the expectedMembers-th member closes the group
    view = api.ok("GET", f"/v1/task-groups/{group_id}")
    assert (view["state"], view["expectedMembers"]) == ("SEALED", 3)
    assert [(m["key"], m["state"], m["verdict"], m["late"]) for m in view["members"]] == [
        ("m-1", "QUEUED", None, False), ("m-2", "QUEUED", None, False), ("m-3", "QUEUED", None, False),
    ]
    assert api.ok("GET", f"/v1/tasks/{view['members'][1]['taskId']}")["deadline"][:19] == deadline[:19]
    # Closed: a new member is refused; an existing one still answers.
    assert api.error("POST", f"/v1/task-groups/{group_id}/tasks", {"taskKey": "m-4", "input": 4}) == (409, "CONFLICT")
    assert member(api, group_id, "m-3", 3)["taskId"] == third["taskId"]


def test_close_answers_exactly_the_decision_and_seal_conflicts_once_finalized(api: Api, mailbox: str) -> None:
    """0.2.0's test_group_stays_open_until_closed, on the wire."""
    group_id = create(api, mailbox, condition="N_ACCEPTED", threshold=2)["groupId"]
    member(api, group_id, "g-1", {"n": 1})
    assert api.ok("GET", f"/v1/task-groups/{group_id}")["state"] == "OPEN"
    status, closed = bare_post(api, f"/v1/task-groups/{group_id}/close")
    assert status == 200
    assert closed == {"state": "FINALIZED", "outcome": "FAILURE", "outcomeReason": "threshold_unreachable"}
    assert api.ok("POST", f"/v1/task-groups/{group_id}/close", {}) == closed  # idempotent
    assert bare_post(api, f"/v1/task-groups/{group_id}/close") == (200, closed)
    status, sealed = bare_post(api, f"/v1/task-groups/{group_id}/seal")
    assert (status, sealed["error"]["code"]) == (409, "CONFLICT")

    # seal of an undecided group closes it as close does.
    other = create(api, mailbox, condition="ALL_TERMINAL")["groupId"]
    member(api, other, "x", 1)
    assert bare_post(api, f"/v1/task-groups/{other}/seal") == (200, {"state": "SEALED", "outcome": None, "outcomeReason": None})
    assert api.ok("POST", f"/v1/task-groups/{other}/seal", {})["state"] == "SEALED"


def test_gather_members_admitted_from_the_parent_run(api: Api, mailbox: str) -> None:
    """A worker serving the caller's run (includeDescendants) admits the members of the group's
    child run; the first accepted member finalizes the group and cancels its run in the same step."""
    run_id = new_run(api)
    created = create(api, mailbox, condition="FIRST_ACCEPTED", expectedMembers=3, parentScopeId=run_id)
    group_id, scope_id = created["groupId"], created["scopeId"]
    ids = [member(api, group_id, f"k{n}", n)["taskId"] for n in range(3)]
    assert admit(api, run_id, mailbox, includeDescendants=False) is None  # only the group's run holds them
    given = admit(api, run_id, mailbox)
    assert given is not None and given["taskId"] == ids[0] and given["payload"] == 0
    second = admit(api, run_id, mailbox)
    assert second is not None and second["taskId"] == ids[1]
    complete(api, given, {"ok": True})

    # Verdicts by member, with {} or no body at all.
    assert api.error("POST", f"/v1/task-groups/{group_id}/tasks/{ids[1]}/accept", {}) == (409, "CONFLICT")  # running
    assert api.error("POST", f"/v1/task-groups/{group_id}/tasks/tsk_nope/accept", {}) == (404, "NOT_FOUND")
    status, verdict = bare_post(api, f"/v1/task-groups/{group_id}/tasks/{ids[0]}/accept")
    assert status == 200
    assert (verdict["verdict"], verdict["late"], verdict["groupState"], verdict["outcome"], verdict["outcomeReason"]) == (
        "ACCEPTED", False, "FINALIZED", "SUCCESS", "first_accepted",
    )
    # Finalizing cancelled the group's run: unfinished members, and workers asking for more.
    assert api.ok("GET", f"/v1/scopes/{scope_id}")["storedState"] == "CANCELLED"
    assert [api.ok("GET", f"/v1/tasks/{task_id}")["state"] for task_id in ids] == ["SUCCEEDED", "CANCELLED", "CANCELLED"]
    assert admit(api, run_id, mailbox) is None
    # A late verdict is recorded and changes nothing; close answers the recorded decision.
    late = api.ok("POST", f"/v1/task-groups/{group_id}/tasks/{ids[1]}/reject", {})
    assert (late["verdict"], late["late"], late["outcome"]) == ("REJECTED", True, "SUCCESS")
    assert api.ok("POST", f"/v1/task-groups/{group_id}/close", {}) == {
        "state": "FINALIZED", "outcome": "SUCCESS", "outcomeReason": "first_accepted",
    }
    view = api.ok("GET", f"/v1/task-groups/{group_id}/wait?waitMs=0")
    assert [(m["verdict"], m["late"]) for m in view["members"]] == [("ACCEPTED", False), ("REJECTED", True), (None, False)]
    # The gather's cleanup cancels the group's run again: a stopped run, not an error to the client.
    assert api("POST", f"/v1/scopes/{scope_id}/cancel", {})[0] in (200, 409)


def test_join_task_and_bad_input(api: Api, mailbox: str) -> None:
    group = create(api, mailbox, condition="ALL_TERMINAL")
    group_id, scope_id = group["groupId"], group["scopeId"]
    outside = api.ok("POST", "/v1/tasks", {"scopeId": scope_id, "mailboxId": mailbox, "taskKey": "o", "input": 1})
    joined = api.ok("POST", f"/v1/task-groups/{group_id}/join-task", {"taskId": outside["taskId"]})
    assert joined == {"taskId": outside["taskId"], "joined": True, "groupState": "OPEN"}
    assert api.ok("POST", f"/v1/task-groups/{group_id}/join-task", {"taskId": outside["taskId"]})["joined"] is False
    elsewhere = api.ok("POST", "/v1/tasks", {"scopeId": new_run(api), "mailboxId": mailbox, "taskKey": "e", "input": 1})
    path = f"/v1/task-groups/{group_id}/join-task"
    assert api.ok("POST", path, {"taskId": elsewhere["taskId"]})["joined"] is True  # an outside task joins
    other = create(api, mailbox, condition="ALL_TERMINAL")["groupId"]
    assert api.error("POST", f"/v1/task-groups/{other}/join-task", {"taskId": elsewhere["taskId"]}) == (409, "CONFLICT")
    assert api.error("POST", path, {"taskId": "tsk_nope"}) == (404, "NOT_FOUND")
    assert api.error("POST", path, {}) == (400, "VALIDATION_FAILED")
    api.ok("POST", f"/v1/task-groups/{group_id}/close", {})
    late = api.ok("POST", "/v1/tasks", {"scopeId": scope_id, "mailboxId": mailbox, "taskKey": "l", "input": 1})
    assert api.error("POST", path, {"taskId": late["taskId"]}) == (409, "CONFLICT")

    inbox = mailbox_id(api, "inbox", mode="INBOX")
    for bad, code in [
        ({"mailboxId": mailbox, "condition": "MOST"}, (400, "VALIDATION_FAILED")),
        ({"mailboxId": mailbox, "condition": "N_ACCEPTED"}, (400, "VALIDATION_FAILED")),
        ({"mailboxId": mailbox, "condition": "ALL_TERMINAL", "expectedMembers": 101}, (400, "VALIDATION_FAILED")),
        ({"mailboxId": mailbox, "condition": "N_ACCEPTED", "threshold": 3, "expectedMembers": 2}, (400, "VALIDATION_FAILED")),
        ({"mailboxId": mailbox, "condition": "ALL_TERMINAL", "mailbox": "work"}, (400, "VALIDATION_FAILED")),
        ({"condition": "ALL_TERMINAL"}, (400, "VALIDATION_FAILED")),
        ({"mailboxId": "mbx_nope", "condition": "ALL_TERMINAL"}, (404, "NOT_FOUND")),
        ({"mailboxId": inbox, "condition": "ALL_TERMINAL"}, (400, "VALIDATION_FAILED")),
        ({"mailboxId": mailbox, "condition": "ALL_TERMINAL", "parentScopeId": "run_nope"}, (404, "NOT_FOUND")),
    ]:
        assert api.error("POST", "/v1/task-groups", bad) == code, bad
    stopped = new_run(api)
    api.ok("POST", f"/v1/scopes/{stopped}/cancel", {})
    assert api.error("POST", "/v1/task-groups", {"mailboxId": mailbox, "condition": "ALL_TERMINAL",
                                                 "parentScopeId": stopped}) == (409, "SCOPE_CANCELLED")
    assert api.error("GET", "/v1/task-groups/grp_nope") == (404, "NOT_FOUND")
    assert api.error("POST", "/v1/task-groups/grp_nope/close", {}) == (404, "NOT_FOUND")
    assert api.error("POST", f"/v1/task-groups/{group_id}/tasks", {"taskKey": "k", "input": 1, "key": "k"}) == (
        400, "VALIDATION_FAILED",
    )
    open_id = create(api, mailbox)["groupId"]
    assert api.error("POST", f"/v1/task-groups/{open_id}/tasks", {"taskKey": "k", "input": 1, "requirements": 3}) == (
        400, "VALIDATION_FAILED",
    )
