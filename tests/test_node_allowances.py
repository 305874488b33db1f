"""Allowances over HTTP (the published protocol's §5.7), against a real dev node: create, declare,
list and read them; consume with ALLOWANCE_EXHAUSTED / ALLOWANCE_COOLDOWN and Retry-After; the
durable FIFO waiters granted by the server's tick; settling an estimate; and the limit routes
sharing one rate limit with them."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from tests._http import Api, new_space
from tests._nodes import DevNode


@pytest.fixture
def api(dev_node: DevNode) -> Api:
    return Api(dev_node.url, space=new_space(dev_node.url, "allowances"))


def new_run(api: Api) -> str:
    return str(api.ok("POST", "/v1/scopes", {})["id"])


def consume(api: Api, allowance_id: str, run_id: str, units: int = 1) -> tuple[int, Any]:
    return api("POST", f"/v1/allowances/{allowance_id}/consume", {"scopeId": run_id, "units": units, "holder": "w"})


def retry_after(dev_node: DevNode, api: Api, allowance_id: str, run_id: str) -> tuple[int, str]:
    request = urllib.request.Request(
        dev_node.url + api.space_path(f"/v1/allowances/{allowance_id}/consume"), method="POST",
        data=b'{"scopeId": "%s"}' % run_id.encode(), headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(request, timeout=10)
    raised.value.close()
    return raised.value.code, raised.value.headers["Retry-After"]


def until(condition: Any, timeout_s: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def test_create_list_read_and_declare(api: Api) -> None:
    created = api.ok("POST", "/v1/allowances", {"name": "search", "unitsLimit": 3, "windowSeconds": 2})
    allowance_id = created["id"]
    assert created == {"id": allowance_id, "name": "search", "unitsLimit": 3, "windowSeconds": 2}
    assert allowance_id.startswith("alw_")
    assert api.error("POST", "/v1/allowances", {"name": "search", "unitsLimit": 3, "windowSeconds": 2}) == (409, "CONFLICT")
    for bad in ({}, {"name": "x"}, {"name": "x", "unitsLimit": 1}, {"name": "x", "unitsLimit": 0, "windowSeconds": 1},
                {"name": "x", "unitsLimit": 1, "windowSeconds": 86_401}, {"name": "x", "unitsLimit": "1", "windowSeconds": 1}):
        assert api.error("POST", "/v1/allowances", bad) == (400, "VALIDATION_FAILED"), bad
    assert api.ok("GET", "/v1/allowances") == {"allowances": [created]}
    view = api.ok("GET", f"/v1/allowances/{allowance_id}")
    assert view["remaining"] == 3 and view["cooldownUntil"] is None and view["waiters"] == []
    assert view["windowStart"].endswith("Z")
    assert api.error("GET", "/v1/allowances/alw_nothing") == (404, "NOT_FOUND")
    assert api.ok("PUT", "/v1/allowances/by-name/search", {}) == {**created, "created": False}
    assert api.ok("PUT", "/v1/allowances/by-name/search", {"unitsLimit": 3, "windowSeconds": 2})["created"] is False
    assert api.error("PUT", "/v1/allowances/by-name/search", {"unitsLimit": 4, "windowSeconds": 2}) == (409, "CONFLICT")
    assert api.error("PUT", "/v1/allowances/by-name/other", {}) == (404, "NOT_FOUND")
    assert api.error("PUT", "/v1/allowances/by-name/other", {"unitsLimit": 4}) == (400, "VALIDATION_FAILED")
    declared = api.ok("PUT", "/v1/allowances/by-name/other", {"unitsLimit": 4, "windowSeconds": 60})
    assert (declared["unitsLimit"], declared["created"]) == (4, True)
    assert [row["name"] for row in api.ok("GET", "/v1/allowances")["allowances"]] == ["search", "other"]


def test_consume_until_exhausted_then_cooldown(api: Api, dev_node: DevNode) -> None:
    allowance_id = api.ok("POST", "/v1/allowances", {"name": "search", "unitsLimit": 2, "windowSeconds": 60})["id"]
    run_id = new_run(api)
    status, taken = consume(api, allowance_id, run_id, units=2)
    assert status == 201 and set(taken) == {"consumptionId", "units", "windowStart", "remaining"}
    assert taken["consumptionId"].startswith("acn_") and taken["remaining"] == 0
    assert retry_after(dev_node, api, allowance_id, run_id) == (429, "60")
    assert consume(api, allowance_id, run_id, units=3)[1]["error"]["code"] == "VALIDATION_FAILED"
    assert api.ok("GET", f"/v1/allowances/{allowance_id}")["remaining"] == 0
    cooled = api.ok("POST", f"/v1/allowances/{allowance_id}/cooldown", {"seconds": 120, "reason": "provider 429"})
    assert cooled["reason"] == "provider 429"
    shorter = api.ok("POST", f"/v1/allowances/{allowance_id}/cooldown", {"seconds": 5})
    assert shorter == cooled  # a shorter cooldown never shortens a longer one
    assert consume(api, allowance_id, run_id)[1]["error"]["code"] == "ALLOWANCE_COOLDOWN"
    code, seconds = retry_after(dev_node, api, allowance_id, run_id)
    assert code == 429 and 118 <= int(seconds) <= 120
    assert api.ok("GET", f"/v1/allowances/{allowance_id}")["cooldownUntil"] == cooled["cooldownUntil"]
    for bad in ({}, {"seconds": 0}, {"seconds": 86_401}, {"seconds": "1"}, {"seconds": 1, "reason": 3}):
        assert api.error("POST", f"/v1/allowances/{allowance_id}/cooldown", bad) == (400, "VALIDATION_FAILED"), bad
    api.ok("POST", f"/v1/scopes/{run_id}/cancel", {})
    assert consume(api, allowance_id, run_id)[1]["error"]["code"] == "SCOPE_CANCELLED"


def test_waiters_are_granted_by_the_server_in_order(api: Api) -> None:
    allowance_id = api.ok("PUT", "/v1/allowances/by-name/search", {"unitsLimit": 1, "windowSeconds": 1})["id"]
    run_id = new_run(api)
    body = {"scopeId": run_id, "units": 1, "holder": "w", "ttlSeconds": 30}
    first = api.ok("POST", f"/v1/allowances/{allowance_id}/wait", body)
    assert first["state"] == "GRANTED" and first["consumptionId"].startswith("acn_")
    second = api.ok("POST", f"/v1/allowances/{allowance_id}/wait", body)
    third = api.ok("POST", f"/v1/allowances/{allowance_id}/wait", body)
    assert (second["state"], second["consumptionId"]) == ("WAITING", None)
    assert consume(api, allowance_id, run_id)[1]["error"]["code"] == "ALLOWANCE_EXHAUSTED"  # the line is first
    view = api.ok("GET", f"/v1/allowance-waiters/{third['waiterId']}")
    assert (view["state"], view["position"], view["allowanceId"], view["consumptionId"]) == ("WAITING", 1, allowance_id, None)
    granted = until(lambda: api.ok("GET", f"/v1/allowance-waiters/{second['waiterId']}")["state"] == "GRANTED")
    assert granted
    assert api.ok("GET", f"/v1/allowance-waiters/{third['waiterId']}")["state"] == "WAITING"
    assert until(lambda: api.ok("GET", f"/v1/allowance-waiters/{third['waiterId']}")["state"] == "GRANTED")
    last = api.ok("POST", f"/v1/allowances/{allowance_id}/wait", body)
    cancelled = api.ok("POST", f"/v1/allowance-waiters/{last['waiterId']}/cancel", {})
    assert cancelled in ({"waiterId": last["waiterId"], "state": "CANCELLED", "consumptionId": None},
                         {**cancelled, "state": "GRANTED"})  # best effort: a grant that came first stands
    assert api.error("GET", "/v1/allowance-waiters/awt_nothing") == (404, "NOT_FOUND")
    assert api.error("POST", f"/v1/allowances/{allowance_id}/wait", {**body, "units": 2}) == (400, "VALIDATION_FAILED")
    assert api.error("POST", f"/v1/allowances/{allowance_id}/wait", {**body, "ttlSeconds": 0}) == (400, "VALIDATION_FAILED")
    api.ok("POST", f"/v1/allowances/{allowance_id}/cooldown", {"seconds": 60})
    stopped = api.ok("POST", f"/v1/allowances/{allowance_id}/wait", body)
    api.ok("POST", f"/v1/scopes/{run_id}/cancel", {})
    assert api.ok("GET", f"/v1/allowance-waiters/{stopped['waiterId']}")["state"] == "CANCELLED"


def test_settle_returns_unused_units(api: Api) -> None:
    allowance_id = api.ok("POST", "/v1/allowances", {"name": "tokens", "unitsLimit": 1000, "windowSeconds": 60})["id"]
    run_id = new_run(api)
    status, taken = consume(api, allowance_id, run_id, units=800)
    assert status == 201
    path = f"/v1/allowance-consumptions/{taken['consumptionId']}/settle"
    settled = api.ok("POST", path, {"units": 300})
    assert settled == {"consumptionId": taken["consumptionId"], "estimatedUnits": 800, "units": 300,
                       "returnedUnits": 500, "overrunUnits": 0}
    assert api.ok("POST", path, {"units": 300}) == settled
    assert api.error("POST", path, {"units": 200}) == (409, "CONFLICT")
    assert api.error("POST", path, {}) == (400, "VALIDATION_FAILED")
    assert api.ok("GET", f"/v1/allowances/{allowance_id}")["remaining"] == 700
    assert api.error("POST", "/v1/allowance-consumptions/acn_nothing/settle", {"units": 1}) == (404, "NOT_FOUND")
