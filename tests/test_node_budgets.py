"""Budgets over HTTP (the published protocol's §5.9), against a real dev node: create, declare,
list and read them; reserve, settle (partial, by workKey, with an overrun) and void; the flows of
0.3.0's budget tests (test_budget_charges_overruns_and_refuses, _broken_cost_charges_the_reserve,
test_budget_async, which read the hosted database) through the API; a queue's
requirements.budgets; and the old decimal routes on the same budgets."""

from __future__ import annotations

from typing import Any

import pytest

from tests._http import Api, new_space
from tests._nodes import DevNode

WORKER = {"holder": "w1", "holderSession": "s1", "leaseSeconds": 30}


@pytest.fixture
def api(dev_node: DevNode) -> Api:
    return Api(dev_node.url, space=new_space(dev_node.url, "budgets"))


def new_run(api: Api) -> str:
    return str(api.ok("POST", "/v1/scopes", {})["id"])


def balance(api: Api, budget_id: str) -> dict[str, str]:
    view = api.ok("GET", f"/v1/budgets/{budget_id}")
    return {"reserved": view["reservedMinor"], "settled": view["settledMinor"]}


def reserve(api: Api, budget_id: str, run_id: str, amount: str) -> tuple[int, Any]:
    return api("POST", f"/v1/budgets/{budget_id}/reserve", {"scopeId": run_id, "holder": "w", "amountMinor": amount})


def settle(api: Api, budget_id: str, reservation_id: str, amount: str, **extra: Any) -> tuple[int, Any]:
    body = {"reservationId": reservation_id, "amountMinor": amount, "workKey": f"settle:{reservation_id}", **extra}
    return api("POST", f"/v1/budgets/{budget_id}/settle", body)


def void(api: Api, budget_id: str, reservation_id: str) -> tuple[int, Any]:
    body = {"reservationId": reservation_id, "workKey": f"void:{reservation_id}"}
    return api("POST", f"/v1/budgets/{budget_id}/void", body)


def call(api: Api, budget_id: str, run_id: str, reserve_minor: str, cost_minor: str | None) -> None:
    """What 0.3.0's budget() does around one call: reserve, then settle the cost with allowOverrun
    (and void the rest while it is ACTIVE), or void when the call failed (cost None)."""
    status, reserved = reserve(api, budget_id, run_id, reserve_minor)
    assert status == 201, reserved
    reservation_id = reserved["reservationId"]
    if cost_minor is None:
        assert void(api, budget_id, reservation_id)[0] == 200
        return
    status, settled = settle(api, budget_id, reservation_id, cost_minor, allowOverrun=True)
    assert status == 200, settled
    if settled["state"] == "ACTIVE":
        assert void(api, budget_id, reservation_id)[0] == 200


def test_create_list_read_and_declare(api: Api) -> None:
    created = api.ok("POST", "/v1/budgets", {"name": "usd", "currency": "USD", "scale": 2, "limitMinor": "100"})
    budget_id = created["id"]
    assert created == {"id": budget_id, "name": "usd", "currency": "USD", "scale": 2, "limitMinor": "100"}
    assert budget_id.startswith("bdg_")
    assert api.error("POST", "/v1/budgets", {"name": "usd", "limitMinor": "100"}) == (409, "CONFLICT")
    for bad in (
        {"name": "x"}, {"name": "x", "limitMinor": "0"}, {"name": "x", "limitMinor": "1.5"},
        {"name": "x", "limitMinor": "1", "scale": 10}, {"name": "x", "limitMinor": "1", "currency": "usd"},
        {"name": "x", "limitMinor": str(10**18 + 1)}, {"name": "bdg_x", "limitMinor": "1"},
    ):
        assert api.error("POST", "/v1/budgets", bad) == (400, "VALIDATION_FAILED"), bad
    assert api.ok("GET", "/v1/budgets") == {"budgets": [created]}
    assert api.ok("GET", f"/v1/budgets/{budget_id}") == {
        **created, "reservedMinor": "0", "settledMinor": "0", "remainingMinor": "100", "waiting": 0, "reservations": [],
    }
    assert api.error("GET", "/v1/budgets/bdg_nothing") == (404, "NOT_FOUND")
    assert api.ok("PUT", "/v1/budgets/by-name/usd", {}) == {**created, "created": False}
    assert api.ok("PUT", "/v1/budgets/by-name/usd", {"limitMinor": "100"}) == {**created, "created": False}
    for other in ({"limitMinor": "101"}, {"limitMinor": "100", "scale": 3}, {"limitMinor": "100", "currency": "EUR"}):
        assert api.error("PUT", "/v1/budgets/by-name/usd", other) == (409, "CONFLICT"), other
    assert api.error("PUT", "/v1/budgets/by-name/eur", {}) == (404, "NOT_FOUND")
    declared = api.ok("PUT", "/v1/budgets/by-name/eur", {"limitMinor": 5000, "currency": "EUR", "scale": 3})
    assert (declared["limitMinor"], declared["scale"], declared["currency"], declared["created"]) == ("5000", 3, "EUR", True)
    assert [row["name"] for row in api.ok("GET", "/v1/budgets")["budgets"]] == ["usd", "eur"]


