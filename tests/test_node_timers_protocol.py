"""Timers over HTTP on the published protocol's routes (PROTOCOL.md §5.12), against a real dev
node: create in a run, the durable named sleep (by name, with the server's `now` and the token
once fired), poll, ack with the token, cancel, the run's stop, and bad input."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tests._auth_world import forbidden, keyed
from tests._http import Api, new_space
from tests._nodes import DevNode

FIRE_WAIT_S = 30.0  # for a due timer to be seen fired (a tick on a loaded machine)
TOMORROW = (datetime.now(timezone.utc) + timedelta(days=1)).isoformat()


@pytest.fixture
def api(dev_node: DevNode) -> Api:
    return Api(dev_node.url, space=new_space(dev_node.url, "timers"))


def new_run(api: Api) -> str:
    return str(api.ok("POST", "/v1/scopes", {})["id"])


def when(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def fired_of(api: Api, run_id: str, timer_id: str, timeout_s: float = 5.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for row in api.ok("POST", "/v1/timers/poll", {"scopeId": run_id})["timers"]:
            if row["id"] == timer_id:
                return dict(row)
        time.sleep(0.05)
    raise AssertionError(f"timer {timer_id} did not fire")


def test_create_poll_and_ack_with_the_token(api: Api) -> None:
    run_id = new_run(api)
    made = api.ok("POST", "/v1/timers", {"scopeId": run_id, "afterSeconds": 0.2})
    assert (made["state"], made["scopeId"]) == ("ARMED", run_id) and "token" not in made
    assert api.ok("POST", "/v1/timers/poll", {"scopeId": run_id}) == {"timers": []}
    fired = fired_of(api, run_id, made["id"])
    assert when(fired["firedAt"]) >= when(made["fireAt"]) and fired["token"]
    path = f"/v1/timers/{made['id']}/ack"
    assert api.error("POST", path, {"token": fired["token"] + "x"}) == (409, "STALE_CLAIM")
    assert api.ok("POST", path, {"token": fired["token"]})["state"] == "ACKED"
    assert api.error("POST", path, {"token": fired["token"]}) == (409, "CONFLICT")  # acked already
    assert api.ok("POST", "/v1/timers/poll", {"scopeId": run_id}) == {"timers": []}
    assert api.ok("GET", f"/v1/timers/{made['id']}")["state"] == "ACKED"


def test_a_named_timer_is_a_durable_sleep(api: Api) -> None:
    run_id = new_run(api)
    body = {"scopeId": run_id, "afterSeconds": 1}
    sent_at = datetime.now(timezone.utc)
    first = api.ok("PUT", "/v1/timers/by-name/cooldown", body)
    answered_at = datetime.now(timezone.utc)
    assert (first["state"], first["name"], first["created"]) == ("ARMED", "cooldown", True) and "token" not in first
    # A second from when the node took the request (between its sending and its answer: server
    # times are whole ms), and no more than a second from the answer's own `now`.
    fire_at = when(first["fireAt"])
    assert sent_at + timedelta(seconds=1, milliseconds=-1) <= fire_at <= answered_at + timedelta(seconds=1)
    assert (fire_at - when(first["now"])).total_seconds() <= 1.0
    again = api.ok("PUT", "/v1/timers/by-name/cooldown", {"scopeId": run_id, "afterSeconds": 3600})
    assert (again["id"], again["fireAt"], again["created"]) == (first["id"], first["fireAt"], False)  # whatever its body
    time.sleep(max(0.0, (when(first["fireAt"]) - when(first["now"])).total_seconds()))
    deadline = time.monotonic() + FIRE_WAIT_S
    while (view := api.ok("PUT", "/v1/timers/by-name/cooldown", body))["state"] == "ARMED":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert view["state"] == "FIRED" and view["token"]
    api.ok("POST", f"/v1/timers/{view['id']}/ack", {"token": view["token"]})
    done = api.ok("PUT", "/v1/timers/by-name/cooldown", {"scopeId": run_id, "at": TOMORROW})
    assert (done["id"], done["state"]) == (first["id"], "ACKED")
    assert api.ok("PUT", "/v1/timers/by-name/cooldown", {"scopeId": new_run(api), "afterSeconds": 1})["id"] != first["id"]


def test_cancel_and_the_runs_stop(api: Api) -> None:
    run_id = new_run(api)
    cancelled = api.ok("POST", "/v1/timers", {"scopeId": run_id, "at": TOMORROW})
    assert api.ok("POST", f"/v1/timers/{cancelled['id']}/cancel")["state"] == "CANCELLED"  # no body, as [0.2] sends
    assert api.error("POST", f"/v1/timers/{cancelled['id']}/ack", {"token": "x"}) == (409, "CONFLICT")
    armed = api.ok("PUT", "/v1/timers/by-name/later", {"scopeId": run_id, "afterSeconds": 600})
    api.ok("POST", f"/v1/scopes/{run_id}/cancel", {})
    assert api.ok("PUT", "/v1/timers/by-name/later", {"scopeId": run_id, "afterSeconds": 600})["state"] == "CANCELLED"
    assert api.ok("GET", f"/v1/timers/{armed['id']}")["state"] == "CANCELLED"
    assert api.error("PUT", "/v1/timers/by-name/new", {"scopeId": run_id, "afterSeconds": 1}) == (409, "SCOPE_CANCELLED")
    assert api.error("POST", "/v1/timers", {"scopeId": run_id, "afterSeconds": 1}) == (409, "SCOPE_CANCELLED")


def test_bad_input_is_a_clear_4xx(api: Api) -> None:
    run_id = new_run(api)
    bad_bodies = [{}, {"scopeId": run_id}, {"scopeId": run_id, "afterSeconds": -1},
                  {"scopeId": run_id, "afterSeconds": 1, "at": "2099-01-01T00:00:00Z"}, {"scopeId": run_id, "at": "soon"},
                  {"scopeId": run_id, "afterSeconds": True}, {"afterSeconds": 1}]
    for body in bad_bodies:
        assert api.error("POST", "/v1/timers", body) == (400, "VALIDATION_FAILED"), body
        assert api.error("PUT", "/v1/timers/by-name/x", body) == (400, "VALIDATION_FAILED"), body
    assert api.error("POST", "/v1/timers", {"scopeId": "run_nope", "afterSeconds": 1}) == (404, "NOT_FOUND")
    assert api.error("POST", "/v1/timers/poll", {"scopeId": "run_nope"}) == (404, "NOT_FOUND")
    assert api.error("POST", "/v1/timers/poll", {}) == (400, "VALIDATION_FAILED")
    made = api.ok("POST", "/v1/timers", {"scopeId": run_id, "afterSeconds": 600})
    assert api.error("POST", f"/v1/timers/{made['id']}/ack", {}) == (400, "VALIDATION_FAILED")
    assert api.error("POST", f"/v1/timers/{made['id']}/ack", {"token": "x"}) == (409, "CONFLICT")  # not fired yet
    assert api.error("POST", "/v1/timers/tmr_nope/ack", {"token": "x"}) == (404, "NOT_FOUND")


def test_a_wait_acknowledges_so_it_needs_write_and_a_read_only_key_changes_nothing(auth_node: tuple[DevNode, str]) -> None:
    """The wait route acknowledges the firing (FIRED -> ACKED), so it is a write: a read-only key
    is refused (403, as its direct ack is) and the firing stays listed for the worker that acks it."""
    node, secret = auth_node
    admin = Api(node.url, key=secret)
    reader = keyed(admin, "coordination_read")
    worker = keyed(admin, "coordination_write", "coordination_read")
    run_id = new_run(admin)
    timer_id = admin.ok("POST", "/v1/timers", {"scopeId": run_id, "afterSeconds": 0})["id"]
    token = fired_of(reader, run_id, timer_id, timeout_s=FIRE_WAIT_S)["token"]

    forbidden(reader, "POST", f"/v1/timers/{timer_id}/wait?waitMs=1000", None, "coordination_write")
    forbidden(reader, "POST", f"/v1/timers/{timer_id}/ack", {"token": token}, "coordination_write")
    assert reader.ok("GET", f"/v1/timers/{timer_id}")["state"] == "FIRED"
    assert [row["id"] for row in reader.ok("POST", "/v1/timers/poll", {"scopeId": run_id})["timers"]] == [timer_id]

    waited = worker.ok("POST", f"/v1/timers/{timer_id}/wait?waitMs=1000")
    assert (waited["done"], waited["state"]) == (True, "ACKED")
    assert reader.ok("POST", "/v1/timers/poll", {"scopeId": run_id}) == {"timers": []}
