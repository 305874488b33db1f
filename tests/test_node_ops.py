"""Diagnostics over HTTP (the published protocol's §5.14), against a real dev node: a run's
holders and what they hold, and why each waiting thing waits, naming the resource and its holder."""

from __future__ import annotations

from typing import Any

import pytest
from runstate import Runstate

from tests._http import Api, new_space, recv, task_ok
from tests._nodes import DevNode


@pytest.fixture
def api(dev_node: DevNode) -> Api:
    api = Api(dev_node.url, space=new_space(dev_node.url, "ops"))
    api.ok("POST", "/v1/mailboxes", {"name": "work"})
    return api


def new_run(api: Api, parent: str | None = None) -> str:
    return str(api.ok("POST", "/v1/scopes", {"parentId": parent} if parent else {})["id"])


def lease_body(run_id: str, holder: str) -> dict[str, Any]:
    return {"scopeId": run_id, "holder": holder, "holderSession": f"{holder}-session", "leaseSeconds": 60}


def waiting_of(view: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [entry for entry in view["waiting"] if entry["kind"] == kind]


def test_a_run_shows_its_holders_and_what_they_hold(api: Api) -> None:
    run_id = new_run(api)
    child = new_run(api, run_id)
    api.ok("POST", "/v1/claims", {**lease_body(child, "w1"), "key": "repo-lock"})
    permit_id = api.ok("PUT", "/v1/permits/by-name/gpu", {"units": 2})["id"]
    api.ok("POST", f"/v1/permits/{permit_id}/acquire", {**lease_body(run_id, "w2"), "units": 2})
    task_ok(api, child, {"input": 1, "key": "t1"})
    (delivery,) = recv(api, child, leaseMs=60_000)

    view = api.ok("GET", f"/v1/ops/runs/{run_id}")
    assert view["rootScopeId"] == run_id and not view["truncated"]
    assert [scope["id"] for scope in view["scopes"]] == [run_id, child]
    workers = {worker["holder"]: worker for worker in view["workers"]}
    assert workers["w1"]["keys"] == ["repo-lock"] and workers["w1"]["sessions"] == ["w1-session"]
    assert workers["w1"]["earliestLeaseExpiry"].endswith("Z")
    assert [(g["permit"], g["units"]) for g in workers["w2"]["grants"]] == [("gpu", 2)]
    assert workers["tests"]["tasks"] == [delivery["taskId"]]
    assert api.error("GET", "/v1/ops/runs/run_nope") == (404, "NOT_FOUND")


def test_a_job_short_of_a_permit_names_the_permit_and_its_holder(api: Api) -> None:
    """Why is my task not starting? Its slot's permit is full, and w9's grant holds it."""
    run_id = new_run(api)
    permit_id = api.ok("PUT", "/v1/permits/by-name/browser", {"units": 1})["id"]
    api.ok("POST", f"/v1/permits/{permit_id}/acquire", lease_body(run_id, "w9"))
    task_id = task_ok(api, run_id, {"input": 1, "key": "needs-browser", "requirements": {"pools": [{"name": "browser", "units": 1}]}})["id"]
    idle_id = task_ok(api, run_id, {"input": 2, "key": "plain"})["id"]
    assert recv(api, run_id, max=1) != []  # the plain task goes; the other is blocked on the permit
    assert recv(api, run_id, max=1) == []

    view = api.ok("GET", f"/v1/ops/runs/{run_id}")
    (blocked,) = [entry for entry in waiting_of(view, "task") if entry["taskId"] == task_id]
    (permit,) = blocked["waitsFor"]
    assert permit["kind"] == "permit" and permit["name"] == "browser" and permit["permitId"] == permit_id
    assert (permit["unitsTotal"], permit["unitsInUse"]) == (1, 1)
    assert [holder["holder"] for holder in permit["heldBy"]] == ["w9"]
    assert idle_id not in [entry["taskId"] for entry in waiting_of(view, "task")]  # it was delivered

    waits = api.ok("GET", "/v1/ops/waits")
    assert [entry["taskId"] for entry in waiting_of(waits, "task")] == [task_id]


def test_waits_lists_a_job_short_of_a_permit_before_any_worker_asked(api: Api) -> None:
    run_id = new_run(api)
    permit_id = api.ok("PUT", "/v1/permits/by-name/gpu", {"units": 1})["id"]
    api.ok("POST", f"/v1/permits/{permit_id}/acquire", lease_body(run_id, "w1"))
    needs = {"requirements": {"pools": [{"name": "gpu", "units": 1}]}}
    task_id = task_ok(api, run_id, {"input": 1, "key": "needs-gpu", **needs})["id"]
    task_ok(api, run_id, {"input": 2, "key": "plain"})

    (entry,) = waiting_of(api.ok("GET", "/v1/ops/waits"), "task")  # no worker has received yet
    assert entry["taskId"] == task_id and entry["mailbox"] == "work"
    (permit,) = entry["waitsFor"]
    assert (permit["kind"], permit["permitId"]) == ("permit", permit_id)
    assert [holder["holder"] for holder in permit["heldBy"]] == ["w1"]


def test_waiters_barriers_timers_and_tasks_nobody_took(api: Api) -> None:
    run_id = new_run(api)
    permit_id = api.ok("PUT", "/v1/permits/by-name/one", {"units": 1})["id"]
    api.ok("POST", f"/v1/permits/{permit_id}/acquire", lease_body(run_id, "first"))
    waiter_id = api.ok("POST", f"/v1/permits/{permit_id}/wait", {"scopeId": run_id, "units": 1, "holder": "second"})[
        "waiterId"
    ]
    allowance_id = api.ok("PUT", "/v1/allowances/by-name/search", {"unitsLimit": 1, "windowSeconds": 3600})["id"]
    api.ok("POST", f"/v1/allowances/{allowance_id}/consume", {"scopeId": run_id, "units": 1, "holder": "first"})
    line = api.ok("POST", f"/v1/allowances/{allowance_id}/wait",
                  {"scopeId": run_id, "units": 1, "holder": "third", "ttlSeconds": 60})
    assert line["state"] == "WAITING"
    api.ok("PUT", "/v1/barriers/by-name/stage", {"scopeId": run_id, "target": 3})
    api.ok("POST", "/v1/timers", {"scopeId": run_id, "afterSeconds": 3600})
    task_id = task_ok(api, run_id, {"input": 1, "key": "alone"})["id"]

    view = api.ok("GET", f"/v1/ops/runs/{run_id}")
    (waiter,) = waiting_of(view, "permitWaiter")
    assert (waiter["waiterId"], waiter["holder"], waiter["position"], waiter["state"]) == (waiter_id, "second", 0, "WAITING")
    assert [holder["holder"] for holder in waiter["waitsFor"][0]["heldBy"]] == ["first"]
    (allowance_waiter,) = waiting_of(view, "allowanceWaiter")
    assert (allowance_waiter["waiterId"], allowance_waiter["position"]) == (line["waiterId"], 0)
    (window,) = allowance_waiter["waitsFor"]
    assert window["kind"] == "allowance" and window["name"] == "search" and window["availableAt"].endswith("Z")
    (barrier,) = waiting_of(view, "barrier")
    assert (barrier["name"], barrier["arrivals"], barrier["target"]) == ("stage", 0, 3)
    (timer,) = waiting_of(view, "timer")
    assert timer["fireAt"].endswith("Z")
    (task,) = waiting_of(view, "task")
    assert task["taskId"] == task_id and task["waitsFor"] == [{"kind": "worker", "mailbox": "work"}]

    waits = api.ok("GET", "/v1/ops/waits")
    assert [entry["waiterId"] for entry in waiting_of(waits, "permitWaiter")] == [waiter_id]
    assert [entry["waiterId"] for entry in waiting_of(waits, "allowanceWaiter")] == [line["waiterId"]]
    assert waiting_of(waits, "task") == []  # waiting only for a worker: in its run's view


def test_the_sdk_reads_both_views(dev_node: DevNode) -> None:
    space = new_space(dev_node.url, "ops-sdk")
    api = Api(dev_node.url, space=space)
    run_id = new_run(api)
    api.ok("POST", "/v1/claims", {**lease_body(run_id, "sdk-worker"), "key": "k"})
    with Runstate(base_url=dev_node.url, space_id=space) as rs:
        assert [worker["holder"] for worker in rs.diagnostics.workers(run_id)] == ["sdk-worker"]
        assert rs.diagnostics.run(run_id)["rootScopeId"] == run_id
        assert rs.diagnostics.waits() == {"waiting": [], "truncated": False}
