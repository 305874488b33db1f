"""The HTTP API of a real `runstate dev` process, called over HTTP."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from runstate_server.actors import COMPILED
from runstate_server.node.api.app import ROUTES
from runstate_server.node.api.openapi import openapi_path
from tests._http import (
    Api,
    call,
    mailbox_id,
    new_space,
    recv,
    recv_path,
    settle,
    settle_error,
    settle_ok,
    submit_task,
    task_body,
)
from tests._nodes import DevNode
from tests._prometheus import scrape, value

POLL_TIMEOUT_S = 20.0


@pytest.fixture
def api(dev_node: DevNode) -> Api:
    """A client in a space of its own, so tests never see each other's state."""
    client = Api(dev_node.url, space=new_space(dev_node.url, "test"))
    assert client.ok("POST", "/v1/mailboxes", {"name": "work", "mode": "WORK"})["name"] == "work"
    return client


def tasks_of(api: Api, run_id: str, task_input: Any, **extra: Any) -> tuple[int, Any]:
    """POST /v1/tasks to the mailbox work of the run, as it answers."""
    return api("POST", "/v1/tasks", task_body(run_id, mailbox_id(api), task_input, **extra))


def submit_error(api: Api, run_id: str, task_input: Any, **extra: Any) -> tuple[int, str]:
    status, answer = tasks_of(api, run_id, task_input, **extra)
    assert status >= 400, (status, answer)
    return status, answer["error"]["code"]


def child_of(api: Api, run_id: str, **body: Any) -> tuple[int, Any]:
    return api("POST", "/v1/scopes", {"parentId": run_id, **body})


def new_run(api: Api, **body: Any) -> str:
    status, run = api("POST", "/v1/scopes", body)
    assert status == 201, run
    return str(run["id"])


def submit(api: Api, run_id: str, task_input: Any, key: str | None = None, **extra: Any) -> dict[str, Any]:
    return submit_task(api, run_id, task_input, key, **extra)


def receive(api: Api, run_id: str, **body: Any) -> list[dict[str, Any]]:
    return recv(api, run_id, **body)


