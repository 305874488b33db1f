"""Work limits over HTTP (the published protocol's §5.8), against a real dev node: create and list
them, and tasks that name one with workLimit refused past maxOutstanding with 429
CONCURRENCY_LIMITED and Retry-After, until one of them ends."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from tests._http import Api, mailbox_id, new_space, recv, settle_ok, submit_task, task_body
from tests._nodes import DevNode


@pytest.fixture
def api(dev_node: DevNode) -> Api:
    return Api(dev_node.url, space=new_space(dev_node.url, "wlim"))


def new_run(api: Api) -> str:
    return str(api.ok("POST", "/v1/scopes", {})["id"])


def test_create_and_list(api: Api) -> None:
    run_id = new_run(api)
    status, created = api("POST", "/v1/work-limits", {"name": "bound", "scopeId": run_id, "maxOutstanding": 2})
    assert status == 201
    assert created == {"id": created["id"], "name": "bound", "scopeId": run_id, "maxOutstanding": 2, "outstanding": 0}
    assert created["id"].startswith("wlm_")
    # The same again answers the row (from any run of the space); another size is CONFLICT.
    assert api("POST", "/v1/work-limits", {"name": "bound", "scopeId": new_run(api), "maxOutstanding": 2}) == (
        200, created,
    )
    assert api.error("POST", "/v1/work-limits", {"name": "bound", "scopeId": run_id, "maxOutstanding": 3}) == (
        409, "CONFLICT",
    )
    assert api.ok("GET", "/v1/work-limits") == {"workLimits": [created]}
    for bad in ({"name": "x", "scopeId": run_id}, {"name": "x", "scopeId": run_id, "maxOutstanding": 0},
                {"name": "", "scopeId": run_id, "maxOutstanding": 1}, {"name": "x", "maxOutstanding": 1},
                {"name": "x", "scopeId": run_id, "maxOutstanding": "2"}):
        assert api.error("POST", "/v1/work-limits", bad) == (400, "VALIDATION_FAILED"), bad
    assert api.error("POST", "/v1/work-limits", {"name": "x", "scopeId": "run_none", "maxOutstanding": 1}) == (
        404, "NOT_FOUND",
    )
    assert Api(api.base_url, space=new_space(api.base_url, "other")).ok("GET", "/v1/work-limits") == {"workLimits": []}


def test_tasks_past_max_outstanding_are_concurrency_limited(api: Api, dev_node: DevNode) -> None:
    run_id = new_run(api)
    api.ok("POST", "/v1/work-limits", {"name": "bound", "scopeId": run_id, "maxOutstanding": 1})
    first = submit_task(api, run_id, {"n": 1}, "a", workLimit="bound")
    # A replay of the same key is answered; a new task is refused, with Retry-After.
    assert submit_task(api, run_id, {"n": 1}, "a", workLimit="bound")["taskId"] == first["taskId"]
    body = task_body(run_id, mailbox_id(api), {"n": 2}, "b", workLimit="bound")
    request = urllib.request.Request(
        dev_node.url + api.space_path("/v1/tasks"), method="POST", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(request, timeout=10)
    assert raised.value.code == 429 and raised.value.headers["Retry-After"] == "1"
    assert json.loads(raised.value.read())["error"]["code"] == "CONCURRENCY_LIMITED"
    raised.value.close()
    assert api.error("POST", "/v1/tasks", {**body, "workLimit": "nothing"}) == (404, "NOT_FOUND")
    assert api.ok("GET", "/v1/work-limits")["workLimits"][0]["outstanding"] == 1
    (delivery,) = recv(api, run_id)
    settle_ok(api, delivery, "complete", {"result": {"payload": 1}})
    assert api.ok("GET", "/v1/work-limits")["workLimits"][0]["outstanding"] == 0
    submit_task(api, run_id, {"n": 2}, "b", workLimit="bound")
    api.ok("POST", f"/v1/scopes/{run_id}/cancel")
    assert api.ok("GET", "/v1/work-limits")["workLimits"][0]["outstanding"] == 0
