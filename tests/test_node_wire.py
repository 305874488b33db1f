"""The wire every route shares, against a real node: request ids, the error envelope, unknown
fields, and idempotency keys (a retried mutation is applied once and answered alike)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests._http import Api, new_space
from tests._nodes import DevNode


@pytest.fixture
def api(dev_node: DevNode) -> Api:
    return Api(dev_node.url, space=new_space(dev_node.url, "wire"))


def send(api: Api, method: str, path: str, body: Any = None, *, key: str | None = None,
         raw: bytes | None = None) -> tuple[int, dict[str, str], Any]:
    """(status, headers, JSON answer) of one request, with an idempotency key if given."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} if data is not None else {}
    if key is not None:
        headers["Idempotency-Key"] = key
    request = urllib.request.Request(api.base_url + api.space_path(path), data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, dict(answer.headers), json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as error:
        with error:
            return error.code, dict(error.headers), json.loads(error.read() or b"null")


def new_run(api: Api) -> str:
    return str(api.ok("POST", "/v1/scopes", {})["id"])


def test_every_answer_has_a_request_id(api: Api) -> None:
    status, headers, _ = send(api, "GET", "/v1/health")
    assert status == 200 and headers["X-Request-Id"].startswith("req_")
    status, headers, answer = send(api, "GET", "/v1/scopes/run_missing")
    assert status == 404
    assert answer["error"]["requestId"] == headers["X-Request-Id"]
    assert set(answer["error"]) == {"code", "message", "requestId"}
    # Each request gets its own.
    assert send(api, "GET", "/v1/scopes/run_missing")[2]["error"]["requestId"] != answer["error"]["requestId"]


def test_an_unknown_field_is_refused_and_changes_nothing(api: Api) -> None:
    run_id = new_run(api)
    status, _, answer = send(api, "POST", "/v1/barriers", {"scopeId": run_id, "target": 2, "targets": 3})
    assert (status, answer["error"]["code"]) == (400, "VALIDATION_FAILED")
    assert "targets" in answer["error"]["message"]
    status, _, answer = send(api, "POST", f"/v1/scopes/{run_id}/complete", {"why": "done"})
    assert (status, answer["error"]["code"]) == (400, "VALIDATION_FAILED")
    assert api.ok("GET", f"/v1/scopes/{run_id}")["storedState"] == "ACTIVE"


def test_a_retried_mutation_is_applied_once_and_answered_alike(api: Api) -> None:
    run_id = new_run(api)
    path, body = "/v1/barriers", {"scopeId": run_id, "target": 2}
    first = send(api, "POST", path, body, key="barrier-1")
    again = send(api, "POST", path, body, key="barrier-1")
    assert first[0] == again[0] == 201
    assert first[2] == again[2]
    assert first[1]["X-Request-Id"] != again[1]["X-Request-Id"]  # the answer is replayed, not the request id
    other = send(api, "POST", path, body, key="barrier-2")
    assert other[2]["id"] != first[2]["id"]  # another key is another barrier
    # A key is its space's: the same key elsewhere is unrelated.
    elsewhere = Api(api.base_url, space=new_space(api.base_url, "wire"))
    elsewhere_run = new_run(elsewhere)
    assert send(elsewhere, "POST", path, {**body, "scopeId": elsewhere_run}, key="barrier-1")[2]["id"] != first[2]["id"]


def test_a_key_reused_for_another_request_is_a_conflict(api: Api) -> None:
    run_id = new_run(api)
    path = "/v1/barriers"
    assert send(api, "POST", path, {"scopeId": run_id, "target": 2}, key="k")[0] == 201
    status, _, answer = send(api, "POST", path, {"scopeId": run_id, "target": 3}, key="k")
    assert (status, answer["error"]["code"]) == (409, "IDEMPOTENCY_CONFLICT")
    status, _, answer = send(api, "POST", "/v1/timers", {"scopeId": run_id, "afterSeconds": 60}, key="k")
    assert (status, answer["error"]["code"]) == (409, "IDEMPOTENCY_CONFLICT")


def test_no_body_and_an_empty_object_are_the_same_request(api: Api) -> None:
    run_id = new_run(api)
    timer_id = api.ok("POST", "/v1/timers", {"scopeId": run_id, "afterSeconds": 60})["id"]
    first = send(api, "POST", f"/v1/timers/{timer_id}/cancel", key="cancel-1")
    again = send(api, "POST", f"/v1/timers/{timer_id}/cancel", {}, key="cancel-1")
    assert first[0] == again[0] == 200 and first[2] == again[2]


def test_a_refused_request_is_not_remembered(api: Api) -> None:
    run_id = new_run(api)
    path = "/v1/barriers"
    assert send(api, "POST", path, {"scopeId": run_id, "target": 0}, key="k")[0] == 400
    assert send(api, "POST", path, {"scopeId": run_id, "target": 2}, key="k")[0] == 201  # the fixed request goes through


@pytest.mark.parametrize("key", ["", "x" * 256, "tab\there", "é"])
def test_a_malformed_key_is_refused(api: Api, key: str) -> None:
    run_id = new_run(api)
    headers = {"Idempotency-Key": key, "Content-Type": "application/json"}
    request = urllib.request.Request(
        api.base_url + api.space_path("/v1/barriers"), data=json.dumps({"scopeId": run_id, "target": 2}).encode(), method="POST",
        headers={name: value.encode().decode("latin-1") for name, value in headers.items()},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    with refused.value as error:
        assert (error.code, json.loads(error.read())["error"]["code"]) == (400, "VALIDATION_FAILED")


def test_every_route_declares_its_answer_and_its_errors_have_a_status() -> None:
    from runstate_server.node.api.app import ROUTES
    from runstate_server.node.errors import STATUS_BY_CODE

    assert [f"{route.method} {route.path}" for route in ROUTES if route.answer is None] == []
    assert [code for route in ROUTES for code in route.errors if code not in STATUS_BY_CODE] == []


@pytest.mark.parametrize(
    "body",
    [b'{"name": "\\ud800 a lone surrogate"}', b'{"name": "n", "deadline": null, "childLimit": 10}'.replace(b"10", b"1" * 30)],
)
def test_a_value_the_log_cannot_store_is_refused_not_a_server_error(api: Api, body: bytes) -> None:
    status, _, answer = send(api, "POST", "/v1/scopes", raw=body)
    assert (status, answer["error"]["code"]) == (400, "VALIDATION_FAILED")


def test_a_payload_is_kept_as_its_json_and_a_number_beyond_64_bits_where_it_is_not(api: Api) -> None:
    """A payload is stored as its JSON text, so any JSON number round-trips; a number the node
    itself must read (a pool's units) is refused past 64 bits."""
    run_id = new_run(api)
    mailbox = api.ok("PUT", "/v1/mailboxes/by-name/work", {})["id"]
    raw = b'{"scopeId": "%s", "mailboxId": "%s", "taskKey": "k", "input": 123456789012345678901234567890}' % (
        run_id.encode(), mailbox.encode()
    )
    status, _, answer = send(api, "POST", "/v1/tasks", raw=raw)
    assert status == 201, answer
    assert api.ok("GET", f"/v1/tasks/{answer['id']}")["input"] == 123456789012345678901234567890
    status, _, answer = send(api, "PUT", "/v1/mailboxes/by-name/other", {"requirements": {"pools": [{"name": "p", "units": 10**30}]}})
    assert (status, answer["error"]["code"]) == (400, "VALIDATION_FAILED")


def test_times_are_rfc3339_for_every_year() -> None:
    from runstate_server.node.api.views import iso

    assert iso(0) == "1970-01-01T00:00:00.000Z"
    assert iso(-1) == "1969-12-31T23:59:59.999Z"
    assert iso(-62135596800000) == "0001-01-01T00:00:00.000Z"  # a timer `at` the year 1 fires at once
    assert iso(-30610224000000) == "1000-01-01T00:00:00.000Z"


@settings(max_examples=2_000, deadline=None)
@given(st.integers(min_value=-62135596800000, max_value=253402300799999))
def test_iso_gives_what_datetime_gives_for_every_millisecond(ms: int) -> None:
    # iso() remembers the text of recent seconds; every millisecond still reads as datetime has it.
    from datetime import datetime, timezone

    from runstate_server.node.api.views import iso

    moment = datetime.fromtimestamp(ms // 1000, tz=timezone.utc)
    assert iso(ms) == f"{moment.year:04d}-{moment:%m-%dT%H:%M:%S}.{ms % 1000:03d}Z"
    assert iso(ms) == iso(ms)  # answered from the cache the second time