def wait_until(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + POLL_TIMEOUT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def task(api: Api, task_id: str) -> dict[str, Any]:
    return dict(api.ok("GET", f"/v1/tasks/{task_id}"))


def in_seconds(seconds: float) -> str:
    return (datetime.now(timezone.utc) + timedelta(seconds=seconds)).isoformat()


# -- health and the contract ---------------------------------------------------------------------


def test_health_reports_a_leader(dev_node: DevNode) -> None:
    health = Api(dev_node.url).ok("GET", "/v1/health")
    assert health["status"] == "ok"
    assert health["role"] == "leader"
    assert health["appliedIndex"] >= 1


def test_the_node_says_whether_its_core_is_compiled(dev_node: DevNode) -> None:
    """GET /metrics and `runstate --version` tell which core the node runs: interpreted in the
    default run, compiled in compat/compiled/run.sh's run of this file (README, "A compiled core")."""
    samples, _ = scrape(dev_node.url)
    assert value(samples, "runstate_core_compiled") == (1 if COMPILED else 0)
    version = subprocess.run(
        [sys.executable, "-m", "runstate_server.node.cli", "--version"], capture_output=True, text=True, timeout=60, check=True
    )
    assert version.stdout.strip().endswith("(compiled core)" if COMPILED else "(interpreted core)"), version.stdout


def test_openapi_lists_exactly_the_routes(dev_node: DevNode) -> None:
    document = Api(dev_node.url).ok("GET", "/v1/openapi.json")
    served = {(method.upper(), path) for path, methods in document["paths"].items() for method in methods}
    assert served == {(route.method, openapi_path(route.path)) for route in ROUTES}
    for method, path in served:  # every documented route is really there
        status, answer = Api(dev_node.url)(method, re.sub(r"{\w+}", "none", path), {})
        assert not (status == 404 and answer["error"]["message"].startswith("no route")), (method, path)


def test_openapi_states_required_query_parameters_alternatives_and_path_bounds(api: Api) -> None:
    """What the node refuses to go without is in the document: GET /once's scopeId and key (and
    GET /claims/{key}'s scopeId), a timer's one of at and afterSeconds, an arrival's one of
    arrivalKey and key, a by-name path's length; each refusal is as the document says."""
    paths = Api(api.base_url).ok("GET", "/v1/openapi.json")["paths"]
    spaced = "/v1/spaces/{spaceId}"
    query = {parameter["name"]: parameter["required"] for parameter in paths[spaced + "/once"]["get"]["parameters"]
             if parameter["in"] == "query"}
    assert query == {"scopeId": True, "key": True, "waitMs": False}
    claim = paths[spaced + "/claims/{key}"]["get"]["parameters"]
    assert [parameter["name"] for parameter in claim if parameter.get("required") and parameter["in"] == "query"] == ["scopeId"]
    timer = paths[spaced + "/timers"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert (timer["required"], timer["oneOf"]) == (["scopeId"], [{"required": ["at"]}, {"required": ["afterSeconds"]}])
    arrive = paths[spaced + "/barriers/{id}/arrive"]["post"]["requestBody"]
    assert arrive["required"] and arrive["content"]["application/json"]["schema"]["oneOf"] == [
        {"required": ["arrivalKey"]}, {"required": ["key"]},
    ]
    name = paths[spaced + "/barriers/by-name/{name}"]["put"]["parameters"][1]
    assert (name["name"], name["schema"]["maxLength"]) == ("name", 256)
    assert api.error("GET", "/v1/once?scopeId=run") == (400, "VALIDATION_FAILED")
    run_id = new_run(api)
    both = {"scopeId": run_id, "at": in_seconds(60), "afterSeconds": 60}
    assert api.error("POST", "/v1/timers", both) == (400, "VALIDATION_FAILED")
    assert api.error("POST", "/v1/timers", {"scopeId": run_id}) == (400, "VALIDATION_FAILED")
    assert api.error("PUT", "/v1/barriers/by-name/" + "n" * 257, {"scopeId": run_id, "target": 1}) == (400, "VALIDATION_FAILED")


def test_unknown_route_and_method_are_json_errors(api: Api) -> None:
    assert api.error("GET", "/v1/nothing-here") == (404, "NOT_FOUND")
    assert api.error("DELETE", "/v1/scopes") == (405, "METHOD_NOT_ALLOWED")


@pytest.mark.parametrize(
    "raw",
    [b"not json", b"[1, 2]", b'"text"', b"{", b"\xff\xfe", b'{"name": 5}', b'{"childLimit": -1}',
     b'{"deadline": "yesterday"}', b'{"parentId": 7}', b'{"parentScopeId": "run_x"}'],
)
def test_bad_bodies_are_400_never_500(api: Api, raw: bytes) -> None:
    run_id = new_run(api)
    paths = [
        "/v1/mailboxes",
        "/v1/scopes",
        "/v1/runs/r",
        "/v1/tasks",
        "/v1/tasks/admit",
        recv_path(api),
        f"/v1/mailboxes/{mailbox_id(api)}/messages",
        "/v1/messages/tsk_x/complete",
        "/v1/messages/complete",
        "/v1/messages/tsk_x/nack",
        "/v1/tasks/tsk_x/join",
    ]
    for path in paths:
        status, answer = api("PUT" if path.startswith("/v1/runs/") else "POST", path, raw=raw)
        assert status < 500, (path, status, answer)
        if status >= 400:
            assert set(answer["error"]) == {"code", "message", "requestId"}
    assert api.ok("GET", f"/v1/scopes/{run_id}")["storedState"] == "ACTIVE"


def test_oversized_input_and_result_are_refused(api: Api) -> None:
    run_id = new_run(api)
    big = "x" * (64 * 1024 + 1)
    assert submit_error(api, run_id, big) == (400, "VALIDATION_FAILED")
    submit(api, run_id, {"n": 1})
    (delivery,) = receive(api, run_id)
    status, answer = settle(api, delivery, "complete", {"result": {"payload": big}})
    assert (status, answer["error"]["code"]) == (400, "VALIDATION_FAILED")
    assert "exceeds 65536 bytes" in answer["error"]["message"]
    assert task(api, delivery["taskId"])["state"] == "RUNNING"


# -- mailboxes -----------------------------------------------------------------------------------


def test_mailbox_create_conflicts_on_a_taken_name_and_lists(api: Api) -> None:
    assert api.error("POST", "/v1/mailboxes", {"name": "work", "mode": "WORK"}) == (409, "CONFLICT")
    assert api.error("POST", "/v1/mailboxes", {"name": "work", "mode": "INBOX"}) == (409, "CONFLICT")
    assert api.error("POST", "/v1/mailboxes", {"name": "other", "mode": "FANOUT"}) == (400, "VALIDATION_FAILED")
    inbox = api.ok("POST", "/v1/mailboxes", {"name": "notes", "mode": "INBOX", "backlogLimit": 5})
    assert inbox["id"].startswith("mbx_") and (inbox["mode"], inbox["backlogLimit"]) == ("INBOX", 5)
    listed = {view["name"]: view for view in api.ok("GET", "/v1/mailboxes")["mailboxes"]}
    assert set(listed) == {"work", "notes"} and listed["notes"] == inbox
    assert api.ok("GET", f"/v1/mailboxes/{inbox['id']}") == inbox
    assert api.ok("GET", "/v1/mailboxes?name=notes")["mailboxes"] == [inbox]
    assert api.error("GET", "/v1/mailboxes/mbx_nope") == (404, "NOT_FOUND")


# -- runs ----------------------------------------------------------------------------------------


def test_two_creates_make_two_runs_with_names(api: Api) -> None:
    first, second = new_run(api, name="alpha"), new_run(api)
    assert first != second
    status = api.ok("GET", f"/v1/scopes/{first}")
    assert status["name"] == "alpha"
    assert (status["storedState"], status["effective"], status["childLimit"]) == ("ACTIVE", "ACTIVE", 1000)


def test_cancel_stops_the_run_and_everything_below(api: Api) -> None:
    run_id = new_run(api)
    status, child = child_of(api, run_id, name="shard")
    assert (status, child["parentId"]) == (201, run_id)
    shard = child["id"]
    queued = submit(api, shard, {"n": 1})["id"]
    running = submit(api, shard, {"n": 2})["id"]
    done = submit(api, shard, {"n": 3})["id"]
    deliveries = {d["taskId"]: d for d in receive(api, shard, max=3)}
    settle_ok(api, deliveries[done], "complete", {"result": {"payload": "ok"}})
    settle_ok(api, deliveries[queued], "release")

    cancelled = api.ok("POST", f"/v1/scopes/{run_id}/cancel", {"reason": "enough"})
    assert (cancelled["storedState"], cancelled["effective"]) == ("CANCELLED", "INACTIVE")
    shard_status = api.ok("GET", f"/v1/scopes/{shard}")
    assert (shard_status["storedState"], shard_status["effective"]) == ("ACTIVE", "INACTIVE")

    # New work is refused for the run and every run below it.
    for target in (run_id, shard):
        assert submit_error(api, target, 9) == (409, "SCOPE_CANCELLED")
        assert api.error("POST", recv_path(api), {"scopeId": target}) == (409, "SCOPE_CANCELLED")
        assert api.error("POST", "/v1/scopes", {"parentId": target}) == (409, "SCOPE_CANCELLED")
    # Unfinished tasks are cancelled; the recorded result stays readable.
    assert task(api, queued)["state"] == "CANCELLED"
    assert (task(api, running)["state"], task(api, running)["outcomeReason"]) == ("CANCELLED", "scope_cancelled")
    assert (task(api, done)["state"], task(api, done)["outcome"]) == ("SUCCEEDED", "ok")
    # Renew and complete are refused; retry, reject and release still answer.
    held = deliveries[running]
    assert settle_error(api, held, "renew", {}) == (409, "SCOPE_CANCELLED")
    assert settle_error(api, held, "complete", {"result": {"payload": 1}}) == (409, "SCOPE_CANCELLED")
    assert settle_ok(api, held, "release")["state"] == "CANCELLED"
    # Cancel is idempotent; a cancelled run cannot be completed.
    assert api.ok("POST", f"/v1/scopes/{run_id}/cancel")["storedState"] == "CANCELLED"
    assert api.error("POST", f"/v1/scopes/{run_id}/complete") == (409, "CONFLICT")


def test_cancelling_a_completed_run_is_a_conflict(api: Api) -> None:
    run_id = new_run(api)
    queued = submit(api, run_id, {"n": 1})["id"]
    assert api.ok("POST", f"/v1/scopes/{run_id}/complete")["storedState"] == "COMPLETED"
    assert task(api, queued)["state"] == "CANCELLED"
    assert api.error("POST", f"/v1/scopes/{run_id}/cancel") == (409, "CONFLICT")
    assert submit_error(api, run_id, 2) == (409, "SCOPE_CANCELLED")


def test_child_limit(api: Api) -> None:
    run_id = new_run(api, childLimit=1)
    assert child_of(api, run_id)[0] == 201
    status, answer = child_of(api, run_id)
    assert (status, answer["error"]["code"]) == (409, "LIMIT_EXCEEDED")


def test_deadline_expires_queued_work_and_refuses_new_work(api: Api) -> None:
    run_id = new_run(api, deadline=in_seconds(1.0))
    child = child_of(api, run_id)[1]["id"]
    queued = submit(api, child, {"n": 1})["id"]
    wait_until(lambda: task(api, queued)["state"] == "EXPIRED", "the deadline to expire the task")
    assert api.ok("GET", f"/v1/scopes/{run_id}")["effective"] == "INACTIVE"
    assert submit_error(api, child, 2) == (409, "DEADLINE_EXCEEDED")
    assert api.error("POST", "/v1/scopes", {"deadline": "2001-01-01T00:00:00Z"}) == (400, "VALIDATION_FAILED")


def test_unknown_ids_are_not_found(api: Api) -> None:
    assert api.error("GET", "/v1/scopes/run_nope") == (404, "NOT_FOUND")
    assert api.error("POST", "/v1/scopes/run_nope/cancel") == (404, "NOT_FOUND")
    assert api.error("GET", "/v1/tasks/tsk_nope") == (404, "NOT_FOUND")
    assert api.error("POST", "/v1/messages/tsk_nope/complete", {"token": "t", "result": {}}) == (404, "NOT_FOUND")
    run_id = new_run(api)
    assert api.error("POST", "/v1/tasks", task_body(run_id, "mbx_absent", 1)) == (404, "NOT_FOUND")
    assert api.error("POST", "/v1/tasks", task_body("run_nope", mailbox_id(api), 1)) == (404, "NOT_FOUND")
    assert api.error("POST", "/v1/scopes", {"parentId": "run_nope"}) == (404, "NOT_FOUND")


def test_spaces_do_not_see_each_other(api: Api, dev_node: DevNode) -> None:
    run_id = new_run(api)
    task_id = submit(api, run_id, {"n": 1})["id"]
    stranger = Api(dev_node.url, space=new_space(dev_node.url, "other"))
    assert stranger.error("GET", f"/v1/scopes/{run_id}") == (404, "NOT_FOUND")
    assert stranger.error("GET", f"/v1/tasks/{task_id}") == (404, "NOT_FOUND")
    assert stranger.error("POST", f"/v1/scopes/{run_id}/cancel") == (404, "NOT_FOUND")
    assert api.ok("GET", f"/v1/scopes/{run_id}")["storedState"] == "ACTIVE"


def test_an_unknown_space_is_not_found_and_is_not_made(dev_node: DevNode) -> None:
    """Without auth, a typo in the space id fails at the first call (issue 43) instead of
    writing into a new, empty space; the default space needs no creating."""
    from runstate import NotFoundError, Runstate

    typo = f"typo-{time.monotonic_ns()}"
    for method, path, body in (("POST", "/v1/scopes", {}), ("GET", "/v1/scopes", None), ("POST", "/v1/mailboxes", {"name": "work"})):
        status, answer = call(dev_node.url, method, f"/v1/spaces/{typo}{path[len('/v1'):]}", body)
        assert (status, answer["error"]["code"]) == (404, "NOT_FOUND"), (method, path, answer)
        assert f"space {typo!r} not found" in answer["error"]["message"]
    with Runstate(base_url=dev_node.url, space_id=typo) as rs, pytest.raises(NotFoundError, match=typo):
        rs.scopes.create()
    operator = Api(dev_node.url)
    assert typo not in [space["id"] for space in operator.ok("GET", "/v1/spaces")["spaces"]]
    assert Api(dev_node.url, space="default").ok("GET", "/v1/mailboxes") is not None

    operator.ok("POST", "/v1/spaces", {"id": typo})
    assert Api(dev_node.url, space=typo).ok("POST", "/v1/scopes", {})["id"]


# -- tasks and deliveries ------------------------------------------------------------------------


def test_submit_is_idempotent_per_key(api: Api) -> None:
    run_id = new_run(api)
    first = submit(api, run_id, {"n": 1}, key="k")
    again = submit(api, run_id, {"n": 1}, key="k")
    assert (first["created"], again["created"], again["id"]) == (True, False, first["id"])
    assert submit_error(api, run_id, {"n": 2}, taskKey="k") == (409, "KEY_CONFLICT")
    # Without a key the input is the key: equal inputs (in any key order) are one task.
    a = submit(api, run_id, {"x": 1, "y": 2})
    b = submit(api, run_id, {"y": 2, "x": 1})
    assert (a["id"], b["created"]) == (b["id"], False)
    # Another run has its own tasks.
    assert submit(api, new_run(api), {"n": 1}, key="k")["created"] is True


def test_full_task_lifecycle_and_result_long_poll(api: Api) -> None:
    run_id = new_run(api)
    task_id = submit(api, run_id, {"n": 21})["id"]
    answers: list[Any] = []
    waiter = threading.Thread(target=lambda: answers.append(api.ok("GET", f"/v1/tasks/{task_id}?waitMs=20000")))
    waiter.start()
    (delivery,) = receive(api, run_id, max=10, leaseMs=10_000)
    assert (delivery["taskId"], delivery["attempt"], delivery["input"]) == (task_id, 1, {"n": 21})
    assert task(api, task_id)["state"] == "RUNNING"
    settle_ok(api, delivery, "renew", {"leaseMs": 20_000})
    done = settle_ok(api, delivery, "complete", {"result": {"payload": {"doubled": 42}}})
    assert done == {"taskId": task_id, "state": "SUCCEEDED", "attempt": 1, "outcomeReason": None}
    waiter.join(POLL_TIMEOUT_S)
    assert answers and answers[0]["done"] is True
    assert (answers[0]["state"], answers[0]["outcome"]) == ("SUCCEEDED", {"doubled": 42})
    # The same complete again (a client retrying after a lost answer) is answered the same way and
    # records nothing more: one recorded result per task.
    again = settle_ok(api, delivery, "complete", {"result": {"payload": 0}})
    assert again == {"taskId": task_id, "state": "SUCCEEDED", "attempt": 1, "outcomeReason": None}
    assert task(api, task_id)["outcome"] == {"doubled": 42}


def test_result_long_poll_answers_not_done_after_wait(api: Api) -> None:
    run_id = new_run(api)
    task_id = submit(api, run_id, {"n": 1})["id"]
    answer = api.ok("GET", f"/v1/tasks/{task_id}?waitMs=200")
    assert (answer["done"], answer["state"]) == (False, "QUEUED")
    assert api.error("GET", f"/v1/tasks/{task_id}?waitMs=999999") == (400, "VALIDATION_FAILED")


def test_receive_long_poll_is_woken_by_a_submit(api: Api) -> None:
    run_id = new_run(api)
    got: list[list[dict[str, Any]]] = []
    poller = threading.Thread(target=lambda: got.append(receive(api, run_id, waitMs=20_000)))
    poller.start()
    time.sleep(0.3)  # let the poll park (correctness does not depend on it)
    task_id = submit(api, run_id, {"n": 1})["id"]
    poller.join(POLL_TIMEOUT_S)
    assert got and [d["taskId"] for d in got[0]] == [task_id]


def test_receive_hands_out_fifo_and_at_most_max(api: Api) -> None:
    run_id = new_run(api)
    ids = [submit(api, run_id, {"n": n})["id"] for n in range(5)]
    first = receive(api, run_id, max=3)
    second = receive(api, run_id, max=3)
    assert [d["taskId"] for d in first + second] == ids
    assert receive(api, run_id, max=3) == []


def test_lapsed_lease_is_taken_over_and_the_late_complete_refused(api: Api) -> None:
    run_id = new_run(api)
    task_id = submit(api, run_id, {"n": 1})["id"]
    (old,) = receive(api, run_id, leaseMs=300)
    taken: list[dict[str, Any]] = []
    wait_until(lambda: bool(taken.extend(receive(api, run_id)) or taken), "the lease to lapse")
    (new,) = taken
    assert (new["taskId"], new["attempt"]) == (task_id, 2)
    assert settle_error(api, old, "complete", {"result": {"payload": "late"}}) == (
        409,
        "STALE_CLAIM",
    )
    assert settle_error(api, old, "renew", {}) == (409, "STALE_CLAIM")
    assert task(api, task_id)["state"] == "RUNNING"
    settle_ok(api, new, "complete", {"result": {"payload": "on time"}})
    assert task(api, task_id)["outcome"] == "on time"


def test_retry_reject_release_and_attempts(api: Api) -> None:
    run_id = new_run(api)
    task_id = submit(api, run_id, {"n": 1}, attempts=2)["id"]
    (first,) = receive(api, run_id)
    assert settle_ok(api, first, "release")["state"] == "QUEUED"
    (second,) = receive(api, run_id)
    assert second["attempt"] == 1  # a release counts no attempt
    assert settle_ok(api, second, "retry", {"error": "flaky", "delayMs": 0})["state"] == "QUEUED"
    (third,) = receive(api, run_id)
    assert third["attempt"] == 2
    failed = settle_ok(api, third, "retry", {"error": "still flaky"})
    assert (failed["state"], failed["outcomeReason"]) == ("FAILED", "handler_error: still flaky")  # out of attempts
    assert (task(api, task_id)["error"], task(api, task_id)["state"]) == ("still flaky", "FAILED")
    assert task(api, task_id)["outcomeReason"] == "handler_error: still flaky"

    other = submit(api, run_id, {"n": 2})["id"]
    (delivery,) = receive(api, run_id)
    assert settle_ok(api, delivery, "reject", {"error": "bad input"})["state"] == "FAILED"
    result = api.ok("GET", f"/v1/tasks/{other}")
    assert (result["done"], result["state"], result["error"]) == (True, "FAILED", "bad input")
    assert result["outcomeReason"] == "rejected: bad input"


def test_retry_backoff_holds_the_task_back(api: Api) -> None:
    run_id = new_run(api)
    task_id = submit(api, run_id, {"n": 1})["id"]
    (first,) = receive(api, run_id)
    settle_ok(api, first, "retry", {"delayMs": 60_000})
    assert receive(api, run_id) == []
    assert task(api, task_id)["state"] == "QUEUED"


def test_large_bodies_are_read_whole_and_oversized_ones_refused(api: Api) -> None:
    run_id = new_run(api)
    near_limit = {"blob": "y" * (60 * 1024)}  # arrives in many TCP segments
    created = submit(api, run_id, near_limit)
    assert task(api, created["id"])["input"] == near_limit
    status, answer = api("POST", "/v1/tasks", raw=b"x" * (300 * 1024))
    assert (status, answer["error"]["code"]) == (400, "VALIDATION_FAILED")


def test_batch_submit_answers_each_task_on_its_own(api: Api) -> None:
    run_id = new_run(api)
    path = "/v1/tasks/batch"
    work = mailbox_id(api)

    def item(task_input: Any, key: str | None = None) -> dict[str, Any]:
        return task_body(run_id, work, task_input, key)

    # A task its schema refuses refuses the whole call (issue 39): nothing is submitted.
    assert api.error("POST", path, {"tasks": [item(1, "a"), 7]}) == (400, "VALIDATION_FAILED")
    answer = api.ok("POST", path, {"tasks": [item(1, "a"), item(2, "a"), item(3), item("x" * 70_000)]})
    first, conflict, third, too_large = answer["tasks"]
    assert (first["created"], first["state"], third["created"]) == (True, "QUEUED", True)
    assert conflict["error"]["code"] == "KEY_CONFLICT"
    assert too_large["error"]["code"] == "VALIDATION_FAILED"  # well-formed, over a bound: its own error
    again = api.ok("POST", path, {"tasks": [item(1, "a")]})["tasks"]
    assert (again[0]["id"], again[0]["created"]) == (first["id"], False)
    assert api.error("POST", path, {"tasks": []}) == (400, "VALIDATION_FAILED")
    assert api.error("POST", path, {"tasks": [item(n) for n in range(101)]}) == (400, "VALIDATION_FAILED")
    assert api.error("POST", path, {"tasks": [{**item(1), "mailbox": "work"}]}) == (400, "VALIDATION_FAILED")
    api.ok("POST", f"/v1/scopes/{run_id}/cancel")
    refused = api.ok("POST", path, {"tasks": [item(9)]})["tasks"][0]
    assert refused["error"]["code"] == "SCOPE_CANCELLED"


def test_batch_complete_answers_each_delivery_as_its_own_complete(api: Api) -> None:
    """A good delivery, a stale token, an unknown id and a result too large in one call: each
    answers what its own complete answers, and a refused one changes nothing. A malformed item
    (one its schema refuses) refuses the whole call (issue 39)."""
    run_id = new_run(api)
    path = "/v1/messages/complete"
    for n in range(3):
        submit(api, run_id, {"n": n})
    good, stale, big = receive(api, run_id, max=3)
    settle_ok(api, stale, "release")  # its token is stale from now on
    (fresh,) = receive(api, run_id)
    assert fresh["taskId"] == stale["taskId"]

    def item(delivery: dict[str, Any], payload: Any) -> dict[str, Any]:
        return {"id": delivery["taskId"], "token": delivery["token"], "result": {"payload": payload}}

    too_large = "x" * 70_000
    for malformed in (7, {**item(fresh, 1), "extra": 1}, {"id": fresh["taskId"], "result": {"payload": 1}}):
        assert api.error("POST", path, {"items": [item(good, "g"), malformed]}) == (400, "VALIDATION_FAILED")
    assert task(api, good["taskId"])["state"] == "RUNNING"
    items: list[Any] = [
        item(good, "g"), item(stale, "late"), {"id": "tsk_nope", "token": "tsk_nope.1.x"}, item(big, too_large),
    ]
    answers = api.ok("POST", path, {"items": items})["items"]
    assert answers[0] == {"taskId": good["taskId"], "state": "SUCCEEDED", "attempt": 1, "outcomeReason": None}
    assert [answer["error"]["code"] for answer in answers[1:]] == ["STALE_CLAIM", "NOT_FOUND", "VALIDATION_FAILED"]
    # The same refusals, word for word, as the single complete's.
    for delivery, payload, answer in ((stale, "late", answers[1]), (big, too_large, answers[3])):
        status, single = settle(api, delivery, "complete", {"result": {"payload": payload}})
        assert status >= 400 and single["error"]["code"] == answer["error"]["code"]
        assert single["error"]["message"] == answer["error"]["message"]
    assert (task(api, good["taskId"])["state"], task(api, good["taskId"])["outcome"]) == ("SUCCEEDED", "g")
    for held in (fresh, big):
        view = task(api, held["taskId"])
        assert (view["state"], view["outcome"]) == ("RUNNING", None)
    # The same item again (a retry after a lost answer) gets the same answer, and records nothing more.
    assert api.ok("POST", path, {"items": [item(good, "again")]})["items"] == answers[:1]
    assert task(api, good["taskId"])["outcome"] == "g"

    # The call itself: 1 to 100 items.
    for body in ({"items": []}, {"items": [item(fresh, n) for n in range(101)]}, {"items": "x"}, {}):
        assert api.error("POST", path, body) == (400, "VALIDATION_FAILED")
    assert task(api, fresh["taskId"])["state"] == "RUNNING"
    answered = api.ok("POST", path, {"items": [item(fresh, "f"), item(big, "b")]})["items"]
    assert [answer["state"] for answer in answered] == ["SUCCEEDED", "SUCCEEDED"]
    for n in range(2):
        submit(api, run_id, {"late": n})
    (held,) = receive(api, run_id)
    api.ok("POST", f"/v1/scopes/{run_id}/cancel")
    (refused,) = api.ok("POST", path, {"items": [item(held, 1)]})["items"]
    assert refused["error"]["code"] == "SCOPE_CANCELLED"


def test_batch_results_wait_for_every_task(api: Api) -> None:
    run_id = new_run(api)
    ids = [submit(api, run_id, {"n": n})["id"] for n in range(3)]
    pending = api.ok("POST", "/v1/tasks/results", {"ids": ids, "waitMs": 100})["results"]
    assert [view["done"] for view in pending] == [False, False, False]
    answers: list[Any] = []
    waiter = threading.Thread(
        target=lambda: answers.append(api.ok("POST", "/v1/tasks/results", {"ids": ids, "waitMs": 20_000}))
    )
    waiter.start()
    for delivery in receive(api, run_id, max=3):
        settle_ok(api, delivery, "complete", {"result": {"payload": delivery["input"]["n"]}})
    waiter.join(POLL_TIMEOUT_S)
    assert [(view["state"], view["outcome"]) for view in answers[0]["results"]] == [
        ("SUCCEEDED", 0), ("SUCCEEDED", 1), ("SUCCEEDED", 2)
    ]
    unknown = api.ok("POST", "/v1/tasks/results", {"ids": ["tsk_nope"]})["results"][0]
    assert unknown["error"]["code"] == "NOT_FOUND"
    assert api.error("POST", "/v1/tasks/results", {"ids": "x"}) == (400, "VALIDATION_FAILED")
    # view=task: each result is the task view GET /tasks/{id} answers.
    whole = api.ok("POST", "/v1/tasks/results", {"ids": [*ids, "tsk_nope"], "view": "task"})["results"]
    assert whole[:3] == [api.ok("GET", f"/v1/tasks/{task_id}") for task_id in ids]
    assert whole[3] == unknown
    assert api.error("POST", "/v1/tasks/results", {"ids": ids, "view": "full"}) == (400, "VALIDATION_FAILED")


def test_key_only_returns_the_existing_task_whatever_the_input(api: Api) -> None:
    run_id = new_run(api)
    first = submit(api, run_id, {"company": "acme", "at": 1}, key="acme", keyOnly=True)
    again = submit(api, run_id, {"company": "acme", "at": 2}, key="acme", keyOnly=True)
    assert (again["id"], again["created"]) == (first["id"], False)
    assert task(api, first["id"])["input"] == {"company": "acme", "at": 1}
    assert submit_error(api, run_id, 3, taskKey="acme") == (409, "KEY_CONFLICT")  # without keyOnly
    assert submit_error(api, run_id, 3, taskKey="x", keyOnly="yes") == (400, "VALIDATION_FAILED")
