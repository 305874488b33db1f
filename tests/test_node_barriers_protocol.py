"""Barriers over HTTP on the published protocol's routes (PROTOCOL.md §5.11), against a real dev
node: create in a run, join or create by name, read, arrive with arrivalKey, release, latecomers,
cancellation with the run, and bad input."""

from __future__ import annotations

import pytest

from tests._auth_world import forbidden, keyed
from tests._http import Api, new_space
from tests._nodes import DevNode


@pytest.fixture
def api(dev_node: DevNode) -> Api:
    return Api(dev_node.url, space=new_space(dev_node.url, "barriers"))


def new_run(api: Api) -> str:
    return str(api.ok("POST", "/v1/scopes", {})["id"])


def test_create_arrive_release_and_a_latecomer(api: Api) -> None:
    run_id = new_run(api)
    made = api.ok("POST", "/v1/barriers", {"scopeId": run_id, "target": 2})
    assert (made["state"], made["epoch"], made["arrivals"], made["scopeId"], made["name"]) == ("WAITING", 1, 0, run_id, None)
    path = f"/v1/barriers/{made['id']}"
    first = api.ok("POST", f"{path}/arrive", {"arrivalKey": "p1"})
    assert (first["state"], first["arrivals"], first["arrived"]) == ("WAITING", 1, True)
    assert api.ok("POST", f"{path}/arrive", {"arrivalKey": "p1"})["arrived"] is False  # idempotent per key
    released = api.ok("POST", f"{path}/arrive", {"key": "p2"})  # the older name of arrivalKey
    assert (released["state"], released["arrivals"]) == ("RELEASED", 2)
    assert api.ok("GET", path)["state"] == "RELEASED"
    assert api.ok("POST", f"{path}/arrive", {"arrivalKey": "p2"})["state"] == "RELEASED"
    assert api.error("POST", f"{path}/arrive", {"arrivalKey": "p3"}) == (409, "BARRIER_RELEASED")


def test_by_name_is_one_barrier_per_run_and_name(api: Api) -> None:
    run_id, other_run = new_run(api), new_run(api)
    body = {"scopeId": run_id, "target": 3}
    made = api.ok("PUT", "/v1/barriers/by-name/stage%202", body)
    assert (made["name"], made["target"], made["epoch"], made["created"]) == ("stage 2", 3, 1, True)
    again = api.ok("PUT", "/v1/barriers/by-name/stage%202", body)
    assert (again["id"], again["created"]) == (made["id"], False)
    assert api.error("PUT", "/v1/barriers/by-name/stage%202", {**body, "target": 2}) == (409, "CONFLICT")
    assert api.ok("PUT", "/v1/barriers/by-name/stage%202", {"scopeId": other_run, "target": 2})["id"] != made["id"]
    for key in ("w1", "w2", "w3"):
        api.ok("POST", f"/v1/barriers/{made['id']}/arrive", {"arrivalKey": key})
    after = api.ok("PUT", "/v1/barriers/by-name/stage%202", body)  # a latecomer joins the released barrier
    assert (after["id"], after["state"], after["epoch"]) == (made["id"], "RELEASED", 1)
    assert api.error("POST", f"/v1/barriers/{made['id']}/arrive", {"arrivalKey": "w4"}) == (409, "BARRIER_RELEASED")


def test_a_stopped_run_cancels_its_open_barriers(api: Api) -> None:
    run_id = new_run(api)
    open_one = api.ok("PUT", "/v1/barriers/by-name/go", {"scopeId": run_id, "target": 2})
    api.ok("POST", f"/v1/scopes/{run_id}/cancel", {})
    assert api.ok("GET", f"/v1/barriers/{open_one['id']}")["state"] == "CANCELLED"
    assert api.ok("PUT", "/v1/barriers/by-name/go", {"scopeId": run_id, "target": 2})["state"] == "CANCELLED"
    assert api.error("POST", f"/v1/barriers/{open_one['id']}/arrive", {"arrivalKey": "w"}) == (409, "BARRIER_CANCELLED")
    assert api.error("PUT", "/v1/barriers/by-name/new", {"scopeId": run_id, "target": 2}) == (409, "SCOPE_CANCELLED")
    assert api.error("POST", "/v1/barriers", {"scopeId": run_id, "target": 2}) == (409, "SCOPE_CANCELLED")


