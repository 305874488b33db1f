"""Once and the default run over HTTP, against a real dev node."""

from __future__ import annotations

import threading
import uuid
from typing import Any
from urllib.parse import urlencode

import pytest

from tests._http import Api, call, new_space
from tests._nodes import DevNode

KEY = "research:0123456789abcdef0123456789abcdef/with slash & more"
JOIN_TIMEOUT_S = 20.0
LEASE_S = 30


@pytest.fixture
def api(dev_node: DevNode) -> Api:
    return Api(dev_node.url, space=new_space(dev_node.url, "once"))


def new_run(api: Api) -> str:
    return str(api.ok("POST", "/v1/scopes", {})["id"])


def acquire(api: Api, run_id: str, key: str = KEY, holder: str = "w1", **fields: Any) -> Any:
    body = {"scopeId": run_id, "key": key, "holder": holder, "holderSession": f"{holder}-s",
            "leaseSeconds": LEASE_S, **fields}
    return api.ok("POST", "/v1/once/acquire", body)


def view(api: Api, run_id: str, key: str = KEY, wait_ms: int = 0) -> Any:
    return api.ok("GET", "/v1/once?" + urlencode({"scopeId": run_id, "key": key, "waitMs": wait_ms}))


def lease(run_id: str, granted: dict[str, Any], key: str = KEY, **fields: Any) -> dict[str, Any]:
    return {"scopeId": run_id, "key": key, "token": granted["token"], **fields}


def test_one_holder_one_result_and_a_long_poll_wakes_on_complete(api: Api) -> None:
    run_id = new_run(api)
    granted = acquire(api, run_id, holder="runner")
    assert (granted["state"], granted["attempts"]) == ("GRANTED", 0)
    assert granted["token"] and granted["leaseExpiresAt"].endswith("Z")
    held = acquire(api, run_id, holder="waiter")
    assert held["state"] == "HELD" and "token" not in held
    still = view(api, run_id, wait_ms=100)
    assert (still["state"], still["holder"]) == ("HELD", "runner")

    woken: list[Any] = []
    waiter = threading.Thread(target=lambda: woken.append(view(api, run_id, wait_ms=25_000)))
    waiter.start()
    renewed = api.ok("POST", "/v1/once/renew", lease(run_id, granted, leaseSeconds=LEASE_S))
    assert renewed["state"] == "HELD"
    done = api.ok("POST", "/v1/once/complete", lease(run_id, granted, result={"report": "acme"}))
    assert (done["state"], done["result"]) == ("DONE", {"report": "acme"})
    waiter.join(JOIN_TIMEOUT_S)
    assert woken and (woken[0]["state"], woken[0]["result"], woken[0]["finishedBy"]) == (
        "DONE", {"report": "acme"}, "runner"
    )
    after = acquire(api, run_id, holder="late")
    assert (after["state"], after["result"]) == ("DONE", {"report": "acme"})
    # The same complete again gets the same answer; another result changes nothing.
    again = api.ok("POST", "/v1/once/complete", lease(run_id, granted, result={"report": "other"}))
    assert (again["state"], again["result"]) == ("DONE", {"report": "acme"})


def test_a_result_reads_back_as_the_value_recorded(api: Api) -> None:
    """GET /once answers the kept bytes of the result as they are: the same JSON value."""
    run_id = new_run(api)
    result = {"zeta": [1, 2.5, -0.0, None, True], "text": "caf\u00e9 \u2603 \"quoted\" \\ \n", "alpha": {"b": {}, "a": []}}
    granted = acquire(api, run_id)
    assert api.ok("POST", "/v1/once/complete", lease(run_id, granted, result=result))["result"] == result
    shown = view(api, run_id)
    assert (shown["state"], shown["result"], shown["finishedBy"], shown["scopeEffective"]) == (
        "DONE", result, "w1", "ACTIVE"
    )
    for scalar in ("plain", 0, None, [1]):
        other = acquire(api, run_id, key=f"scalar-{scalar!r}")
        api.ok("POST", "/v1/once/complete", lease(run_id, other, key=f"scalar-{scalar!r}", result=scalar))
        assert view(api, run_id, key=f"scalar-{scalar!r}")["result"] == scalar


def test_the_attempt_limit_is_decided_at_fail_time(api: Api) -> None:
    run_id = new_run(api)
    first = acquire(api, run_id, key="k")
    # Two failures under a limit of 3: the entry opens again, attempts counting.
    answer = api.ok("POST", "/v1/once/fail", lease(run_id, first, key="k", error="boom 1", maxAttempts=3))
    assert (answer["state"], answer["attempts"], answer["lastError"]) == ("OPEN", 1, "boom 1")
    second = acquire(api, run_id, key="k")
    assert (second["state"], second["attempts"]) == ("GRANTED", 1)
    # The next failure names a limit of 2: it is used up now.
    answer = api.ok("POST", "/v1/once/fail", lease(run_id, second, key="k", error="boom 2", maxAttempts=2))
    assert (answer["state"], answer["attempts"], answer["lastError"]) == ("FAILED", 2, "boom 2")
    failed = acquire(api, run_id, key="k", holder="w2")
    assert (failed["state"], failed["lastError"], failed["attempts"]) == ("FAILED", "boom 2", 2)
    assert (view(api, run_id, "k")["state"], view(api, run_id, "k")["attempts"]) == ("FAILED", 2)