def test_reserve_settle_partially_by_work_key_and_void(api: Api) -> None:
    budget_id = api.ok("PUT", "/v1/budgets/by-name/usd", {"limitMinor": "100"})["id"]
    run_id = new_run(api)
    status, reserved = reserve(api, budget_id, run_id, "40")
    assert status == 201 and (reserved["reservedMinor"], reserved["state"]) == ("40", "ACTIVE")
    assert reserved["settleBy"].endswith("Z")
    reservation_id = reserved["reservationId"]
    assert reserve(api, budget_id, run_id, "61")[1]["error"]["code"] == "INSUFFICIENT_BUDGET"
    path = f"/v1/budgets/{budget_id}/settle"
    first = api.ok("POST", path, {"reservationId": reservation_id, "amountMinor": "10", "workKey": "a"})
    assert first == {"reservationId": reservation_id, "state": "ACTIVE", "chargedMinor": "10", "settledMinor": "10",
                     "reservedMinor": "30"}
    assert api.ok("POST", path, {"reservationId": reservation_id, "amountMinor": "10", "workKey": "a"}) == first
    assert api.error("POST", path, {"reservationId": reservation_id, "amountMinor": "11", "workKey": "a"}) == (409, "CONFLICT")
    assert api.error("POST", path, {"reservationId": reservation_id, "amountMinor": "31", "workKey": "b"}) == (
        409, "INSUFFICIENT_BUDGET"
    )
    assert balance(api, budget_id) == {"reserved": "30", "settled": "10"}
    (row,) = api.ok("GET", f"/v1/budgets/{budget_id}")["reservations"]
    assert {key: row[key] for key in ("id", "scopeId", "holder", "reservedMinor", "settledMinor", "state")} == {
        "id": reservation_id, "scopeId": run_id, "holder": "w", "reservedMinor": "30", "settledMinor": "10",
        "state": "ACTIVE",
    }
    status, voided = void(api, budget_id, reservation_id)
    assert status == 200 and (voided["state"], voided["reservedMinor"], voided["settledMinor"]) == ("SETTLED", "0", "10")
    assert void(api, budget_id, reservation_id) == (200, voided)  # its own workKey again: the same answer
    assert api.error("POST", f"/v1/budgets/{budget_id}/void", {"reservationId": reservation_id, "workKey": "x"}) == (
        409, "CONFLICT"
    )
    assert settle(api, budget_id, reservation_id, "1")[1]["error"]["code"] == "CONFLICT"
    assert balance(api, budget_id) == {"reserved": "0", "settled": "10"}
    other = reserve(api, budget_id, run_id, "5")[1]["reservationId"]
    assert void(api, budget_id, other)[1]["state"] == "VOIDED"
    assert api.error("POST", path, {"reservationId": "rsv_nothing", "amountMinor": "1", "workKey": "k"}) == (404, "NOT_FOUND")


