"""Named runs, mailboxes, messages and tasks of the published protocol (PROTOCOL.md 5.1-5.3), on a
real `runstate dev` process over HTTP."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tests._http import (
    Api,
    mailbox_id,
    new_space,
    recv,
    settle,
    settle_error,
    settle_ok,
    submit_task,
    task_body,
)
from tests._nodes import DevNode
from tests.test_node_api import wait_until

WORKER = {"holder": "w1", "holderSession": "s1", "leaseSeconds": 30}


@pytest.fixture
def api(dev_node: DevNode) -> Api:
    return Api(dev_node.url, space=new_space(dev_node.url, "rt"))


def new_run(api: Api, **body: Any) -> str:
    return str(api.ok("POST", "/v1/scopes", body)["id"])


def in_seconds(seconds: float) -> str:
    return (datetime.now(timezone.utc) + timedelta(seconds=seconds)).isoformat()


def task(api: Api, task_id: str) -> dict[str, Any]:
    return dict(api.ok("GET", f"/v1/tasks/{task_id}"))


# -- runs ----------------------------------------------------------------------------------------


def test_a_named_run_is_joined_while_active_and_fresh_after_it_stopped(api: Api) -> None:
    first = api.ok("PUT", "/v1/runs/nightly", {})
    assert (first["name"], first["storedState"], first["parentId"]) == ("nightly", "ACTIVE", None)
    assert api.ok("PUT", "/v1/runs/nightly")["id"] == first["id"]  # a bodiless PUT too
    assert api.ok("PUT", "/v1/runs/other", {})["id"] != first["id"]
    api.ok("POST", f"/v1/scopes/{first['id']}/cancel", {})
    fresh = api.ok("PUT", "/v1/runs/nightly", {"deadline": in_seconds(3600)})
    assert (fresh["name"], fresh["storedState"]) == ("nightly", "ACTIVE") and fresh["id"] != first["id"]
    assert fresh["deadline"] is not None
    assert api.ok("GET", f"/v1/scopes/{first['id']}")["storedState"] == "CANCELLED"
    # Completing it counts as stopping it too.
    api.ok("POST", f"/v1/scopes/{fresh['id']}/complete")
    assert api.ok("PUT", "/v1/runs/nightly", {})["id"] not in (first["id"], fresh["id"])


def test_concurrent_puts_of_a_name_agree_on_one_run(api: Api) -> None:
    with ThreadPoolExecutor(8) as pool:
        ids = set(pool.map(lambda _: api.ok("PUT", "/v1/runs/shared", {})["id"], range(16)))
    assert len(ids) == 1


def test_a_child_run_is_created_with_parent_id_and_a_misspelt_field_is_refused(api: Api) -> None:
    parent = new_run(api, name="parent")
    child = api.ok("POST", "/v1/scopes", {"parentId": parent, "name": "child"})
    assert child["parentId"] == parent
    for misspelt in ({"parentScopeId": parent}, {"parent_id": parent}, {"parentid": parent}):
        status, answer = api("POST", "/v1/scopes", misspelt)
        assert (status, answer["error"]["code"]) == (400, "VALIDATION_FAILED")
        assert "unknown field" in answer["error"]["message"]
    assert api.ok("GET", f"/v1/scopes/{parent}")["children"] == 1  # nothing else was created
    # cancel and complete take no body, {} or (cancel) a reason.
    status, _ = api("POST", f"/v1/scopes/{child['id']}/cancel", raw=b"")
    assert status == 200
    assert api.error("POST", f"/v1/scopes/{parent}/complete", {"reason": "x"}) == (400, "VALIDATION_FAILED")


# -- mailboxes -----------------------------------------------------------------------------------


def test_a_mailbox_declared_by_name_checks_what_is_declared(api: Api) -> None:
    # A producer's {} first creates it with nothing declared: a worker's declaration is no conflict.
    created = api.ok("PUT", "/v1/mailboxes/by-name/jobs", {})
    assert (created["mode"], created["maxAttempts"], created["requirements"]) == ("WORK", None, None)
    declared = api.ok("PUT", "/v1/mailboxes/by-name/jobs", {"maxAttempts": 2, "requirements": {"pools": []}})
    assert (declared["id"], declared["maxAttempts"]) == (created["id"], 2)
    assert api.ok("PUT", "/v1/mailboxes/by-name/jobs", {"maxAttempts": 2})["id"] == created["id"]
    assert api.ok("PUT", "/v1/mailboxes/by-name/jobs", {})["maxAttempts"] == 2  # absent fields are not checked
    assert api.error("PUT", "/v1/mailboxes/by-name/jobs", {"maxAttempts": 3}) == (409, "CONFLICT")
    assert api.error("PUT", "/v1/mailboxes/by-name/jobs", {"requirements": {"pools": [{"name": "p", "units": 1}]}}) == (
        409, "CONFLICT",
    )
    assert api.error("PUT", "/v1/mailboxes/by-name/jobs", {"maxAttempts": 0}) == (400, "VALIDATION_FAILED")
    assert api.error("PUT", "/v1/mailboxes/by-name/jobs", {"mode": "WORK"}) == (400, "VALIDATION_FAILED")


def test_requirements_take_a_whole_number_written_with_a_point(api: Api) -> None:
    """units and reserveMinor are integers in the OpenAPI document, and to JSON Schema 2.0 is one:
    the node takes it as 2 (the core, given the float, refused it); 2.5 is still refused."""
    api.ok("POST", "/v1/permits", {"name": "gpu", "units": 2})
    whole = {"pools": [{"name": "gpu", "units": 2.0}]}
    declared = api.ok("PUT", "/v1/mailboxes/by-name/jobs", {"requirements": whole})
    assert declared["requirements"] == {"pools": [{"name": "gpu", "units": 2}]}
    assert api.ok("PUT", "/v1/mailboxes/by-name/jobs", {"requirements": {"pools": [{"name": "gpu", "units": 2}]}})
    fraction = {"pools": [{"name": "gpu", "units": 2.5}]}
    assert api.error("PUT", "/v1/mailboxes/by-name/other", {"requirements": fraction}) == (400, "VALIDATION_FAILED")
    run_id = new_run(api)
    assert api.ok("POST", "/v1/tasks", task_body(run_id, declared["id"], 1, requirements=whole))["created"]
    assert api.error("POST", "/v1/tasks", task_body(run_id, declared["id"], 2, requirements=fraction)) == (
        400, "VALIDATION_FAILED",
    )


def test_queue_level_max_attempts_applies_to_tasks_submitted_without_their_own(api: Api) -> None:
    run_id = new_run(api)
    jobs = api.ok("PUT", "/v1/mailboxes/by-name/jobs", {"maxAttempts": 2})["id"]
    task_id = api.ok("POST", "/v1/tasks", task_body(run_id, jobs, {"n": 1}, "k"))["taskId"]
    assert task(api, task_id)["attempts"] == 2
    own = api.ok("POST", "/v1/tasks", task_body(run_id, jobs, {"n": 2}, "own", attempts=4))["taskId"]
    assert task(api, own)["attempts"] == 4


def test_an_inbox_takes_messages_not_tasks(api: Api) -> None:
    run_id = new_run(api)
    inbox = mailbox_id(api, "notes", mode="INBOX")
    status, answer = api("POST", "/v1/tasks", task_body(run_id, inbox, 1, "k"))
    assert (status, answer["error"]["code"]) == (400, "VALIDATION_FAILED")
    sent = api.ok("POST", f"/v1/mailboxes/{inbox}/messages", {"scopeId": run_id, "payload": {"hi": 1}})
    assert sent["created"] is True
    (delivery,) = recv(api, run_id, "notes")
    assert (delivery["taskId"], delivery["input"]) == (sent["id"], {"hi": 1})
    admit = {"scopeId": run_id, "mailboxId": inbox, **WORKER}
    assert api.error("POST", "/v1/tasks/admit", admit) == (400, "VALIDATION_FAILED")


def test_backlog_limit_refuses_beyond_the_unfinished_tasks_and_frees_as_they_finish(api: Api) -> None:
    run_id = new_run(api)
    bounded = api.ok("POST", "/v1/mailboxes", {"name": "bounded", "backlogLimit": 2})["id"]

    def send(payload: int) -> tuple[int, Any]:
        return api("POST", f"/v1/mailboxes/{bounded}/messages", {"scopeId": run_id, "payload": payload})

    assert send(1)[0] == 201 and send(2)[0] == 201
    status, answer = send(3)
    assert (status, answer["error"]["code"]) == (409, "BACKLOG_FULL")
    (delivery,) = recv(api, run_id, "bounded")
    assert send(3)[0] == 409  # a running task is unfinished too
    settle_ok(api, delivery, "complete", {})
    assert send(3)[0] == 201


def test_backlog_full_answers_retry_after(api: Api, dev_node: DevNode) -> None:
    run_id = new_run(api)
    bounded = api.ok("POST", "/v1/mailboxes", {"name": "one", "backlogLimit": 1})["id"]
    api.ok("POST", f"/v1/mailboxes/{bounded}/messages", {"scopeId": run_id, "payload": 1})
    request = urllib.request.Request(
        dev_node.url + api.space_path(f"/v1/mailboxes/{bounded}/messages"), method="POST",
        data=json.dumps({"scopeId": run_id, "payload": 2}).encode(), headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 409 and refused.value.headers.get("Retry-After") is not None
    refused.value.close()


# -- messages ------------------------------------------------------------------------------------


def test_messages_are_listed_with_their_state_and_attempt(api: Api) -> None:
    run_id = new_run(api)
    work = mailbox_id(api)
    first = api.ok("POST", f"/v1/mailboxes/{work}/messages", {"scopeId": run_id, "payload": "a"})
    (delivery,) = recv(api, run_id)
    settle_ok(api, delivery, "retry", {"delayMs": 0, "error": "once more"})
    (delivery,) = recv(api, run_id)
    assert (delivery["taskId"], delivery["attempt"]) == (first["id"], 2)
    settle_ok(api, delivery, "complete", {"result": {"payload": "done"}})
    keyed = api.ok("POST", f"/v1/mailboxes/{work}/messages", {"scopeId": run_id, "payload": "b", "workKey": "wk"})
    again = api.ok("POST", f"/v1/mailboxes/{work}/messages", {"scopeId": run_id, "payload": "b", "workKey": "wk"})
    assert (again["id"], again["created"]) == (keyed["id"], False)
    # Keyless messages are each their own, even with equal payloads.
    twin = api.ok("POST", f"/v1/mailboxes/{work}/messages", {"scopeId": run_id, "payload": "a"})
    assert twin["id"] != first["id"]
    listed = {view["id"]: view for view in api.ok("GET", f"/v1/mailboxes/{work}/messages")["messages"]}
    assert (listed[first["id"]]["state"], listed[first["id"]]["attempt"]) == ("ACKED", 2)
    assert listed[keyed["id"]]["state"] == "QUEUED" and listed[keyed["id"]]["workKey"] == "wk"
    assert task(api, first["id"])["outcome"] == "done"
    assert set(listed) == {first["id"], keyed["id"], twin["id"]}


def test_recv_and_admit_answer_204_when_there_is_nothing(api: Api) -> None:
    run_id = new_run(api)
    work = mailbox_id(api)
    status, _ = api("POST", f"/v1/mailboxes/{work}/recv", {"scopeId": run_id, **WORKER})
    assert status == 204
    status, _ = api("POST", "/v1/tasks/admit", {"scopeId": run_id, "mailboxId": work, **WORKER, "waitMs": 100})
    assert status == 204


def test_recv_answers_the_protocol_shape_and_a_long_poll_is_woken(api: Api) -> None:
    run_id = new_run(api)
    work = mailbox_id(api)
    answers: list[tuple[int, Any]] = []
    poller = threading.Thread(
        target=lambda: answers.append(api("POST", f"/v1/mailboxes/{work}/recv", {"scopeId": run_id, **WORKER, "waitMs": 20_000}))
    )
    poller.start()
    sent = api.ok("POST", f"/v1/mailboxes/{work}/messages", {"scopeId": run_id, "payload": {"n": 1}})
    poller.join(30)
    ((status, answer),) = answers
    assert status == 200 and set(answer) >= {"message", "token"}
    assert {key: answer["message"][key] for key in ("id", "payload", "attempt", "scopeId")} == {
        "id": sent["id"], "payload": {"n": 1}, "attempt": 1, "scopeId": run_id,
    }
    view = task(api, sent["id"])
    assert (view["holder"], view["holderSession"], view["state"]) == ("w1", "s1", "RUNNING")


def test_a_stale_or_unknown_token_is_stale_claim_and_changes_nothing(api: Api) -> None:
    run_id = new_run(api)
    task_id = submit_task(api, run_id, {"n": 1})["id"]
    (old,) = recv(api, run_id, leaseMs=300)
    taken: list[dict[str, Any]] = []
    wait_until(lambda: bool(taken.extend(recv(api, run_id)) or taken), "the lease to lapse")
    (current,) = taken
    assert current["token"] != old["token"]
    before = task(api, task_id)
    forged = {**current, "token": current["token"][:-1] + ("0" if current["token"][-1] != "0" else "1")}
    for delivery in (old, forged):
        assert settle_error(api, delivery, "complete", {"result": {"payload": "late"}}) == (409, "STALE_CLAIM")
        assert settle_error(api, delivery, "renew", {"leaseSeconds": 60}) == (409, "STALE_CLAIM")
        assert settle_error(api, delivery, "retry", {"error": "x"}) == (409, "STALE_CLAIM")
        assert settle_error(api, delivery, "reject", {"error": "x"}) == (409, "STALE_CLAIM")
    # A token of another message does not fit this one either.
    other_id = submit_task(api, run_id, {"n": 2})["id"]
    (other,) = recv(api, run_id)
    assert other["taskId"] == other_id
    assert settle_error(api, {**other, "taskId": task_id}, "complete", {}) == (409, "STALE_CLAIM")
    assert task(api, task_id) == before
    settle_ok(api, current, "complete", {"result": {"payload": "ok"}})
    assert task(api, task_id)["outcome"] == "ok"


def test_nack_retry_until_the_attempts_then_failed_with_the_handler_error(api: Api) -> None:
    run_id = new_run(api)
    task_id = submit_task(api, run_id, {"n": 1}, "k", attempts=2)["id"]
    (first,) = recv(api, run_id)
    status, answer = settle(api, first, "retry", {"error": "ValueError: boom"})
    assert (status, answer["state"]) == (200, "QUEUED")
    taken: list[dict[str, Any]] = []
    wait_until(lambda: bool(taken.extend(recv(api, run_id)) or taken), "the redelivery after the backoff")
    (second,) = taken
    assert second["attempt"] == 2
    failed = settle_ok(api, second, "retry", {"error": "ValueError: boom again"})
    assert (failed["state"], failed["outcomeReason"]) == ("FAILED", "handler_error: ValueError: boom again")
    view = api.ok("GET", f"/v1/tasks/{task_id}?waitMs=1000")
    assert (view["state"], view["outcomeReason"], view["done"]) == ("FAILED", "handler_error: ValueError: boom again", True)


def test_nack_without_retry_fails_the_task_at_once(api: Api) -> None:
    run_id = new_run(api)
    task_id = submit_task(api, run_id, 1, attempts=5)["id"]
    (delivery,) = recv(api, run_id)
    assert api.error("POST", f"/v1/messages/{task_id}/nack", {"token": delivery["token"]}) == (400, "VALIDATION_FAILED")
    rejected = api.ok("POST", f"/v1/messages/{task_id}/nack", {"token": delivery["token"], "retry": False, "error": "bad"})
    assert (rejected["state"], rejected["outcomeReason"]) == ("FAILED", "rejected: bad")
    assert recv(api, run_id) == []


# -- tasks ---------------------------------------------------------------------------------------


def test_a_task_is_the_same_for_the_same_key_in_the_same_run_and_mailbox(api: Api) -> None:
    run_id = new_run(api)
    first = submit_task(api, run_id, {"n": 1}, "k")
    again = submit_task(api, run_id, {"n": 1}, "k")
    assert (again["taskId"], again["created"], again["taskKey"]) == (first["taskId"], False, "k")
    other_mailbox = submit_task(api, run_id, {"n": 1}, "k", mailbox="other")
    assert other_mailbox["taskId"] != first["taskId"]
    status, answer = api("POST", "/v1/tasks", task_body(run_id, mailbox_id(api), {"n": 2}, "k"))
    assert (status, answer["error"]["code"]) == (409, "KEY_CONFLICT")
    assert api.error("POST", "/v1/tasks", {**task_body(run_id, mailbox_id(api), 1), "workLimit": "w"}) == (
        404, "NOT_FOUND",  # no work limit of that name (tests/test_node_work_limits.py)
    )


def test_get_task_long_polls_until_terminal(api: Api) -> None:
    run_id = new_run(api)
    task_id = submit_task(api, run_id, {"n": 21})["id"]
    answers: list[Any] = []
    waiter = threading.Thread(target=lambda: answers.append(api.ok("GET", f"/v1/tasks/{task_id}?waitMs=20000")))
    waiter.start()
    (delivery,) = recv(api, run_id)
    settle_ok(api, delivery, "complete", {"result": {"payload": {"doubled": 42}}})
    waiter.join(30)
    (view,) = answers
    assert (view["id"], view["state"], view["outcome"], view["outcomeReason"]) == (task_id, "SUCCEEDED", {"doubled": 42}, None)
    assert view["mailboxId"] == mailbox_id(api) and view["taskKey"]


def test_task_cancel_ends_a_queued_or_running_task_and_stales_its_token(api: Api) -> None:
    run_id = new_run(api)
    queued = submit_task(api, run_id, 1)["id"]
    running = submit_task(api, run_id, 2)["id"]
    deliveries = {d["taskId"]: d for d in recv(api, run_id, max=2)}
    settle_ok(api, deliveries[queued], "release")
    answer = api.ok("POST", f"/v1/tasks/{queued}/cancel", {"reason": "not needed"})
    assert (answer["state"], answer["outcomeReason"]) == ("CANCELLED", "cancelled: not needed")
    assert api.ok("POST", f"/v1/tasks/{running}/cancel")["state"] == "CANCELLED"
    assert settle_error(api, deliveries[running], "complete", {}) == (409, "STALE_CLAIM")
    assert api.ok("POST", f"/v1/tasks/{running}/cancel", {})["outcomeReason"] == "cancelled"  # idempotent
    assert recv(api, run_id) == []
    assert api.error("POST", "/v1/tasks/tsk_nope/cancel", {}) == (404, "NOT_FOUND")


def test_join_and_detach_keep_an_idempotent_subscriber_set(api: Api) -> None:
    run_id = new_run(api)
    task_id = submit_task(api, run_id, 1, subscriberId="first")["id"]
    joined = api.ok("POST", f"/v1/tasks/{task_id}/join", {"subscriberId": "second", "scopeId": run_id})
    assert joined["subscribers"] == ["first", "second"]
    assert api.ok("POST", f"/v1/tasks/{task_id}/join", {"subscriberId": "second", "scopeId": run_id})["subscribers"] == [
        "first", "second",
    ]
    api.ok("POST", f"/v1/tasks/{task_id}/detach", {"subscriberId": "first"})
    detached = api.ok("POST", f"/v1/tasks/{task_id}/detach", {"subscriberId": "second"})
    assert (detached["subscribers"], detached["state"]) == ([], "QUEUED")  # no subscriber cancels nothing
    assert api.ok("POST", f"/v1/tasks/{task_id}/detach", {"subscriberId": "second"})["subscribers"] == []
    assert api.error("POST", f"/v1/tasks/{task_id}/join", {"subscriberId": "x"}) == (400, "VALIDATION_FAILED")
    assert api.error("POST", f"/v1/tasks/{task_id}/join", {"subscriberId": "x", "scopeId": "run_nope"}) == (
        404, "NOT_FOUND",
    )


def test_a_task_deadline_expires_it(api: Api) -> None:
    run_id = new_run(api)
    task_id = submit_task(api, run_id, 1, deadline=in_seconds(0.5))["id"]
    kept = submit_task(api, run_id, 2, deadline=in_seconds(3600))["id"]
    wait_until(lambda: task(api, task_id)["state"] == "EXPIRED", "the task's deadline")
    assert task(api, task_id)["outcomeReason"] == "deadline_exceeded"
    assert task(api, kept)["state"] == "QUEUED"
    assert api.ok("GET", f"/v1/scopes/{run_id}")["storedState"] == "ACTIVE"
    (delivery,) = recv(api, run_id)
    assert delivery["taskId"] == kept


def test_admit_with_include_descendants_takes_tasks_of_runs_below(api: Api) -> None:
    run_id = new_run(api)
    child = api.ok("POST", "/v1/scopes", {"parentId": run_id})["id"]
    grandchild = api.ok("POST", "/v1/scopes", {"parentId": child})["id"]
    work = mailbox_id(api)
    below = submit_task(api, grandchild, {"n": 1}, "deep")["taskId"]
    admit = {"scopeId": run_id, "mailboxId": work, **WORKER}
    status, _ = api("POST", "/v1/tasks/admit", admit)
    assert status == 204  # without includeDescendants only the run's own tasks
    admitted = api.ok("POST", "/v1/tasks/admit", {**admit, "includeDescendants": True})
    assert (admitted["taskId"], admitted["messageId"], admitted["taskKey"], admitted["attempt"]) == (below, below, "deep", 1)
    assert (admitted["payload"], admitted["grants"], admitted["consumptions"], admitted["reservations"]) == (
        {"n": 1}, [], [], [],
    )
    done = api.ok("POST", f"/v1/messages/{below}/complete", {"token": admitted["token"], "result": {"payload": 2}})
    assert done["state"] == "SUCCEEDED"


def test_admit_long_poll_is_woken_by_a_task_below(api: Api) -> None:
    run_id = new_run(api)
    child = api.ok("POST", "/v1/scopes", {"parentId": run_id})["id"]
    work = mailbox_id(api)
    answers: list[Any] = []
    body = {"scopeId": run_id, "mailboxId": work, **WORKER, "includeDescendants": True, "waitMs": 20_000}
    poller = threading.Thread(target=lambda: answers.append(api("POST", "/v1/tasks/admit", body)))
    poller.start()
    task_id = submit_task(api, child, 1)["taskId"]
    poller.join(30)
    ((status, admitted),) = answers
    assert (status, admitted["taskId"]) == (200, task_id)


def test_recv_refuses_after_the_run_stopped(api: Api) -> None:
    run_id = new_run(api)
    work = mailbox_id(api)
    api.ok("POST", f"/v1/scopes/{run_id}/cancel", {})
    assert api.error("POST", f"/v1/mailboxes/{work}/recv", {"scopeId": run_id, **WORKER}) == (409, "SCOPE_CANCELLED")
