"""Resources over HTTP, against a real dev node: jobs that take what their `requirements` name with
their delivery (permits, allowances, budgets), the resize extension (`PATCH` of a permit, an
allowance or a budget) and fractional allowance windows. The resources' own routes are tested
in test_node_permits.py, test_node_allowances.py and test_node_budgets.py."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from tests._http import Api, mailbox_id, new_space, recv, settle_ok, task_ok
from tests._nodes import DevNode

JOIN_TIMEOUT_S = 20.0
WAIT_MS = 300


@pytest.fixture
def api(dev_node: DevNode) -> Api:
    api = Api(dev_node.url, space=new_space(dev_node.url, "resources"))
    api.ok("POST", "/v1/mailboxes", {"name": "work"})
    return api


def new_run(api: Api) -> str:
    return str(api.ok("POST", "/v1/scopes", {})["id"])


def in_background(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """`call()` on a thread of its own; its answer lands in the list."""
    answers: list[Any] = []
    thread = threading.Thread(target=lambda: answers.append(call()))
    thread.start()
    return thread, answers


def submit(api: Api, run_id: str, key: str, **requirements: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"input": key, "key": key}
    if requirements:
        body["requirements"] = requirements
    answer: dict[str, Any] = task_ok(api, run_id, body)
    return answer


def receive(api: Api, run_id: str, **body: Any) -> list[dict[str, Any]]:
    deliveries: list[dict[str, Any]] = recv(api, run_id, **{"max": 10, "leaseMs": 60_000, **body})
    return deliveries


def permit(api: Api, name: str, units: int) -> str:
    return str(api.ok("PUT", f"/v1/permits/by-name/{name}", {"units": units})["id"])


def allowance(api: Api, name: str, units: int, window_s: float) -> str:
    return str(api.ok("PUT", f"/v1/allowances/by-name/{name}", {"unitsLimit": units, "windowSeconds": window_s})["id"])


# -- the resize extension --------------------------------------------------------------------------


def test_a_permit_is_resized_by_patch_and_more_units_wake_a_waiting_job(api: Api) -> None:
    run_id = new_run(api)
    permit_id = permit(api, "browser", 1)
    submit(api, run_id, "a", pools=[{"name": "browser", "units": 1}])
    second = submit(api, run_id, "b", pools=[{"name": "browser", "units": 1}])
    assert len(receive(api, run_id)) == 1
    thread, woken = in_background(lambda: receive(api, run_id, waitMs=20_000))
    resized = api.ok("PATCH", f"/v1/permits/{permit_id}", {"units": 2})
    thread.join(JOIN_TIMEOUT_S)
    assert (resized["id"], resized["name"], resized["unitsTotal"]) == (permit_id, "browser", 2)
    assert woken and [delivery["taskId"] for delivery in woken[0]] == [second["id"]]
    # A declaration still never resizes: the same size is found, another one is CONFLICT.
    assert api.ok("PUT", "/v1/permits/by-name/browser", {"units": 2})["created"] is False
    assert api.error("PUT", "/v1/permits/by-name/browser", {"units": 1}) == (409, "CONFLICT")
    # Below what is in use: nothing is taken back, nothing new is granted.
    assert api.ok("PATCH", f"/v1/permits/{permit_id}", {"units": 1})["unitsInUse"] == 2
    for bad in ({}, {"units": 0}, {"units": "2"}, {"units": True}, {"units": 10**9}, {"units": 1, "name": "x"}):
        assert api.error("PATCH", f"/v1/permits/{permit_id}", bad) == (400, "VALIDATION_FAILED"), bad
    assert api.error("PATCH", "/v1/permits/prm_nothing", {"units": 1}) == (404, "NOT_FOUND")
    assert api.ok("GET", f"/v1/permits/{permit_id}")["unitsTotal"] == 1


def test_an_allowance_is_changed_by_patch_and_takes_a_fraction_of_a_second(api: Api) -> None:
    run_id = new_run(api)
    allowance_id = allowance(api, "search-api", 1, 3600)
    first = submit(api, run_id, "a", quotas=[{"name": "search-api", "units": 1}])
    second = submit(api, run_id, "b", quotas=[{"name": "search-api", "units": 1}])
    (delivery,) = receive(api, run_id)
    assert delivery["taskId"] == first["id"]
    settle_ok(api, delivery, "complete", {})
    assert receive(api, run_id, waitMs=WAIT_MS) == []  # taken units are spent, not returned
    thread, woken = in_background(lambda: receive(api, run_id, waitMs=20_000))
    changed = api.ok("PATCH", f"/v1/allowances/{allowance_id}", {"unitsLimit": 2, "windowSeconds": 3600})
    thread.join(JOIN_TIMEOUT_S)
    assert (changed["unitsLimit"], changed["windowSeconds"]) == (2, 3600)
    assert woken and [delivery["taskId"] for delivery in woken[0]] == [second["id"]]

    fast = api.ok("PUT", "/v1/allowances/by-name/fast", {"unitsLimit": 5, "windowSeconds": 0.25})
    assert (fast["windowSeconds"], fast["created"]) == (0.25, True)
    assert api.ok("PATCH", f"/v1/allowances/{fast['id']}", {"unitsLimit": 5, "windowSeconds": 0.003})["windowSeconds"] == 0.003
    for bad in ({"unitsLimit": 1}, {"windowSeconds": 1}, {"unitsLimit": 1, "windowSeconds": 0.0005},
                {"unitsLimit": 1, "windowSeconds": 0}, {"unitsLimit": 1, "windowSeconds": 86_401},
                {"unitsLimit": 1, "windowSeconds": "1"}, {"unitsLimit": 1, "windowSeconds": True},
                {"unitsLimit": None, "windowSeconds": 2.9976404001213505e307},  # found by schemathesis: was a 500
                {"unitsLimit": 1, "windowSeconds": 10**30}):
        assert api.error("PATCH", f"/v1/allowances/{allowance_id}", bad) == (400, "VALIDATION_FAILED"), bad
        assert api.error("POST", "/v1/allowances", {"name": "bad", **bad}) == (400, "VALIDATION_FAILED"), bad
    assert api.error("PATCH", "/v1/allowances/alw_nothing", {"unitsLimit": 1, "windowSeconds": 1}) == (404, "NOT_FOUND")
    assert api.ok("GET", f"/v1/allowances/{allowance_id}")["unitsLimit"] == 2


def test_a_budget_limit_is_changed_by_patch_in_its_own_minor_units(api: Api) -> None:
    run_id = new_run(api)
    created = api.ok("PUT", "/v1/budgets/by-name/model-usd", {"limitMinor": "100", "scale": 2, "currency": "USD"})
    budget_id = created["id"]
    submit(api, run_id, "a", budgets=[{"name": "model-usd", "reserveMinor": "100"}])
    second = submit(api, run_id, "b", budgets=[{"name": "model-usd", "reserveMinor": "50"}])
    assert len(receive(api, run_id)) == 1
    thread, woken = in_background(lambda: receive(api, run_id, waitMs=20_000))
    changed = api.ok("PATCH", f"/v1/budgets/{budget_id}", {"limitMinor": "150"})
    thread.join(JOIN_TIMEOUT_S)
    assert (changed["limitMinor"], changed["scale"]) == ("150", 2)
    assert woken and [delivery["taskId"] for delivery in woken[0]] == [second["id"]]
    view = api.ok("GET", f"/v1/budgets/{budget_id}")
    assert (view["limitMinor"], view["reservedMinor"], view["remainingMinor"]) == ("150", "150", "0")
    for bad in ({}, {"limitMinor": "0"}, {"limitMinor": "-1"}, {"limitMinor": "1.5"}, {"limitMinor": 10**19}):
        assert api.error("PATCH", f"/v1/budgets/{budget_id}", bad) == (400, "VALIDATION_FAILED"), bad
    assert api.error("PATCH", "/v1/budgets/bdg_nothing", {"limitMinor": "1"}) == (404, "NOT_FOUND")


def test_the_old_resource_routes_are_gone(api: Api) -> None:
    run_id = new_run(api)
    for method, path, body in (
        ("PUT", "/v1/pools/browser", {"size": 1}), ("GET", "/v1/pools/browser", None),
        ("PUT", "/v1/limits/search", {"units": 1, "per": "1s"}), ("GET", "/v1/limits/search", None),
        ("PUT", "/v1/budgets/model-usd", {"total": 1}), ("GET", "/v1/budgets/model-usd", None),
        ("POST", f"/v1/scopes/{run_id}/pools/browser/acquire", {}),
        ("POST", f"/v1/scopes/{run_id}/limits/search/take", {}),
        ("POST", f"/v1/scopes/{run_id}/budgets/model-usd/reserve", {"amount": 1}),
        ("POST", "/v1/slots/slt_x/renew", {}), ("POST", "/v1/reservations/rsv_x/settle", {"spent": 1}),
    ):
        assert api.error(method, path, body) in ((404, "NOT_FOUND"), (405, "METHOD_NOT_ALLOWED")), (method, path)
    # The old needs fields of a task are refused as unknown fields, and nothing is created.
    work = mailbox_id(api)
    for old in ({"slots": "browser"}, {"limit": {"name": "search"}}, {"budget": {"name": "m", "reserve": 1}}):
        body = {"scopeId": run_id, "mailboxId": work, "input": 1, **old}
        assert api.error("POST", "/v1/tasks", body) == (400, "VALIDATION_FAILED"), old
    assert receive(api, run_id) == []


# -- jobs' requirements ----------------------------------------------------------------------------


def test_a_job_waits_for_its_permit_and_gets_it_when_the_first_completes(api: Api) -> None:
    run_id = new_run(api)
    permit_id = permit(api, "browser", 1)
    first = submit(api, run_id, "a", pools=[{"name": "browser", "units": 1}])
    second = submit(api, run_id, "b", pools=[{"name": "browser", "units": 1}])
    plain = submit(api, run_id, "c")  # needs nothing: goes past the blocked one

    deliveries = receive(api, run_id)
    assert [delivery["taskId"] for delivery in deliveries] == [first["id"], plain["id"]]
    view = api.ok("GET", f"/v1/permits/{permit_id}")
    assert (view["unitsInUse"], view["grants"][0]["taskId"]) == (1, first["id"])
    assert receive(api, run_id, waitMs=WAIT_MS) == []

    thread, woken = in_background(lambda: receive(api, run_id, waitMs=20_000))
    settle_ok(api, deliveries[0], "complete", {"result": {"payload": "done"}})
    thread.join(JOIN_TIMEOUT_S)
    assert woken and [delivery["taskId"] for delivery in woken[0]] == [second["id"]]


def test_a_stopped_run_returns_its_jobs_permits(api: Api) -> None:
    run_id, other_run = new_run(api), new_run(api)
    permit_id = permit(api, "browser", 1)
    submit(api, run_id, "a", pools=[{"name": "browser", "units": 1}])
    (delivery,) = receive(api, run_id)
    submit(api, other_run, "b", pools=[{"name": "browser", "units": 1}])
    assert receive(api, other_run) == []
    api.ok("POST", f"/v1/scopes/{run_id}/cancel")
    (taken,) = receive(api, other_run, waitMs=10_000)
    assert taken["taskId"] and api.ok("GET", f"/v1/permits/{permit_id}")["grants"][0]["scopeId"] == other_run
    assert settle_ok(api, delivery, "release")["state"] == "CANCELLED"


def test_submit_refuses_requirements_that_could_never_be_met(api: Api) -> None:
    run_id = new_run(api)
    permit(api, "browser", 1)
    allowance(api, "search-api", 2, 1)
    api.ok("PUT", "/v1/budgets/by-name/model-usd", {"limitMinor": "100", "scale": 2, "currency": "USD"})
    work = mailbox_id(api)

    def body(**requirements: Any) -> dict[str, Any]:
        return {"scopeId": run_id, "mailboxId": work, "input": 1, "requirements": requirements}

    for requirements in ({"pools": [{"name": "nothing", "units": 1}]}, {"quotas": [{"name": "nothing", "units": 1}]},
                         {"budgets": [{"name": "nothing", "reserveMinor": "1"}]}):
        assert api.error("POST", "/v1/tasks", body(**requirements)) == (404, "NOT_FOUND"), requirements
    for requirements in (
        {"pools": [{"name": "browser", "units": 2}]}, {"quotas": [{"name": "search-api", "units": 3}]},
        {"budgets": [{"name": "model-usd", "reserveMinor": "101"}]}, {"pools": "browser"},
        {"pools": [{"name": "browser", "units": 0}]}, {"budgets": [{"name": "model-usd", "reserveMinor": "-1"}]},
    ):
        assert api.error("POST", "/v1/tasks", body(**requirements)) == (400, "VALIDATION_FAILED"), requirements
    assert receive(api, run_id) == []
