"""Pools, rate limits and spend budgets over HTTP, against a real dev node: configuration, direct
use under a run (acquire, take, reserve and settle, with their long polls), and jobs that take
their resources with their delivery."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from tests._http import Api, mailbox_id, recv, settle_error, settle_ok, task_ok
from tests._nodes import DevNode

JOIN_TIMEOUT_S = 20.0
WAIT_MS = 300


@pytest.fixture
def api(dev_node: DevNode) -> Api:
    api = Api(dev_node.url, space=f"resources-{uuid.uuid4().hex[:12]}")
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


def timed(call: Callable[[], Any]) -> tuple[Any, float]:
    started = time.monotonic()
    answer = call()
    return answer, time.monotonic() - started


def submit(api: Api, run_id: str, key: str, **needs: Any) -> dict[str, Any]:
    answer: dict[str, Any] = task_ok(api, run_id, {"input": key, "key": key, **needs})
    return answer


def receive(api: Api, run_id: str, **body: Any) -> list[dict[str, Any]]:
    deliveries: list[dict[str, Any]] = recv(api, run_id, **{"max": 10, "leaseMs": 60_000, **body})
    return deliveries


# -- configuration ---------------------------------------------------------------------------------


def test_pool_ensure_resize_and_view(api: Api) -> None:
    created = api.ok("PUT", "/v1/pools/browser", {"size": 2})
    assert created == {"name": "browser", "size": 2, "inUse": 0, "waiting": 0, "holders": [], "created": True}
    resized = api.ok("PUT", "/v1/pools/browser", {"size": 3})
    assert (resized["size"], resized["created"]) == (3, False)
    assert api.ok("GET", "/v1/pools/browser") == {"name": "browser", "size": 3, "inUse": 0, "waiting": 0, "holders": []}
    assert api.error("GET", "/v1/pools/nothing") == (404, "NOT_FOUND")
    for bad in ({}, {"size": 0}, {"size": "2"}, {"size": True}, {"size": 10**9}):
        assert api.error("PUT", "/v1/pools/browser", bad) == (400, "VALIDATION_FAILED"), bad
    assert api.error("PUT", "/v1/pools/" + "p" * 129, {"size": 1}) == (400, "VALIDATION_FAILED")


def test_limit_ensure_takes_per_or_interval_ms(api: Api) -> None:
    created = api.ok("PUT", "/v1/limits/search-api", {"units": 10, "per": "1s"})
    assert created == {"name": "search-api", "units": 10, "intervalMs": 1000, "available": 10, "takenInWindow": 0,
                       "waiting": 0, "created": True}
    assert api.ok("PUT", "/v1/limits/search-api", {"units": 5, "per": "500ms"})["intervalMs"] == 500
    assert api.ok("PUT", "/v1/limits/search-api", {"units": 5, "per": "2m"})["intervalMs"] == 120_000
    changed = api.ok("PUT", "/v1/limits/search-api", {"units": 3, "intervalMs": 250})
    assert (changed["units"], changed["intervalMs"], changed["created"]) == (3, 250, False)
    assert api.ok("GET", "/v1/limits/search-api")["units"] == 3
    assert api.error("GET", "/v1/limits/nothing") == (404, "NOT_FOUND")
    for bad in (
        {"per": "1s"}, {"units": 0, "per": "1s"}, {"units": 1}, {"units": 1, "per": "1s", "intervalMs": 1000},
        {"units": 1, "per": "soon"}, {"units": 1, "per": "0s"}, {"units": 1, "per": 1}, {"units": 1, "intervalMs": 0},
        {"units": 1, "per": "1000000h"},
    ):
        status, answer = api("PUT", "/v1/limits/search-api", bad)
        assert (status, answer["error"]["code"]) == (400, "VALIDATION_FAILED"), bad


def test_budget_ensure_and_view_in_decimals(api: Api) -> None:
    created = api.ok("PUT", "/v1/budgets/model-usd", {"total": 10})
    assert created == {"name": "model-usd", "total": 10.0, "spent": 0.0, "reserved": 0.0, "remaining": 10.0,
                       "waiting": 0, "reservations": [], "created": True}
    assert api.ok("PUT", "/v1/budgets/model-usd", {"total": 12.5})["total"] == 12.5
    assert api.ok("GET", "/v1/budgets/model-usd")["remaining"] == 12.5
    assert api.error("GET", "/v1/budgets/nothing") == (404, "NOT_FOUND")
    for bad in ({}, {"total": -1}, {"total": "10"}, {"total": True}, {"total": 1e300}):
        assert api.error("PUT", "/v1/budgets/model-usd", bad) == (400, "VALIDATION_FAILED"), bad
    for raw in (b'{"total": NaN}', b'{"total": Infinity}', b'{"total": -Infinity}'):
        assert api.error("PUT", "/v1/budgets/model-usd", raw=raw) == (400, "VALIDATION_FAILED"), raw


# -- slots -----------------------------------------------------------------------------------------


def test_acquire_renew_release_and_the_waiter_is_woken(api: Api) -> None:
    run_id = new_run(api)
    api.ok("PUT", "/v1/pools/browser", {"size": 1})
    acquire = f"/v1/scopes/{run_id}/pools/browser/acquire"
    held = api.ok("POST", acquire, {"leaseMs": 10_000, "holder": "worker-1"})
    assert held["granted"] and held["leaseId"] and held["leaseExpiresAt"]
    view = api.ok("GET", "/v1/pools/browser")
    assert (view["inUse"], [holder["holder"] for holder in view["holders"]]) == (1, ["worker-1"])
    assert (view["holders"][0]["leaseId"], view["holders"][0]["scopeId"]) == (held["leaseId"], run_id)

    refused, elapsed_s = timed(lambda: api.ok("POST", acquire, {"waitMs": WAIT_MS}))
    assert refused == {"granted": False, "leaseId": None, "leaseExpiresAt": None}
    assert elapsed_s >= WAIT_MS / 1000 * 0.9
    assert api.ok("POST", acquire, {}) == refused  # waitMs 0: at once

    thread, woken = in_background(lambda: api.ok("POST", acquire, {"waitMs": 20_000, "holder": "worker-2"}))
    assert api.ok("POST", f"/v1/slots/{held['leaseId']}/renew", {"leaseMs": 10_000})["leaseExpiresAt"]
    assert api.ok("POST", f"/v1/slots/{held['leaseId']}/release") == {"released": True}
    thread.join(JOIN_TIMEOUT_S)
    assert woken and woken[0]["granted"] and woken[0]["leaseId"] != held["leaseId"]
    assert [holder["holder"] for holder in api.ok("GET", "/v1/pools/browser")["holders"]] == ["worker-2"]

    assert api.error("POST", f"/v1/slots/{held['leaseId']}/renew", {}) == (409, "STALE_CLAIM")
    assert api.error("POST", f"/v1/slots/{woken[0]['leaseId']}/renew", {"leaseMs": 1}) == (400, "VALIDATION_FAILED")
    # A hold is forgotten when it ends: an id never issued answers as one that ended.
    assert api.error("POST", "/v1/slots/slt_nothing/renew", {}) == (409, "STALE_CLAIM")
    assert api.ok("POST", "/v1/slots/slt_nothing/release") == {"released": False}


def test_an_abandoned_acquire_takes_no_slot(api: Api) -> None:
    run_id = new_run(api)
    api.ok("PUT", "/v1/pools/browser", {"size": 1})
    acquire = f"/v1/scopes/{run_id}/pools/browser/acquire"
    held = api.ok("POST", acquire, {})
    request = urllib.request.Request(
        api.base_url + acquire, data=json.dumps({"waitMs": 10_000}).encode(), method="POST",
        headers={**api.headers, "Content-Type": "application/json"},
    )
    with pytest.raises(OSError):  # the client gives up (a timeout) and closes its connection
        urllib.request.urlopen(request, timeout=0.5)
    api.ok("POST", f"/v1/slots/{held['leaseId']}/release")
    assert api.ok("POST", acquire, {"waitMs": 5_000})["granted"]
    assert api.ok("GET", "/v1/pools/browser")["inUse"] == 1


def test_a_lapsed_slot_returns_to_the_pool(api: Api) -> None:
    run_id = new_run(api)
    api.ok("PUT", "/v1/pools/browser", {"size": 1})
    acquire = f"/v1/scopes/{run_id}/pools/browser/acquire"
    lapsing = api.ok("POST", acquire, {"leaseMs": 200})
    taken = api.ok("POST", acquire, {"waitMs": 10_000})  # woken when the first lease lapses
    assert taken["granted"]
    assert api.error("POST", f"/v1/slots/{lapsing['leaseId']}/renew", {}) == (409, "STALE_CLAIM")
    assert api.ok("POST", f"/v1/slots/{lapsing['leaseId']}/release") == {"released": False}


def test_acquire_take_and_reserve_refusals(api: Api) -> None:
    run_id = new_run(api)
    api.ok("PUT", "/v1/pools/browser", {"size": 1})
    api.ok("PUT", "/v1/limits/search-api", {"units": 2, "per": "1s"})
    api.ok("PUT", "/v1/budgets/model-usd", {"total": 1})
    acquire = f"/v1/scopes/{run_id}/pools/browser/acquire"
    take = f"/v1/scopes/{run_id}/limits/search-api/take"
    reserve = f"/v1/scopes/{run_id}/budgets/model-usd/reserve"

    assert api.error("POST", f"/v1/scopes/{run_id}/pools/nothing/acquire", {}) == (404, "NOT_FOUND")
    assert api.error("POST", f"/v1/scopes/{run_id}/limits/nothing/take", {}) == (404, "NOT_FOUND")
    assert api.error("POST", f"/v1/scopes/{run_id}/budgets/nothing/reserve", {"amount": 0.1}) == (404, "NOT_FOUND")
    assert api.error("POST", "/v1/scopes/run_nothing/pools/browser/acquire", {}) == (404, "NOT_FOUND")
    for path, body in (
        (acquire, {"leaseMs": 1}), (acquire, {"waitMs": 30_001}), (acquire, {"holder": "h" * 129}),
        (acquire, {"waitMs": "soon"}),
        (take, {"units": 0}), (take, {"units": 3}), (take, {"units": 1.5}),
        (reserve, {}), (reserve, {"amount": -0.1}), (reserve, {"amount": 2}), (reserve, {"amount": "1"}),
        (reserve, {"amount": 0.1, "leaseMs": 10**9}),
    ):
        assert api.error("POST", path, body) == (400, "VALIDATION_FAILED"), (path, body)

    held = api.ok("POST", acquire, {"leaseMs": 10_000})
    reserved = api.ok("POST", reserve, {"amount": 0.5, "leaseMs": 10_000})
    api.ok("POST", f"/v1/scopes/{run_id}/cancel")
    assert api.error("POST", acquire, {}) == (409, "SCOPE_CANCELLED")
    assert api.error("POST", take, {}) == (409, "SCOPE_CANCELLED")
    assert api.error("POST", reserve, {"amount": 0.1}) == (409, "SCOPE_CANCELLED")
    # Renewals are refused, so holders learn the run stopped; handing back stays allowed.
    assert api.error("POST", f"/v1/slots/{held['leaseId']}/renew", {}) == (409, "SCOPE_CANCELLED")
    assert api.error("POST", f"/v1/reservations/{reserved['reservationId']}/renew", {}) == (409, "SCOPE_CANCELLED")
    assert api.ok("POST", f"/v1/slots/{held['leaseId']}/release") == {"released": True}
    assert api.ok("POST", f"/v1/reservations/{reserved['reservationId']}/settle", {"spent": 0.2}) == {
        "charged": 0.2, "returned": 0.3,
    }


# -- rate limits -----------------------------------------------------------------------------------


def test_take_waits_for_the_window_to_open(api: Api) -> None:
    run_id = new_run(api)
    api.ok("PUT", "/v1/limits/search-api", {"units": 2, "per": "1s"})
    take = f"/v1/scopes/{run_id}/limits/search-api/take"
    first = api.ok("POST", take, {})
    assert first["taken"] and first["availableAt"]
    assert api.ok("POST", take, {"units": 1})["taken"]
    refused = api.ok("POST", take, {})
    assert not refused["taken"] and refused["availableAt"] > first["availableAt"]
    view = api.ok("GET", "/v1/limits/search-api")
    assert (view["available"], view["takenInWindow"]) == (0, 2)
    waited, elapsed_s = timed(lambda: api.ok("POST", take, {"waitMs": WAIT_MS}))
    assert not waited["taken"] and elapsed_s >= WAIT_MS / 1000 * 0.9
    # Woken when the window opens (about a second after the first takes), not at waitMs.
    taken, elapsed_s = timed(lambda: api.ok("POST", take, {"waitMs": 20_000}))
    assert taken["taken"] and elapsed_s < 15  # woken by the window, well before its 20 s waitMs


# -- budgets ---------------------------------------------------------------------------------------


def test_reserve_settle_release_and_the_cap_on_spending(api: Api) -> None:
    run_id = new_run(api)
    api.ok("PUT", "/v1/budgets/model-usd", {"total": 1})
    reserve = f"/v1/scopes/{run_id}/budgets/model-usd/reserve"
    first = api.ok("POST", reserve, {"amount": 0.4, "holder": "agent-1"})
    assert (first["granted"], first["amount"]) == (True, 0.4) and first["reservationId"] and first["leaseExpiresAt"]
    second = api.ok("POST", reserve, {"amount": 0.4, "leaseMs": 10_000})
    refused, elapsed_s = timed(lambda: api.ok("POST", reserve, {"amount": 0.4, "waitMs": WAIT_MS}))
    assert refused == {"granted": False, "reservationId": None, "amount": 0.4, "leaseExpiresAt": None}
    assert elapsed_s >= WAIT_MS / 1000 * 0.9
    view = api.ok("GET", "/v1/budgets/model-usd")
    assert (view["spent"], view["reserved"], view["remaining"]) == (0.0, 0.8, pytest.approx(0.2))
    assert {(r["reservationId"], r["amount"]) for r in view["reservations"]} == {
        (first["reservationId"], 0.4), (second["reservationId"], 0.4),
    }

    thread, woken = in_background(lambda: api.ok("POST", reserve, {"amount": 0.5, "waitMs": 20_000}))
    assert api.ok("POST", f"/v1/reservations/{first['reservationId']}/renew", {"leaseMs": 10_000})["leaseExpiresAt"]
    assert api.ok("POST", f"/v1/reservations/{first['reservationId']}/settle", {"spent": 0.1}) == {
        "charged": 0.1, "returned": 0.3,
    }
    thread.join(JOIN_TIMEOUT_S)
    assert woken and woken[0]["granted"]  # 0.5 fits once 0.3 returned
    assert api.error("POST", f"/v1/reservations/{first['reservationId']}/settle", {"spent": 0.1}) == (409, "STALE_CLAIM")
    assert api.error("POST", f"/v1/reservations/{first['reservationId']}/renew", {}) == (409, "STALE_CLAIM")
    assert api.ok("POST", f"/v1/reservations/{second['reservationId']}/release") == {"released": True}
    # Spending over the reservation is charged only up to what the budget still has: 0.5 + 0.4.
    assert api.ok("POST", f"/v1/reservations/{woken[0]['reservationId']}/settle", {"spent": 5}) == {
        "charged": 0.9, "returned": 0.0,
    }
    view = api.ok("GET", "/v1/budgets/model-usd")
    assert (view["spent"], view["reserved"], view["remaining"], view["reservations"]) == (1.0, 0.0, 0.0, [])
    assert api.error("POST", "/v1/reservations/rsv_nothing/settle", {"spent": 1}) == (409, "STALE_CLAIM")
    assert api.ok("POST", "/v1/reservations/rsv_nothing/release") == {"released": False}
    assert api.error("POST", f"/v1/reservations/{second['reservationId']}/settle", {}) == (400, "VALIDATION_FAILED")


def test_amounts_are_exact_in_millionths(api: Api) -> None:
    run_id = new_run(api)
    api.ok("PUT", "/v1/budgets/model-usd", {"total": 10})
    reserve = f"/v1/scopes/{run_id}/budgets/model-usd/reserve"
    for _ in range(25):
        reservation = api.ok("POST", reserve, {"amount": 0.4})
        api.ok("POST", f"/v1/reservations/{reservation['reservationId']}/settle", {"spent": 0.4})
    view = api.ok("GET", "/v1/budgets/model-usd")
    assert (view["spent"], view["remaining"]) == (10.0, 0.0)
    assert not api.ok("POST", reserve, {"amount": 0.000001})["granted"]


# -- jobs that need resources ----------------------------------------------------------------------


def test_a_job_waits_for_its_slot_and_gets_it_when_the_first_completes(api: Api) -> None:
    run_id = new_run(api)
    api.ok("PUT", "/v1/pools/browser", {"size": 1})
    first = submit(api, run_id, "a", slots="browser")
    second = submit(api, run_id, "b", slots=["browser"])
    plain = submit(api, run_id, "c")  # needs nothing: goes past the blocked one
    task = api.ok("GET", f"/v1/tasks/{first['id']}")
    assert task["needs"] == {"slots": ["browser"], "limit": None, "budget": None}
    assert api.ok("GET", f"/v1/tasks/{plain['id']}")["needs"] is None

    deliveries = receive(api, run_id)
    assert [delivery["taskId"] for delivery in deliveries] == [first["id"], plain["id"]]
    delivery = deliveries[0]
    assert delivery["needs"] == {"slots": ["browser"], "limit": None, "budget": None}
    assert len(delivery["holds"]["slots"]) == 1 and delivery["holds"]["reservationId"] is None
    assert deliveries[1]["holds"] == {"slots": [], "reservationId": None}
    view = api.ok("GET", "/v1/pools/browser")
    assert (view["inUse"], view["waiting"], view["holders"][0]["taskId"]) == (1, 1, first["id"])
    assert view["holders"][0]["leaseId"] == delivery["holds"]["slots"][0]
    assert receive(api, run_id, waitMs=WAIT_MS) == []

    thread, woken = in_background(lambda: receive(api, run_id, waitMs=20_000))
    settle_ok(api, delivery, "complete", {"result": {"payload": "done"}})
    thread.join(JOIN_TIMEOUT_S)
    assert woken and [delivery["taskId"] for delivery in woken[0]] == [second["id"]]
    assert api.ok("GET", "/v1/pools/browser")["waiting"] == 0


def test_a_jobs_holds_end_with_its_delivery_only(api: Api) -> None:
    run_id = new_run(api)
    api.ok("PUT", "/v1/pools/browser", {"size": 1})
    api.ok("PUT", "/v1/budgets/model-usd", {"total": 1})
    submit(api, run_id, "a", slots="browser", budget={"name": "model-usd", "reserve": 0.5})
    (delivery,) = receive(api, run_id, leaseMs=300)
    (lease,), reservation = delivery["holds"]["slots"], delivery["holds"]["reservationId"]
    for path in (f"/v1/slots/{lease}/renew", f"/v1/slots/{lease}/release", f"/v1/reservations/{reservation}/renew",
                 f"/v1/reservations/{reservation}/release"):
        assert api.error("POST", path, {}) == (409, "CONFLICT"), path
    assert api.error("POST", f"/v1/reservations/{reservation}/settle", {"spent": 0.1}) == (409, "CONFLICT")
    # The delivery's lease lapses: its slot and its whole reservation return (nothing spent).
    (again,) = receive(api, run_id, waitMs=10_000)
    assert again["taskId"] == delivery["taskId"] and again["holds"]["slots"] != [lease]
    budget = api.ok("GET", "/v1/budgets/model-usd")
    assert (budget["spent"], budget["reserved"]) == (0.0, 0.5)
    assert settle_ok(api, again, "release")["state"] == "QUEUED"
    assert (api.ok("GET", "/v1/pools/browser")["inUse"], api.ok("GET", "/v1/budgets/model-usd")["reserved"]) == (0, 0.0)


def test_a_lapsed_reservation_returns_whole(api: Api) -> None:
    run_id = new_run(api)
    api.ok("PUT", "/v1/budgets/model-usd", {"total": 1})
    reserve = f"/v1/scopes/{run_id}/budgets/model-usd/reserve"
    lapsing = api.ok("POST", reserve, {"amount": 1, "leaseMs": 200})
    assert api.ok("POST", reserve, {"amount": 1, "waitMs": 10_000})["granted"]  # woken by the lapse
    assert api.error("POST", f"/v1/reservations/{lapsing['reservationId']}/settle", {"spent": 1}) == (409, "STALE_CLAIM")
    assert api.ok("GET", "/v1/budgets/model-usd")["spent"] == 0.0


def test_a_stopped_run_returns_its_jobs_slots(api: Api) -> None:
    run_id, other_run = new_run(api), new_run(api)
    api.ok("PUT", "/v1/pools/browser", {"size": 1})
    submit(api, run_id, "a", slots="browser")
    (delivery,) = receive(api, run_id)
    submit(api, other_run, "b", slots="browser")
    assert receive(api, other_run) == []
    api.ok("POST", f"/v1/scopes/{run_id}/cancel")
    (taken,) = receive(api, other_run, waitMs=10_000)
    assert taken["holds"]["slots"] and api.ok("GET", "/v1/pools/browser")["holders"][0]["scopeId"] == other_run
    assert settle_ok(api, delivery, "release")["state"] == "CANCELLED"


def test_a_job_of_a_rate_limit_is_served_when_units_are_free(api: Api) -> None:
    run_id = new_run(api)
    api.ok("PUT", "/v1/limits/search-api", {"units": 1, "per": "1h"})
    first = submit(api, run_id, "a", limit={"name": "search-api"})
    submit(api, run_id, "b", limit={"name": "search-api", "units": 1})
    assert api.ok("GET", f"/v1/tasks/{first['id']}")["needs"]["limit"] == {"name": "search-api", "units": 1}
    (delivery,) = receive(api, run_id)
    assert delivery["taskId"] == first["id"]
    settle_ok(api, delivery, "complete", {})
    assert receive(api, run_id) == []  # taken units are spent, not returned
    view = api.ok("GET", "/v1/limits/search-api")
    assert (view["available"], view["waiting"]) == (0, 1)
    api.ok("PUT", "/v1/limits/search-api", {"units": 2, "per": "1h"})  # a config change wakes the queue
    assert len(receive(api, run_id, waitMs=10_000)) == 1


def test_a_jobs_reservation_is_settled_with_what_it_spent(api: Api) -> None:
    run_id = new_run(api)
    api.ok("PUT", "/v1/budgets/model-usd", {"total": 1})
    submitted = [submit(api, run_id, key, budget={"name": "model-usd", "reserve": 0.25}) for key in "abcd"]
    task = api.ok("GET", f"/v1/tasks/{submitted[0]['id']}")
    assert task["needs"]["budget"] == {"name": "model-usd", "reserve": 0.25}
    deliveries = receive(api, run_id)
    assert len(deliveries) == 4 and all(delivery["holds"]["reservationId"] for delivery in deliveries)
    budget = api.ok("GET", "/v1/budgets/model-usd")
    assert (budget["reserved"], budget["remaining"]) == (1.0, 0.0)
    assert {r["taskId"] for r in budget["reservations"]} == {delivery["taskId"] for delivery in deliveries}
    a, b, c, d = deliveries
    assert settle_error(api, a, "complete", {"spent": -1}) == (400, "VALIDATION_FAILED")
    settle_ok(api, a, "complete", {"result": {"payload": 1}, "spent": 0.1})
    settle_ok(api, b, "retry", {"spent": 0.05, "delayMs": 3_600_000})
    settle_ok(api, c, "reject", {"error": "no", "spent": 0.0})
    settle_ok(api, d, "complete", {})  # no spent: the whole reservation counts as spent
    budget = api.ok("GET", "/v1/budgets/model-usd")
    assert (budget["spent"], budget["reserved"], budget["remaining"]) == (
        pytest.approx(0.4), 0.0, pytest.approx(0.6),
    )


def test_spending_over_the_reservation_is_capped_by_what_remains(api: Api) -> None:
    run_id = new_run(api)
    api.ok("PUT", "/v1/budgets/model-usd", {"total": 1})
    submit(api, run_id, "a", budget={"name": "model-usd", "reserve": 0.4})
    (delivery,) = receive(api, run_id)
    settle_ok(api, delivery, "complete", {"spent": 7.5})
    budget = api.ok("GET", "/v1/budgets/model-usd")
    assert (budget["spent"], budget["remaining"]) == (1.0, 0.0)


def test_submit_refuses_needs_that_could_never_be_met(api: Api) -> None:
    run_id = new_run(api)
    api.ok("PUT", "/v1/pools/browser", {"size": 1})
    api.ok("PUT", "/v1/limits/search-api", {"units": 2, "per": "1s"})
    api.ok("PUT", "/v1/budgets/model-usd", {"total": 1})
    work = mailbox_id(api)
    path = "/v1/tasks"

    def body(task_input: Any, **needs: Any) -> dict[str, Any]:
        return {"scopeId": run_id, "mailboxId": work, "input": task_input, **needs}

    for needs in ({"slots": "nothing"}, {"slots": ["browser", "nothing"]}, {"limit": {"name": "nothing"}},
                  {"budget": {"name": "nothing", "reserve": 0.1}}):
        assert api.error("POST", path, body(1, **needs)) == (404, "NOT_FOUND"), needs
    for needs in (
        {"limit": {"name": "search-api", "units": 3}}, {"budget": {"name": "model-usd", "reserve": 1.5}},
        {"slots": 5}, {"slots": []}, {"slots": ["browser"] * 17}, {"slots": [""]},
        {"slots": ["browser", "browser"]},  # two slots of a pool of one
        {"limit": "search-api"}, {"limit": {"units": 1}}, {"limit": {"name": "search-api", "units": 0}},
        {"budget": {"name": "model-usd"}}, {"budget": {"name": "model-usd", "reserve": -1}},
        {"budget": ["model-usd", 0.1]},
    ):
        assert api.error("POST", path, body(1, **needs)) == (400, "VALIDATION_FAILED"), needs
    status, answer = api("POST", path, body(1, limit={"name": "search-api", "units": "1"}))
    assert status == 400 and "limit.units" in answer["error"]["message"]
    batch = api.ok("POST", f"{path}/batch", {"tasks": [
        body(1, slots="browser", limit={"name": "search-api"}, budget={"name": "model-usd", "reserve": 0.5}),
        body(2, slots="nothing"),
        body(3, budget={"name": "model-usd", "reserve": 2}),
    ]})["tasks"]
    assert batch[0]["created"] and [item.get("error", {}).get("code") for item in batch] == [
        None, "NOT_FOUND", "VALIDATION_FAILED",
    ]
    assert api.ok("GET", f"/v1/tasks/{batch[0]['id']}")["needs"] == {
        "slots": ["browser"], "limit": {"name": "search-api", "units": 1}, "budget": {"name": "model-usd", "reserve": 0.5},
    }
