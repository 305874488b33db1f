"""Claims and the default run over HTTP, against a real dev node."""

from __future__ import annotations

import threading
import uuid
from typing import Any
from urllib.parse import quote

import pytest

from tests._http import Api
from tests._nodes import DevNode

KEY = "research:0123456789abcdef0123456789abcdef/with slash"
JOIN_TIMEOUT_S = 20.0


@pytest.fixture
def api(dev_node: DevNode) -> Api:
    return Api(dev_node.url, space=f"claims-{uuid.uuid4().hex[:12]}")


def claims_path(run_id: str, key: str | None = None) -> str:
    return f"/v1/scopes/{run_id}/claims" + ("" if key is None else "/" + quote(key, safe=""))


def test_default_scope_is_stable_until_it_stops(api: Api) -> None:
    first = api.ok("PUT", "/v1/runs/default")
    assert (first["name"], first["storedState"]) == ("default", "ACTIVE")
    assert api.ok("PUT", "/v1/runs/default")["id"] == first["id"]
    api.ok("POST", f"/v1/scopes/{first['id']}/cancel")
    fresh = api.ok("PUT", "/v1/runs/default")
    assert fresh["id"] != first["id"] and fresh["effective"] == "ACTIVE"


def test_one_holder_one_result_and_waiters_are_woken(api: Api) -> None:
    run_id = api.ok("POST", "/v1/scopes", {})["id"]
    granted = api.ok("POST", claims_path(run_id), {"key": KEY, "leaseMs": 10_000, "holder": "runner"})
    assert (granted["outcome"], granted["claim"]["state"], granted["claim"]["attempt"]) == ("GRANTED", "HELD", 1)
    held = api.ok("POST", claims_path(run_id), {"key": KEY, "holder": "waiter"})
    assert (held["outcome"], held["claim"]["holder"]) == ("HELD", "runner")
    assert "leaseId" not in held
    assert api.ok("GET", claims_path(run_id, KEY) + "?waitMs=100")["state"] == "HELD"

    woken: list[Any] = []
    waiter = threading.Thread(target=lambda: woken.append(api.ok("GET", claims_path(run_id, KEY) + "?waitMs=20000")))
    waiter.start()
    api.ok("POST", f"/v1/claims/{granted['leaseId']}/renew", {"leaseMs": 10_000})
    done = api.ok("POST", f"/v1/claims/{granted['leaseId']}/complete", {"result": {"report": "acme"}})
    assert (done["state"], done["result"]) == ("DONE", {"report": "acme"})
    waiter.join(JOIN_TIMEOUT_S)
    assert woken and (woken[0]["state"], woken[0]["result"]) == ("DONE", {"report": "acme"})
    after = api.ok("POST", claims_path(run_id), {"key": KEY})
    assert (after["outcome"], after["claim"]["result"]) == ("DONE", {"report": "acme"})


def test_failures_then_failed_for_everyone(api: Api) -> None:
    run_id = api.ok("POST", "/v1/scopes", {})["id"]
    for attempt in (1, 2):
        granted = api.ok("POST", claims_path(run_id), {"key": "k", "attempts": 2})
        assert granted["claim"]["attempt"] == attempt
        answer = api.ok("POST", f"/v1/claims/{granted['leaseId']}/fail", {"error": f"boom {attempt}"})
    assert (answer["state"], answer["error"]) == ("FAILED", "boom 2")
    failed = api.ok("POST", claims_path(run_id), {"key": "k"})
    assert (failed["outcome"], failed["claim"]["error"], failed["claim"]["attempts"]) == ("FAILED", "boom 2", 2)


def test_stale_holder_and_bad_input(api: Api) -> None:
    run_id = api.ok("POST", "/v1/scopes", {})["id"]
    old = api.ok("POST", claims_path(run_id), {"key": "k", "leaseMs": 200})["leaseId"]
    taken: dict[str, Any] = {}
    pause = threading.Event()  # never set: a bounded sleep between tries
    for _ in range(400):  # the 200 ms lease lapses long before this gives up
        taken = api.ok("POST", claims_path(run_id), {"key": "k"})
        if "leaseId" in taken:
            break
        pause.wait(0.05)
    assert taken["claim"]["attempt"] == 2
    assert api.error("POST", f"/v1/claims/{old}/complete", {"result": "late"}) == (409, "STALE_CLAIM")
    assert api.error("POST", f"/v1/claims/{old}/release") == (409, "STALE_CLAIM")
    assert api.error("POST", claims_path(run_id), {}) == (400, "VALIDATION_FAILED")
    assert api.error("POST", claims_path(run_id), {"key": "k", "attempts": 0}) == (400, "VALIDATION_FAILED")
    assert api.error("POST", claims_path("run_nope"), {"key": "k"}) == (404, "NOT_FOUND")
    assert api.error("GET", claims_path("run_nope", "k")) == (404, "NOT_FOUND")
    assert api.error("POST", "/v1/claims/clm_nope.1.x/complete", {"result": 1}) == (404, "NOT_FOUND")
    too_big = {"result": "x" * (64 * 1024 + 1)}
    assert api.error("POST", f"/v1/claims/{taken['leaseId']}/complete", too_big) == (400, "VALIDATION_FAILED")
    assert api.error("GET", claims_path(run_id, "k" * 513)) == (400, "VALIDATION_FAILED")  # no claim has such a key
    unknown = api.ok("GET", claims_path(run_id, "never-claimed"))
    assert (unknown["state"], unknown["attempt"]) == ("FREE", 0)


def test_a_cancelled_run_refuses_claims_and_keeps_results(api: Api) -> None:
    run_id = api.ok("POST", "/v1/scopes", {})["id"]
    lease = api.ok("POST", claims_path(run_id), {"key": "done"})["leaseId"]
    api.ok("POST", f"/v1/claims/{lease}/complete", {"result": 42})
    held = api.ok("POST", claims_path(run_id), {"key": "held"})["leaseId"]
    assert api.ok("POST", claims_path(run_id), {"key": "done"})["scopeEffective"] == "ACTIVE"
    api.ok("POST", f"/v1/scopes/{run_id}/cancel")
    after = api.ok("POST", claims_path(run_id), {"key": "done"})
    assert (after["claim"]["result"], after["scopeEffective"]) == (42, "INACTIVE")
    assert api.error("POST", claims_path(run_id), {"key": "new"}) == (409, "SCOPE_CANCELLED")
    assert api.error("POST", f"/v1/claims/{held}/renew", {}) == (409, "SCOPE_CANCELLED")
    assert api.ok("POST", f"/v1/claims/{held}/release")["state"] == "FREE"
