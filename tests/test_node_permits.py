"""Permits over HTTP (the published protocol's §5.6), against a real dev node: create, declare,
list and read them; grants of units under a lease, renewed and released with their token; and
the pool routes and jobs' slots sharing one pool with them."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

import pytest

from tests._http import Api, new_space, recv, task_ok
from tests._nodes import DevNode


@pytest.fixture
def api(dev_node: DevNode) -> Api:
    api = Api(dev_node.url, space=new_space(dev_node.url, "permits"))
    api.ok("POST", "/v1/mailboxes", {"name": "work"})
    return api


def new_run(api: Api) -> str:
    return str(api.ok("POST", "/v1/scopes", {})["id"])


def acquire(api: Api, permit_id: str, run_id: str, units: int = 1) -> tuple[int, Any]:
    body = {"scopeId": run_id, "units": units, "holder": "w", "holderSession": "s1", "leaseSeconds": 30}
    return api("POST", f"/v1/permits/{permit_id}/acquire", body)


def test_create_list_read_and_declare(api: Api) -> None:
    created = api.ok("POST", "/v1/permits", {"name": "gpu", "units": 2})
    permit_id = created["id"]
    assert created == {"id": permit_id, "name": "gpu", "unitsTotal": 2, "unitsInUse": 0, "waiting": 0}
    assert permit_id.startswith("prm_")
    assert api.error("POST", "/v1/permits", {"name": "gpu", "units": 2}) == (409, "CONFLICT")
    for bad in ({}, {"name": "x"}, {"name": "x", "units": 0}, {"name": "", "units": 1}, {"name": "x", "units": "1"}):
        assert api.error("POST", "/v1/permits", bad) == (400, "VALIDATION_FAILED"), bad
    assert api.ok("GET", "/v1/permits") == {"permits": [created]}
    assert api.ok("GET", f"/v1/permits/{permit_id}") == {**created, "grants": [], "waiters": []}
    assert api.error("GET", "/v1/permits/prm_nothing") == (404, "NOT_FOUND")
    assert api.ok("PUT", "/v1/permits/by-name/gpu", {}) == {**created, "created": False}
    assert api.ok("PUT", "/v1/permits/by-name/gpu", {"units": 2}) == {**created, "created": False}
    assert api.error("PUT", "/v1/permits/by-name/gpu", {"units": 3}) == (409, "CONFLICT")
    assert api.error("PUT", "/v1/permits/by-name/cpu", {}) == (404, "NOT_FOUND")
    declared = api.ok("PUT", "/v1/permits/by-name/cpu", {"units": 4})
    assert (declared["name"], declared["unitsTotal"], declared["created"]) == ("cpu", 4, True)
    assert [row["name"] for row in api.ok("GET", "/v1/permits")["permits"]] == ["gpu", "cpu"]


def test_grants_count_units_renew_and_release_with_their_token(api: Api, dev_node: DevNode) -> None:
    permit_id = api.ok("POST", "/v1/permits", {"name": "gpu", "units": 3})["id"]
    run_id = new_run(api)
    status, grant = acquire(api, permit_id, run_id, units=2)
    assert status == 201 and set(grant) == {"grantId", "token", "units", "leaseExpiresAt"}
    assert acquire(api, permit_id, run_id, units=2)[1]["error"]["code"] == "CAPACITY_UNAVAILABLE"
    # A full permit is retryable: the answer says when to try again.
    request = urllib.request.Request(
        dev_node.url + api.space_path(f"/v1/permits/{permit_id}/acquire"), method="POST",
        data=b'{"scopeId": "%s", "units": 2}' % run_id.encode(), headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(request, timeout=10)
    assert raised.value.code == 409 and raised.value.headers["Retry-After"] == "1"
    raised.value.close()
    view = api.ok("GET", f"/v1/permits/{permit_id}")
    assert view["unitsInUse"] == 2
    assert [(g["grantId"], g["units"], g["holder"], g["scopeId"]) for g in view["grants"]] == [
        (grant["grantId"], 2, "w", run_id)
    ]
    renew_path, release_path = f"/v1/grants/{grant['grantId']}/renew", f"/v1/grants/{grant['grantId']}/release"
    assert api.error("POST", renew_path, {"token": grant["token"] + "0"}) == (409, "STALE_CLAIM")
    assert "leaseExpiresAt" in api.ok("POST", renew_path, {"token": grant["token"], "leaseSeconds": 60})
    assert api.ok("POST", release_path, {"token": grant["token"], "observation": {"ok": 1}}) == {"released": True}
    assert api.error("POST", release_path, {"token": grant["token"]}) == (409, "STALE_CLAIM")
    assert api.error("POST", renew_path, {"token": grant["token"]}) == (409, "STALE_CLAIM")
    assert api.ok("GET", f"/v1/permits/{permit_id}")["unitsInUse"] == 0


def test_a_stopped_run_refuses_acquire_and_its_grants_end(api: Api) -> None:
    permit_id = api.ok("POST", "/v1/permits", {"name": "gpu", "units": 1})["id"]
    run_id = new_run(api)
    status, grant = acquire(api, permit_id, run_id)
    assert status == 201
    api.ok("POST", f"/v1/scopes/{run_id}/cancel", {})
    assert api.ok("GET", f"/v1/permits/{permit_id}")["unitsInUse"] == 0
    assert acquire(api, permit_id, run_id)[1]["error"]["code"] == "SCOPE_CANCELLED"
    # A renewal is how running work learns of the stop; a release after it is a lost lease.
    assert api.error("POST", f"/v1/grants/{grant['grantId']}/renew", {"token": grant["token"]}) == (409, "SCOPE_CANCELLED")
    assert api.error("POST", f"/v1/grants/{grant['grantId']}/release", {"token": grant["token"]}) == (409, "STALE_CLAIM")


def test_a_jobs_slot_and_a_grant_share_the_pool(api: Api) -> None:
    permit_id = api.ok("PUT", "/v1/permits/by-name/browser", {"units": 2})["id"]
    run_id = new_run(api)
    assert acquire(api, permit_id, run_id)[0] == 201
    task_ok(api, run_id, {"input": 1, "key": "a", "requirements": {"pools": [{"name": "browser", "units": 1}]}})
    (delivery,) = recv(api, run_id, max=10, leaseMs=60_000)
    view = api.ok("GET", f"/v1/permits/{permit_id}")
    assert view["unitsInUse"] == 2 and [g["taskId"] is not None for g in view["grants"]] == [False, True]
    assert acquire(api, permit_id, run_id)[1]["error"]["code"] == "CAPACITY_UNAVAILABLE"
    assert delivery


def test_waiters_over_http(api: Api) -> None:
    permit_id = api.ok("POST", "/v1/permits", {"name": "gpu", "units": 1})["id"]
    run_id = new_run(api)
    status, grant = acquire(api, permit_id, run_id)
    assert status == 201
    joined = api.ok("POST", f"/v1/permits/{permit_id}/wait", {"scopeId": run_id, "units": 1, "holder": "w"})
    assert joined["state"] == "WAITING" and joined["waiterId"].startswith("pwt_")
    waiter_path = f"/v1/permit-waiters/{joined['waiterId']}"
    view = api.ok("GET", waiter_path)
    assert (view["state"], view["permitId"], view["position"], view["units"]) == ("WAITING", permit_id, 0, 1)
    assert api.ok("GET", f"/v1/permits/{permit_id}")["waiters"] == [
        {"waiterId": joined["waiterId"], "units": 1, "holder": "w", "scopeId": run_id, "state": "WAITING"}
    ]
    assert acquire(api, permit_id, run_id)[1]["error"]["code"] == "CAPACITY_UNAVAILABLE"
    api.ok("POST", f"/v1/grants/{grant['grantId']}/release", {"token": grant["token"]})
    assert api.ok("GET", waiter_path)["state"] == "SIGNALED"
    assert acquire(api, permit_id, run_id)[1]["error"]["code"] == "CAPACITY_UNAVAILABLE"  # set aside for it
    body = {"scopeId": run_id, "units": 1, "leaseSeconds": 30, "waiterId": joined["waiterId"]}
    status, taken = api("POST", f"/v1/permits/{permit_id}/acquire", body)
    assert status == 201 and taken["units"] == 1
    assert api.ok("GET", waiter_path)["state"] == "GRANTED"
    again = api.ok("POST", f"/v1/permits/{permit_id}/wait", {"scopeId": run_id, "ttlSeconds": 5})
    assert api.ok("POST", f"/v1/permit-waiters/{again['waiterId']}/cancel", {}) == {
        "waiterId": again["waiterId"], "state": "CANCELLED"
    }
    assert api.error("GET", "/v1/permit-waiters/pwt_nothing") == (404, "NOT_FOUND")
    assert api.error("POST", f"/v1/permits/{permit_id}/wait", {"scopeId": run_id, "ttlSeconds": 0}) == (
        400, "VALIDATION_FAILED"
    )
    last = api.ok("POST", f"/v1/permits/{permit_id}/wait", {"scopeId": run_id})
    api.ok("POST", f"/v1/scopes/{run_id}/cancel", {})
    assert api.ok("GET", f"/v1/permit-waiters/{last['waiterId']}")["state"] == "CANCELLED"


@pytest.mark.parametrize(
    ("family", "sizes", "read"),
    [
        ("permits", {"units": 2}, "unitsTotal"),
        ("allowances", {"unitsLimit": 5, "windowSeconds": 60}, "unitsLimit"),
        ("budgets", {"limitMinor": "500"}, "limitMinor"),
    ],
)
def test_a_look_up_by_name_needs_read_and_a_declaration_resource_config(
    auth_node: tuple[DevNode, str], family: str, sizes: dict[str, Any], read: str
) -> None:
    """A producer-only key (read and write, no resource_config) looks a permit, an allowance or a
    budget up with {}, as a client without sizes does; declaring one (sizes given) needs
    resource_config."""
    node, secret = auth_node
    admin = Api(node.url, key=secret)
    declared = admin.ok("PUT", f"/v1/{family}/by-name/shared-{family}", sizes)
    permissions = ["coordination_read", "coordination_write"]
    producer = Api(node.url, key=admin.ok("POST", "/v1/keys", {"permissions": permissions})["key"])
    assert producer.ok("PUT", f"/v1/{family}/by-name/shared-{family}", {})[read] == declared[read]
    assert producer.error("PUT", f"/v1/{family}/by-name/shared-{family}", sizes) == (403, "FORBIDDEN")
    assert producer.error("PUT", f"/v1/{family}/by-name/new-{family}", sizes) == (403, "FORBIDDEN")
    assert admin.error("PUT", f"/v1/{family}/by-name/new-{family}", {}) == (404, "NOT_FOUND")  # nothing was made