def test_bad_input_is_a_clear_4xx(api: Api) -> None:
    run_id = new_run(api)
    bad_bodies = [{}, {"scopeId": run_id}, {"scopeId": run_id, "target": 0}, {"scopeId": run_id, "target": "2"},
                  {"scopeId": 5, "target": 2}, {"target": 2}]
    for body in bad_bodies:
        assert api.error("POST", "/v1/barriers", body) == (400, "VALIDATION_FAILED"), body
        assert api.error("PUT", "/v1/barriers/by-name/x", body) == (400, "VALIDATION_FAILED"), body
    assert api.error("PUT", "/v1/barriers/by-name/" + "x" * 257, {"scopeId": run_id, "target": 1}) == (400, "VALIDATION_FAILED")
    assert api.error("POST", "/v1/barriers", {"scopeId": "run_nope", "target": 2}) == (404, "NOT_FOUND")
    assert api.error("GET", "/v1/barriers/bar_nope") == (404, "NOT_FOUND")
    made = api.ok("POST", "/v1/barriers", {"scopeId": run_id, "target": 2})
    path = f"/v1/barriers/{made['id']}/arrive"
    assert api.error("POST", path, {}) == (400, "VALIDATION_FAILED")
    assert api.error("POST", path, {"arrivalKey": "a", "key": "b"}) == (400, "VALIDATION_FAILED")
    assert api.ok("GET", f"/v1/barriers/{made['id']}")["arrivals"] == 0


def test_creating_a_barrier_is_configuration_and_arriving_a_workers_call(auth_node: tuple[DevNode, str]) -> None:
    """The docs: creating a barrier needs resource_config; arriving and waiting need
    coordination_write and coordination_read. The by-name declaration (the published 0.3.0
    client's together()) stays a worker's call."""
    node, secret = auth_node
    admin = Api(node.url, key=secret)
    worker = keyed(admin, "coordination_write", "coordination_read")
    coordinator = keyed(admin, "resource_config", "coordination_read")
    reader = keyed(admin, "coordination_read")
    run_id = new_run(admin)
    body = {"scopeId": run_id, "target": 2}

    forbidden(worker, "POST", "/v1/barriers", body, "resource_config")
    forbidden(reader, "POST", "/v1/barriers", body, "resource_config")
    assert admin.ok("GET", f"/v1/barriers?scopeId={run_id}")["barriers"] == []  # nothing was made
    made = coordinator("POST", "/v1/barriers", body)
    assert made[0] == 201, made
    barrier = made[1]["id"]

    forbidden(coordinator, "POST", f"/v1/barriers/{barrier}/arrive", {"arrivalKey": "c"}, "coordination_write")
    forbidden(reader, "POST", f"/v1/barriers/{barrier}/arrive", {"arrivalKey": "r"}, "coordination_write")
    assert worker.ok("POST", f"/v1/barriers/{barrier}/arrive", {"arrivalKey": "w1"})["arrivals"] == 1
    declared = worker.ok("PUT", "/v1/barriers/by-name/together", body)
    assert declared["created"] is True
    forbidden(reader, "PUT", "/v1/barriers/by-name/together", body, "coordination_write")
    worker.ok("POST", f"/v1/barriers/{barrier}/arrive", {"arrivalKey": "w2"})
    assert reader.ok("GET", f"/v1/barriers/{barrier}")["state"] == "RELEASED"
    assert reader.ok("GET", f"/v1/barriers/{barrier}/wait?waitMs=0")["state"] == "RELEASED"
    forbidden(worker, "POST", f"/v1/barriers/{barrier}/nextEpoch", {}, "resource_config")
    assert coordinator.ok("POST", f"/v1/barriers/{barrier}/nextEpoch", {})["epoch"] == 2