def test_the_0_3_0_budget_flows(api: Api) -> None:
    # test_budget_charges_overruns_and_refuses: reserve 0.40 of 1.00 for each call.
    budget_id = api.ok("PUT", "/v1/budgets/by-name/model-usd", {"limitMinor": "100", "currency": "USD", "scale": 2})["id"]
    run_id = new_run(api)
    call(api, budget_id, run_id, "40", "30")
    assert balance(api, budget_id) == {"reserved": "0", "settled": "30"}
    call(api, budget_id, run_id, "40", None)  # the call raised: nothing charged
    assert balance(api, budget_id) == {"reserved": "0", "settled": "30"}
    # 0.70 left: a cost of 0.90 over a reserve of 0.40 is charged up to what the budget covers.
    status, reserved = reserve(api, budget_id, run_id, "40")
    status, settled = settle(api, budget_id, reserved["reservationId"], "90", allowOverrun=True)
    assert status == 200 and (settled["state"], settled["chargedMinor"], settled["reservedMinor"]) == ("SETTLED", "70", "0")
    assert balance(api, budget_id) == {"reserved": "0", "settled": "100"}
    assert reserve(api, budget_id, run_id, "40")[1]["error"]["code"] == "INSUFFICIENT_BUDGET"
    # test_budget_broken_cost_charges_the_reserve: the whole reserve is charged.
    broken = api.ok("PUT", "/v1/budgets/by-name/broken", {"limitMinor": "100"})["id"]
    call(api, broken, run_id, "25", "25")
    assert balance(api, broken) == {"reserved": "0", "settled": "25"}
    # test_budget_async: no cost function charges the reserve; the third 0.50 of 1.00 is refused.
    halves = api.ok("PUT", "/v1/budgets/by-name/halves", {"limitMinor": "100"})["id"]
    call(api, halves, run_id, "50", "50")
    call(api, halves, run_id, "50", "50")
    assert reserve(api, halves, run_id, "50")[1]["error"]["code"] == "INSUFFICIENT_BUDGET"
    assert balance(api, halves) == {"reserved": "0", "settled": "100"}


def test_a_stopped_run_refuses_reserve_and_its_reservations_are_voided(api: Api) -> None:
    budget_id = api.ok("PUT", "/v1/budgets/by-name/usd", {"limitMinor": "100"})["id"]
    run_id = new_run(api)
    held = reserve(api, budget_id, run_id, "60")[1]["reservationId"]
    api.ok("POST", f"/v1/scopes/{run_id}/cancel", {})
    assert balance(api, budget_id) == {"reserved": "0", "settled": "0"}
    assert reserve(api, budget_id, run_id, "1")[1]["error"]["code"] == "SCOPE_CANCELLED"
    assert settle(api, budget_id, held, "10")[1]["error"]["code"] == "CONFLICT"


def test_a_queues_budget_requirement_is_reserved_at_admission_and_settled_after_complete(api: Api) -> None:
    budget_id = api.ok("PUT", "/v1/budgets/by-name/usd", {"limitMinor": "100"})["id"]
    run_id = new_run(api)
    requirements = {"budgets": [{"name": "usd", "reserveMinor": "40"}]}
    queue = api.ok("PUT", "/v1/mailboxes/by-name/jobs", {"maxAttempts": 3, "requirements": requirements})["id"]
    for key in ("a", "b", "c"):
        api.ok("POST", "/v1/tasks", {"scopeId": run_id, "mailboxId": queue, "taskKey": key, "input": key})
    admit = {"scopeId": run_id, "mailboxId": queue, **WORKER}
    first, second = api.ok("POST", "/v1/tasks/admit", admit), api.ok("POST", "/v1/tasks/admit", admit)
    assert api("POST", "/v1/tasks/admit", admit)[0] == 204  # 20 left: the third waits for money
    (reservation_id,) = first["reservations"]
    assert balance(api, budget_id) == {"reserved": "80", "settled": "0"}
    # 0.3.0 completes, then settles: the reservation outlives the delivery's end.
    api.ok("POST", f"/v1/messages/{first['messageId']}/complete", {"token": first["token"], "result": {"payload": 1}})
    settled = settle(api, budget_id, reservation_id, "15", allowOverrun=True)[1]
    assert settled["state"] == "ACTIVE"
    assert void(api, budget_id, reservation_id)[1]["state"] == "SETTLED"
    # A nack voids what its delivery held: the retry reserves again.
    api.ok("POST", f"/v1/messages/{second['messageId']}/nack", {"token": second["token"], "retry": False})
    assert balance(api, budget_id) == {"reserved": "0", "settled": "15"}
    third = api.ok("POST", "/v1/tasks/admit", admit)
    assert len(third["reservations"]) == 1 and balance(api, budget_id)["reserved"] == "40"
    api.ok("POST", f"/v1/scopes/{run_id}/cancel", {})
    assert balance(api, budget_id) == {"reserved": "0", "settled": "15"}