def test_a_stale_token_is_refused_and_changes_nothing(api: Api) -> None:
    run_id = new_run(api)
    old = acquire(api, run_id, key="k")
    api.ok("POST", "/v1/once/release", lease(run_id, old, key="k"))
    current = acquire(api, run_id, key="k", holder="w2")
    assert current["token"] != old["token"] and current["attempts"] == 0  # a release counts no attempt
    before = view(api, run_id, "k")
    for path, extra in (
        ("renew", {"leaseSeconds": LEASE_S}), ("complete", {"result": "late"}), ("fail", {"error": "late"}),
        ("release", {}),
    ):
        assert api.error("POST", f"/v1/once/{path}", lease(run_id, old, key="k", **extra)) == (409, "STALE_CLAIM")
        forged = {**lease(run_id, current, key="k", **extra), "token": current["token"] + "0"}
        assert api.error("POST", f"/v1/once/{path}", forged) == (409, "STALE_CLAIM")
    assert view(api, run_id, "k") == before
    # A token of another key is stale for this one.
    assert api.error("POST", "/v1/once/complete", lease(run_id, current, key="other", result=1)) == (409, "STALE_CLAIM")


def test_a_lapsed_lease_opens_the_entry_and_counts_an_attempt(api: Api) -> None:
    run_id = new_run(api)
    old = acquire(api, run_id, key="k", leaseSeconds=1)
    woken = view(api, run_id, "k", wait_ms=25_000)  # the lapse wakes the long poll
    assert (woken["state"], woken["attempts"]) == ("OPEN", 1)
    assert woken["lastError"].startswith("lease expired")
    taken = acquire(api, run_id, key="k", holder="w2")
    assert (taken["state"], taken["attempts"]) == ("GRANTED", 1)
    assert api.error("POST", "/v1/once/complete", lease(run_id, old, key="k", result=1)) == (409, "STALE_CLAIM")


def test_bad_input(api: Api) -> None:
    run_id = new_run(api)
    granted = acquire(api, run_id, key="k")
    assert api.error("POST", "/v1/once/acquire", {}) == (400, "VALIDATION_FAILED")
    assert api.error("POST", "/v1/once/acquire", {"scopeId": run_id, "key": "k", "leaseMs": 10}) == (
        400, "VALIDATION_FAILED"
    )  # an unknown field
    assert api.error("POST", "/v1/once/acquire", {"scopeId": run_id, "key": "k", "leaseSeconds": 0}) == (
        400, "VALIDATION_FAILED"
    )
    assert api.error("POST", "/v1/once/acquire", {"scopeId": "run_nope", "key": "k"}) == (404, "NOT_FOUND")
    assert api.error("GET", "/v1/once?scopeId=run_nope&key=k") == (404, "NOT_FOUND")
    assert api.error("GET", f"/v1/once?scopeId={run_id}") == (400, "VALIDATION_FAILED")
    assert api.error("POST", "/v1/once/fail", lease(run_id, granted, key="k", maxAttempts=0)) == (
        400, "VALIDATION_FAILED"
    )
    too_big = lease(run_id, granted, key="k", result="x" * (64 * 1024 + 1))
    status, answer = api("POST", "/v1/once/complete", too_big)
    assert (status, answer["error"]["code"]) == (400, "VALIDATION_FAILED")
    assert "exceeds 65536 bytes" in answer["error"]["message"]
    unknown = view(api, run_id, "never-acquired")
    assert (unknown["state"], unknown["attempts"]) == ("OPEN", 0)


def test_a_cancelled_run_refuses_new_work_and_keeps_results(api: Api) -> None:
    run_id = new_run(api)
    api.ok("POST", "/v1/once/complete", lease(run_id, acquire(api, run_id, key="done"), key="done", result=42))
    held = acquire(api, run_id, key="held")
    api.ok("POST", f"/v1/scopes/{run_id}/cancel")
    after = acquire(api, run_id, key="done")
    assert (after["result"], after["scopeEffective"]) == (42, "INACTIVE")
    assert api.error("POST", "/v1/once/acquire", {"scopeId": run_id, "key": "new"}) == (409, "SCOPE_CANCELLED")
    assert api.error("POST", "/v1/once/renew", lease(run_id, held, key="held", leaseSeconds=LEASE_S)) == (
        409, "SCOPE_CANCELLED"
    )
    assert api.error("POST", "/v1/once/complete", lease(run_id, held, key="held", result=1)) == (
        409, "SCOPE_CANCELLED"
    )
    assert api.ok("POST", "/v1/once/release", lease(run_id, held, key="held"))["state"] == "OPEN"


def test_a_retried_acquire_that_found_it_held_looks_again(api: Api) -> None:
    """An acquire answered HELD changed nothing: its retry (same Idempotency-Key) is not answered
    from a record but looks again, and finds the result recorded meanwhile."""
    run_id = new_run(api)
    granted = acquire(api, run_id, key="k")
    headers = {**api.headers, "Idempotency-Key": uuid.uuid4().hex}
    request = {"scopeId": run_id, "key": "k", "holder": "w2", "leaseSeconds": LEASE_S}
    route = api.space_path("/v1/once/acquire")
    status, held = call(api.base_url, "POST", route, request, headers=headers)
    assert (status, held["state"]) == (200, "HELD")
    api.ok("POST", "/v1/once/complete", lease(run_id, granted, key="k", result=7))
    status, again = call(api.base_url, "POST", route, request, headers=headers)
    assert (status, again["state"], again["result"]) == (200, "DONE", 7)
