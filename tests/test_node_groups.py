"""Task groups over HTTP, against a real dev node."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tests._http import Api, new_space, recv, recv_path, settle_error, settle_ok, task_ok
from tests._nodes import DevNode

MAILBOX = "reviews"
JOIN_TIMEOUT_S = 20.0


class GroupsApi(Api):
    mailbox_id = ""  # the id of MAILBOX in the space


@pytest.fixture
def api(dev_node: DevNode) -> GroupsApi:
    api = GroupsApi(dev_node.url, space=new_space(dev_node.url, "groups"))
    api.mailbox_id = api.ok("POST", "/v1/mailboxes", {"name": MAILBOX, "mode": "WORK"})["id"]
    return api


def new_group(api: GroupsApi, **body: Any) -> tuple[str, dict[str, Any]]:
    """A run and a group created from it (under it unless parentScopeId is given otherwise)."""
    run_id = api.ok("POST", "/v1/scopes", {})["id"]
    body = {"mailboxId": api.mailbox_id, "scopeId": run_id, "parentScopeId": run_id, **body}
    return run_id, api.ok("POST", "/v1/task-groups", body)


def submit(api: GroupsApi, group: dict[str, Any], *keys: str) -> list[str]:
    return [api.ok("POST", f"/v1/task-groups/{group['id']}/tasks", {"input": {"draft": key}, "taskKey": key})["id"]
            for key in keys]


def work(api: GroupsApi, group: dict[str, Any], count: int, how: str = "complete") -> list[str]:
    """A worker on the group's run takes `count` members and settles them with `how`; returns
    their task ids."""
    deliveries = recv(api, group["scopeId"], MAILBOX, max=count, leaseMs=60_000)
    assert len(deliveries) == count
    for delivery in deliveries:
        body = {"result": {"payload": delivery["input"]}} if how == "complete" else {}
        settle_ok(api, delivery, how, body)
    return [delivery["taskId"] for delivery in deliveries]


def verdict(api: GroupsApi, group: dict[str, Any], kind: str, task_id: str) -> dict[str, Any]:
    answer: dict[str, Any] = api.ok("POST", f"/v1/task-groups/{group['id']}/tasks/{task_id}/{kind}")
    return answer


def test_twelve_drafts_threshold_five_finalize_once_and_cancel_the_rest(api: GroupsApi) -> None:
    run_id, group = new_group(api, condition="N_ACCEPTED", threshold=5)
    assert (group["state"], group["scopeId"] != run_id, group["parentScopeId"]) == ("OPEN", True, run_id)
    task_ids = submit(api, group, *(f"draft-{i}" for i in range(12)))
    assert api.ok("POST", f"/v1/task-groups/{group['id']}/close") == {"state": "SEALED", "outcome": None,
                                                                  "outcomeReason": None}
    succeeded = work(api, group, 8)
    (held,) = recv(api, group["scopeId"], MAILBOX, leaseMs=60_000)

    woken: list[Any] = []
    waiter = threading.Thread(
        target=lambda: woken.append(api.ok("GET", f"/v1/task-groups/{group['id']}/wait?waitMs=20000"))
    )
    waiter.start()
    # Eight reviewers accept at once: five decide, three are late.
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda task_id: verdict(api, group, "accept", task_id), succeeded))
    waiter.join(JOIN_TIMEOUT_S)

    assert sorted(answer["late"] for answer in answers) == [False] * 5 + [True] * 3
    deciding = [a for a in answers if a["groupState"] == "FINALIZED" and not a["late"]]
    assert len(deciding) == 1  # exactly one accept finalized the group
    assert all((a["outcome"], a["outcomeReason"]) == ("SUCCESS", "threshold_reached") for a in answers if a["late"])
    status = api.ok("GET", f"/v1/task-groups/{group['id']}")
    assert (status["state"], status["outcome"], status["outcomeReason"]) == ("FINALIZED", "SUCCESS", "threshold_reached")
    assert woken and woken[0]["finalizedAt"] == status["finalizedAt"]
    states = {m["taskId"]: m["state"] for m in status["members"]}
    assert [m["taskId"] for m in status["members"]] == task_ids
    assert sorted(states[t] for t in task_ids if t not in succeeded) == ["CANCELLED"] * 4
    assert sum(m["verdict"] == "ACCEPTED" and not m["late"] for m in status["members"]) == 5
    # The group's run is cancelled: no more work for anyone.
    assert api.error("POST", recv_path(api, MAILBOX), {"scopeId": group["scopeId"]}) == (409, "SCOPE_CANCELLED")
    assert settle_error(api, held, "complete", {}) == (409, "SCOPE_CANCELLED")
    assert api.error("POST", f"/v1/task-groups/{group['id']}/tasks", {"input": 1, "taskKey": "new"}) == (409, "CONFLICT")
    assert api.ok("GET", f"/v1/scopes/{group['scopeId']}")["storedState"] == "CANCELLED"
    assert api.ok("GET", f"/v1/scopes/{run_id}")["storedState"] == "ACTIVE"  # the parent goes on
    assert api.ok("POST", f"/v1/task-groups/{group['id']}/close")["outcomeReason"] == "threshold_reached"


def test_a_threshold_out_of_reach_after_close_fails_the_group(api: GroupsApi) -> None:
    _, group = new_group(api, condition="N_ACCEPTED", threshold=2)
    submit(api, group, "a", "b", "c")
    (done,) = work(api, group, 1)
    assert verdict(api, group, "reject", done)["groupState"] == "OPEN"  # open: more could join
    assert api.ok("POST", f"/v1/task-groups/{group['id']}/close")["state"] == "SEALED"
    work(api, group, 1, how="reject")  # FAILED: only one member left that could be accepted
    status = api.ok("GET", f"/v1/task-groups/{group['id']}/wait?waitMs=5000")
    assert (status["state"], status["outcome"], status["outcomeReason"]) == (
        "FINALIZED", "FAILURE", "threshold_unreachable"
    )
    assert [m["state"] for m in status["members"]] == ["SUCCEEDED", "FAILED", "CANCELLED"]


def test_close_decides_at_once_when_the_full_list_decides(api: GroupsApi) -> None:
    _, group = new_group(api, condition="N_ACCEPTED", threshold=3)
    submit(api, group, "a", "b")
    assert api.ok("POST", f"/v1/task-groups/{group['id']}/close") == {
        "state": "FINALIZED", "outcome": "FAILURE", "outcomeReason": "threshold_unreachable"
    }


def test_expected_members_closes_the_group_and_resubmits_return_members(api: GroupsApi) -> None:
    _, group = new_group(api, condition="ALL_TERMINAL", expectedMembers=2)
    path = f"/v1/task-groups/{group['id']}/tasks"
    first = api.ok("POST", path, {"input": {"n": 1}, "taskKey": "one"})
    assert (first["created"], first["groupState"]) == (True, "OPEN")
    second = api.ok("POST", path, {"input": {"n": 2}, "taskKey": "two"})
    assert (second["created"], second["groupState"]) == (True, "SEALED")
    assert api.error("POST", path, {"input": {"n": 3}, "taskKey": "three"}) == (409, "CONFLICT")
    status, again = api("POST", path, {"input": {"n": 1}, "taskKey": "one"})
    assert (status, again["id"], again["created"]) == (200, first["id"], False)
    assert api.error("POST", path, {"input": {"n": 9}, "taskKey": "one"}) == (409, "KEY_CONFLICT")


def test_late_verdicts_are_recorded_and_change_nothing(api: GroupsApi) -> None:
    _, group = new_group(api, condition="FIRST_ACCEPTED")
    submit(api, group, "a", "b", "c")
    first, second = work(api, group, 2)
    decided = verdict(api, group, "accept", first)
    assert (decided["groupState"], decided["outcome"], decided["outcomeReason"], decided["late"]) == (
        "FINALIZED", "SUCCESS", "first_accepted", False
    )
    late = verdict(api, group, "reject", second)
    assert (late["verdict"], late["late"], late["outcome"]) == ("REJECTED", True, "SUCCESS")
    assert verdict(api, group, "reject", second) == late  # idempotent
    cancelled = api.ok("GET", f"/v1/task-groups/{group['id']}")["members"][2]
    assert cancelled["state"] == "CANCELLED"
    accept = f"/v1/task-groups/{group['id']}/tasks/{{}}/accept"
    assert api.error("POST", accept.format(cancelled["taskId"])) == (409, "CONFLICT")
    assert api.error("POST", accept.format(second)) == (409, "CONFLICT")
    members = api.ok("GET", f"/v1/task-groups/{group['id']}")["members"]
    assert [(m["verdict"], m["late"]) for m in members] == [("ACCEPTED", False), ("REJECTED", True), (None, False)]


def test_join_task_adds_a_task_of_the_group_run_or_an_outside_one(api: GroupsApi) -> None:
    run_id, group = new_group(api, condition="ALL_TERMINAL")
    path = f"/v1/task-groups/{group['id']}/join-task"
    direct = task_ok(api, group["scopeId"], {"input": 1}, MAILBOX)["id"]
    assert api.ok("POST", path, {"taskId": direct}) == {"taskId": direct, "joined": True, "groupState": "OPEN"}
    # A task of the run the group was made from joins too, and is worked there.
    outside = task_ok(api, run_id, {"input": 2}, MAILBOX)["id"]
    assert api.ok("POST", path, {"taskId": outside}) == {"taskId": outside, "joined": True, "groupState": "OPEN"}
    (delivery,) = recv(api, run_id, MAILBOX, leaseMs=60_000)
    settle_ok(api, delivery, "complete", {"result": {"payload": 2}})
    (task_id,) = work(api, group, 1)
    verdict(api, group, "accept", task_id)
    verdict(api, group, "accept", outside)
    assert api.ok("POST", f"/v1/task-groups/{group['id']}/close") == {
        "state": "FINALIZED", "outcome": "SUCCESS", "outcomeReason": "all_terminal"
    }
    members = api.ok("GET", f"/v1/task-groups/{group['id']}")["members"]
    assert [(m["taskId"], m["state"], m["verdict"]) for m in members] == [
        (direct, "SUCCEEDED", "ACCEPTED"), (outside, "SUCCEEDED", "ACCEPTED")
    ]
    assert api.ok("GET", f"/v1/scopes/{run_id}")["storedState"] == "ACTIVE"  # the outside task's run goes on


def test_deadline_and_parent_cancel_fail_the_group(api: GroupsApi) -> None:
    soon = (datetime.now(timezone.utc) + timedelta(milliseconds=500)).isoformat()
    _, timed = new_group(api, condition="FIRST_ACCEPTED", deadline=soon)
    submit(api, timed, "a")
    status = api.ok("GET", f"/v1/task-groups/{timed['id']}/wait?waitMs=10000")
    assert (status["state"], status["outcome"], status["outcomeReason"]) == ("FINALIZED", "FAILURE", "deadline")
    assert status["members"][0]["state"] == "CANCELLED"
    run_id, group = new_group(api, condition="ALL_TERMINAL")
    api.ok("POST", f"/v1/scopes/{run_id}/cancel")
    status = api.ok("GET", f"/v1/task-groups/{group['id']}")
    assert (status["state"], status["outcome"], status["outcomeReason"]) == ("FINALIZED", "FAILURE", "cancelled")


def test_bad_requests(api: GroupsApi) -> None:
    run_id = api.ok("POST", "/v1/scopes", {})["id"]
    path, mailbox = "/v1/task-groups", {"mailboxId": api.mailbox_id, "scopeId": run_id}
    assert api.error("POST", path, {"mailboxId": "mbx_missing", "condition": "FIRST_ACCEPTED"}) == (404, "NOT_FOUND")
    assert api.error("POST", path, {**mailbox, "condition": "SOME"}) == (400, "VALIDATION_FAILED")
    assert api.error("POST", path, {**mailbox, "condition": "N_ACCEPTED"}) == (400, "VALIDATION_FAILED")
    assert api.error("POST", path, {**mailbox, "condition": "N_ACCEPTED", "threshold": 3,
                                    "expectedMembers": 2}) == (400, "VALIDATION_FAILED")
    assert api.error("POST", path, {**mailbox, "condition": "ALL_TERMINAL", "deadline": "soon"}) == (
        400, "VALIDATION_FAILED"
    )
    assert api.error("POST", path, {**mailbox, "scopeId": "run_nope", "condition": "ALL_TERMINAL"}) == (
        404, "NOT_FOUND"
    )
    assert api.error("GET", "/v1/task-groups/grp_nope") == (404, "NOT_FOUND")
    assert api.error("POST", "/v1/task-groups/grp_nope/close") == (404, "NOT_FOUND")
    _, group = new_group(api, condition="ALL_TERMINAL")
    assert api.error("POST", f"/v1/task-groups/{group['id']}/tasks/tsk_nope/accept") == (404, "NOT_FOUND")


def test_the_old_routes_are_gone(api: GroupsApi) -> None:
    """One API: the routes of task groups, barriers and timers before the protocol's answer 404."""
    run_id = api.ok("POST", "/v1/scopes", {})["id"]
    _, group = new_group(api, condition="ALL_TERMINAL")
    for method, path, body in (
        ("POST", f"/v1/scopes/{run_id}/groups", {"mailbox": MAILBOX, "condition": "ALL_TERMINAL"}),
        ("GET", f"/v1/groups/{group['id']}", None),
        ("POST", f"/v1/groups/{group['id']}/close", {}),
        ("POST", f"/v1/scopes/{run_id}/barriers", {"target": 2}),
        ("POST", f"/v1/scopes/{run_id}/timers", {"afterSeconds": 60}),
    ):
        status, answer = api(method, path, body)
        assert (status, answer["error"]["code"]) == (404, "NOT_FOUND"), path
        assert isinstance(answer["error"]["message"], str)
