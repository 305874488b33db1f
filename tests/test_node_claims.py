"""Claims (fenced mutex leases) over HTTP, against a real dev node."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
import uuid
from typing import Any
from urllib.parse import quote

import pytest

from tests._http import Api, call, new_space
from tests._nodes import DevNode

KEY = "locks/report 2024/ü?#%"  # every kind of character, `/` included, travels encoded in the path
LEASE_S = 30
LAPSE_TRIES = 400
LAPSE_PAUSE_S = 0.05


@pytest.fixture
def api(dev_node: DevNode) -> Api:
    return Api(dev_node.url, space=new_space(dev_node.url, "claims"))


def new_run(api: Api) -> str:
    return str(api.ok("POST", "/v1/scopes", {})["id"])


def body(run_id: str, key: str = KEY, holder: str = "w1", **fields: Any) -> dict[str, Any]:
    return {"scopeId": run_id, "key": key, "holder": holder, "holderSession": f"{holder}-s", "leaseSeconds": LEASE_S,
            **fields}


def path(key: str, action: str = "") -> str:
    return f"/v1/claims/{quote(key, safe='')}" + (f"/{action}" if action else "")


def test_held_until_released_then_granted_with_the_next_generation(api: Api) -> None:
    run_id = new_run(api)
    first = api.ok("POST", "/v1/claims", body(run_id))
    assert (first["key"], first["generation"], first["holder"], first["holderSession"]) == (KEY, 1, "w1", "w1-s")
    assert first["token"] and first["leaseExpiresAt"].endswith("Z")
    status, answer = api("POST", "/v1/claims", body(run_id, holder="w2"))
    assert (status, answer["error"]["code"]) == (409, "CLAIM_HELD")
    # Not re-entrant: the holder's own session asking again is refused too.
    assert api.error("POST", "/v1/claims", body(run_id)) == (409, "CLAIM_HELD")
    renewed = api.ok("POST", path(KEY, "renew"), {"token": first["token"], "leaseSeconds": LEASE_S})
    assert renewed["generation"] == 1 and renewed["leaseExpiresAt"] >= first["leaseExpiresAt"]
    assert api.ok("POST", path(KEY, "renew"), {"token": first["token"]})["generation"] == 1  # leaseSeconds optional
    released = api.ok("POST", path(KEY, "release"), {"token": first["token"], "observation": {"rows": 3}})
    assert released["released"] is True
    shown = api.ok("GET", path(KEY) + f"?scopeId={run_id}")
    assert (shown["held"], shown["generation"], shown["observation"]) == (False, 1, {"rows": 3})
    second = api.ok("POST", "/v1/claims", body(run_id, holder="w2"))
    assert (second["generation"], second["holder"]) == (2, "w2")
    assert second["token"] != first["token"]
    shown = api.ok("GET", path(KEY) + f"?scopeId={run_id}")
    assert (shown["held"], shown["generation"], shown["holder"]) == (True, 2, "w2")


def test_claim_held_carries_retry_after(api: Api) -> None:
    run_id = new_run(api)
    api.ok("POST", "/v1/claims", body(run_id, key="k"))
    status, answer, headers = call_with_headers(api, "POST", "/v1/claims", body(run_id, key="k", holder="w2"))
    assert (status, answer["error"]["code"]) == (409, "CLAIM_HELD")
    assert 1 <= float(headers["Retry-After"]) <= LEASE_S  # until the lease runs out


def call_with_headers(api: Api, method: str, route: str, payload: Any) -> tuple[int, Any, dict[str, str]]:
    request = urllib.request.Request(
        api.base_url + api.space_path(route), data=json.dumps(payload).encode(), method=method,
        headers={"Content-Type": "application/json", **api.headers},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read()), dict(error.headers)


def test_a_stale_token_is_refused_and_changes_nothing(api: Api) -> None:
    run_id = new_run(api)
    old = api.ok("POST", "/v1/claims", body(run_id))
    api.ok("POST", path(KEY, "release"), {"token": old["token"]})
    current = api.ok("POST", "/v1/claims", body(run_id, holder="w2"))
    before = api.ok("GET", path(KEY) + f"?scopeId={run_id}")
    for token in (old["token"], current["token"] + "0", "clm_nothing.1.x", "x"):
        assert api.error("POST", path(KEY, "renew"), {"token": token}) == (409, "STALE_CLAIM")
        assert api.error("POST", path(KEY, "release"), {"token": token}) == (409, "STALE_CLAIM")
    # The current token under another key's path holds nothing there.
    assert api.error("POST", path("other", "release"), {"token": current["token"]}) == (409, "STALE_CLAIM")
    assert api.ok("GET", path(KEY) + f"?scopeId={run_id}") == before
    # A release ends the token: releasing again is stale, as is renewing.
    api.ok("POST", path(KEY, "release"), {"token": current["token"]})
    assert api.error("POST", path(KEY, "release"), {"token": current["token"]}) == (409, "STALE_CLAIM")
    assert api.error("POST", path(KEY, "renew"), {"token": current["token"]}) == (409, "STALE_CLAIM")


def test_a_lapsed_lease_frees_the_claim(api: Api) -> None:
    run_id = new_run(api)
    old = api.ok("POST", "/v1/claims", body(run_id, key="k", leaseSeconds=1))
    taken: dict[str, Any] = {}
    pause = threading.Event()  # never set: a bounded sleep between tries
    for _ in range(LAPSE_TRIES):  # the 1 s lease lapses long before this gives up
        status, taken = api("POST", "/v1/claims", body(run_id, key="k", holder="w2"))
        if status == 200:
            break
        assert taken["error"]["code"] == "CLAIM_HELD"
        pause.wait(LAPSE_PAUSE_S)
    assert (taken["generation"], taken["holder"]) == (2, "w2")
    assert api.error("POST", path("k", "renew"), {"token": old["token"]}) == (409, "STALE_CLAIM")
    assert api.error("POST", path("k", "release"), {"token": old["token"]}) == (409, "STALE_CLAIM")


def test_a_stopped_run_refuses_acquire_and_renew_but_not_release(api: Api) -> None:
    run_id = new_run(api)
    held = api.ok("POST", "/v1/claims", body(run_id, key="k"))
    api.ok("POST", f"/v1/scopes/{run_id}/cancel")
    assert api.error("POST", "/v1/claims", body(run_id, key="new")) == (409, "SCOPE_CANCELLED")
    assert api.error("POST", path("k", "renew"), {"token": held["token"]}) == (409, "SCOPE_CANCELLED")
    assert api.ok("POST", path("k", "release"), {"token": held["token"]})["released"] is True


def test_bad_input(api: Api) -> None:
    run_id = new_run(api)
    assert api.error("POST", "/v1/claims", {}) == (400, "VALIDATION_FAILED")
    assert api.error("POST", "/v1/claims", body(run_id, leaseMs=10)) == (400, "VALIDATION_FAILED")  # unknown field
    assert api.error("POST", "/v1/claims", body(run_id, leaseSeconds=0)) == (400, "VALIDATION_FAILED")
    assert api.error("POST", "/v1/claims", body(run_id, key="k" * 513)) == (400, "VALIDATION_FAILED")
    assert api.error("POST", "/v1/claims", body("run_nope")) == (404, "NOT_FOUND")
    assert api.error("POST", path("k", "renew"), {}) == (400, "VALIDATION_FAILED")
    assert api.error("GET", path("k") + "?scopeId=run_nope") == (404, "NOT_FOUND")
    held = api.ok("POST", "/v1/claims", body(run_id, key="k"))
    too_big = {"token": held["token"], "observation": "x" * 5000}
    assert api.error("POST", path("k", "release"), too_big) == (400, "VALIDATION_FAILED")


def test_the_generation_survives_a_restart(node_factory: Any) -> None:
    node: DevNode = node_factory().start()
    api = Api(node.url, space=new_space(node.url, "restart"))
    run_id = new_run(api)
    for generation in (1, 2, 3):
        granted = api.ok("POST", "/v1/claims", body(run_id, key="k"))
        assert granted["generation"] == generation
        api.ok("POST", path("k", "release"), {"token": granted["token"]})
    node.stop()
    node.start()
    assert api.ok("GET", path("k") + f"?scopeId={run_id}")["generation"] == 3
    assert api.ok("POST", "/v1/claims", body(run_id, key="k"))["generation"] == 4


def test_a_retried_acquire_is_answered_with_its_first_grant(api: Api) -> None:
    """The same request under the same Idempotency-Key (a client's retry after a lost answer) gets
    the first grant again, not CLAIM_HELD against itself; a new request is refused as usual."""
    run_id = new_run(api)
    headers = {**api.headers, "Idempotency-Key": uuid.uuid4().hex}
    route = api.space_path("/v1/claims")
    status, first = call(api.base_url, "POST", route, body(run_id, key="k"), headers=headers)
    assert status == 200
    assert call(api.base_url, "POST", route, body(run_id, key="k"), headers=headers) == (200, first)
    assert api.error("POST", "/v1/claims", body(run_id, key="k")) == (409, "CLAIM_HELD")
    assert api.ok("GET", path("k") + f"?scopeId={run_id}")["generation"] == 1


def test_a_key_with_a_newline_reaches_its_routes(api: Api) -> None:
    run_id = new_run(api)
    key = "line one\nline two"
    token = api.ok("POST", "/v1/claims", body(run_id, key=key))["token"]
    assert api.ok("POST", path(key, "renew"), {"token": token})["key"] == key
    assert api.ok("GET", path(key) + f"?scopeId={run_id}")["held"] is True
    assert api.ok("POST", path(key, "release"), {"token": token})["released"] is True
