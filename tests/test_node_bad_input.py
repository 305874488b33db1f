"""Input a node cannot store or render (issue 13, finding 6), against a real `runstate dev --auth`
node: JSON nested too deeply, a lone surrogate in any text field, header bytes that are not UTF-8,
a time outside the years 1 to 9999. Each is a 4xx with its code (never 500 INTERNAL), changes
nothing (the node's data digest is the same before and after) and leaves no traceback in the log."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from runstate_server.node.api.app import ROUTES
from runstate_server.node.errors import STATUS_BY_CODE
from tests._http import Api, recv
from tests._nodes import DevNode
from tests._raw_http import Answer, json_headers, send

SPACE = "/v1/spaces/default"
SURROGATE = '"\\ud800"'  # a JSON string holding a lone surrogate, as a JSON text


@dataclass
class Target:
    node: DevNode
    key: str
    admin: Api
    run: str
    mailbox: str
    task: str
    token: str
    barrier: str

    def send(self, method: str, path: str, body: bytes | None = None, **headers: bytes | str) -> Answer:
        return send(self.node.url, method, path, body, json_headers(self.key, **headers))

    def digest(self) -> str:
        return str(self.admin.ok("GET", "/v1/cluster/digest")["dataDigest"])


def space_target(auth_node: tuple[DevNode, str]) -> Iterator[Target]:
    """A run, a mailbox, a task with its delivery and a barrier in the node's space (the fixture of
    this module and of test_node_protocol_details.py); the node's log has no traceback after."""
    node, key = auth_node
    admin = Api(node.url, key=key)
    run = admin.ok("POST", "/v1/scopes", {})["id"]
    mailbox = admin.ok("POST", "/v1/mailboxes", {"name": "work"})["id"]
    task = admin.ok("POST", "/v1/tasks", {"scopeId": run, "mailboxId": mailbox, "input": 1, "taskKey": "t1"})["id"]
    (delivery,) = recv(admin, run, leaseMs=600_000)
    barrier = admin.ok("POST", "/v1/barriers", {"scopeId": run, "target": 2})["id"]
    yield Target(node, key, admin, run, mailbox, task, delivery["token"], barrier)
    assert "Traceback" not in node.log_path.read_text(errors="replace")


@pytest.fixture(scope="module")
def target(auth_node: tuple[DevNode, str]) -> Iterator[Target]:
    yield from space_target(auth_node)


def refused(answer: Answer, status: int, code: str) -> None:
    assert (answer.status, answer.code) == (status, code), answer
    assert STATUS_BY_CODE[code] == status


def no_traceback(node: DevNode) -> None:
    log = node.log_path.read_text(errors="replace")
    assert "Traceback" not in log and "INTERNAL" not in log, log[-4000:]


def nested(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


def test_deeply_nested_json_is_refused_on_every_route(target: Target) -> None:
    before = target.digest()
    bodies = [
        ("[" * 100_000).encode(),  # the report's body: deeper than the parser goes
        ('{"name": ' + nested(980) + "}").encode(),  # parses, deeper than json_depth_max
    ]
    for route in ROUTES:
        path = route.path.replace("{spaceId}", "default").replace("{key:.+}", "c1")
        path = path.replace("{id}", "x").replace("{name}", "x").replace("{lease}", "x")
        for body in bodies:
            answer = target.send(route.method, path, body)
            if route.method == "GET":  # a GET reads no body
                assert answer.status < 400 or answer.code in STATUS_BY_CODE, (route.method, path, answer)
            else:
                assert 400 <= answer.status < 500 and answer.code in STATUS_BY_CODE, (route.method, path, answer)
    assert target.digest() == before
    # Where the body is read first, it is the body that is refused.
    for path, field in ((f"{SPACE}/scopes", "name"), (f"{SPACE}/tasks", "input"), ("/v1/keys", "name")):
        for body in (b"[" * 100_000, ('{"' + field + '": ' + nested(980) + "}").encode()):
            refused(target.send("POST", path, body), 400, "VALIDATION_FAILED")
    # What is nested less deeply than the limit goes through.
    created = target.send("POST", f"{SPACE}/tasks", json.dumps(
        {"scopeId": target.run, "mailboxId": target.mailbox, "input": json.loads(nested(60)), "taskKey": "deep"}
    ).encode())
    assert created.status == 201, created
    target.send("POST", f"{SPACE}/tasks/{created.json()['id']}/cancel", b"{}")
    before = target.digest()
    refused(target.send("POST", f"{SPACE}/tasks", json.dumps(
        {"scopeId": target.run, "mailboxId": target.mailbox, "input": json.loads(nested(80)), "taskKey": "deeper"}
    ).encode()), 400, "VALIDATION_FAILED")
    assert target.digest() == before
    no_traceback(target.node)


def test_a_lone_surrogate_in_any_text_field_is_refused(target: Target) -> None:
    run, mailbox = target.run, target.mailbox
    cases = [
        ("POST", f"{SPACE}/scopes", f'{{"name": {SURROGATE}}}'),  # a run's name
        ("POST", f"{SPACE}/scopes/{run}/cancel", f'{{"reason": {SURROGATE}}}'),
        ("POST", f"{SPACE}/tasks", f'{{"scopeId": "{run}", "mailboxId": "{mailbox}", "input": 1, "taskKey": {SURROGATE}}}'),
        ("POST", f"{SPACE}/tasks", f'{{"scopeId": "{run}", "mailboxId": "{mailbox}", "input": {SURROGATE}}}'),
        ("POST", f"{SPACE}/mailboxes", f'{{"name": {SURROGATE}}}'),
        ("POST", f"{SPACE}/mailboxes/{mailbox}/recv", f'{{"scopeId": "{run}", "holder": {SURROGATE}}}'),
        ("POST", f"{SPACE}/messages/{target.task}/nack", f'{{"token": "{target.token}", "error": {SURROGATE}}}'),
        ("POST", f"{SPACE}/barriers/{target.barrier}/arrive", f'{{"arrivalKey": {SURROGATE}}}'),
        ("POST", f"{SPACE}/claims", f'{{"scopeId": "{run}", "key": "c", "holder": {SURROGATE}}}'),
        ("POST", "/v1/keys", f'{{"permissions": ["coordination_read"], "name": {SURROGATE}}}'),
        ("POST", "/v1/spaces", f'{{"id": "s-surrogate", "name": {SURROGATE}}}'),
        ("POST", f"{SPACE}/scopes", f'{{{SURROGATE}: 1}}'),  # a field's name
    ]
    before = target.digest()
    for method, path, body in cases:
        refused(target.send(method, path, body.encode()), 400, "VALIDATION_FAILED")
    assert target.digest() == before
    no_traceback(target.node)


def test_header_bytes_that_are_not_utf8_are_refused(target: Target) -> None:
    before = target.digest()
    answer = send(target.node.url, "GET", "/v1/whoami", None, {"Authorization": b"Bearer rsk_\xe9\xff"})
    refused(answer, 401, "UNAUTHENTICATED")
    claim = json.dumps({"scopeId": target.run, "key": "held"}).encode()
    refused(target.send("POST", f"{SPACE}/claims", claim, **{"X-Runstate-Holder": b"\xe9\xff"}), 400, "VALIDATION_FAILED")
    refused(target.send("POST", f"{SPACE}/scopes", b"{}", **{"Idempotency-Key": b"k\xe9\xff"}), 400, "VALIDATION_FAILED")
    # A request id a "forwarded" request brings is kept only if it is one a node makes.
    for request_id in (b"\x80", b"req_" + b"0" * 5000, b"req_short"):
        answer = send(target.node.url, "GET", "/v1/nowhere", None, {"X-Request-Id": request_id, "X-Runstate-Forwarded-By": "n2"})
        assert answer.status == 404 and re.fullmatch(r"req_[0-9a-f]{24}", answer.json()["error"]["requestId"]), answer
        assert answer.headers["X-Request-Id"] == answer.json()["error"]["requestId"]
    assert target.digest() == before
    no_traceback(target.node)


def test_a_time_outside_the_years_1_to_9999_is_refused_before_it_is_committed(target: Target) -> None:
    before = target.digest()
    for at in ("0001-01-01T00:00:00+23:59", "0001-01-01T00:00:00.000+00:01"):
        body = json.dumps({"scopeId": target.run, "at": at}).encode()
        refused(target.send("POST", f"{SPACE}/timers", body), 400, "VALIDATION_FAILED")
        refused(target.send("POST", f"{SPACE}/scopes", json.dumps({"deadline": at}).encode()), 400, "VALIDATION_FAILED")
    assert target.digest() == before
    # The first moment of the year 1, in UTC, is still a time (in the past: it fires at once).
    body = json.dumps({"scopeId": target.run, "at": "0001-01-01T00:00:00-00:01"}).encode()
    timer = target.send("POST", f"{SPACE}/timers", body)
    assert timer.status == 201 and timer.json()["fireAt"] == "0001-01-01T00:01:00.000Z", timer
    fired = target.send("POST", f"{SPACE}/timers/{timer.json()['id']}/wait?waitMs=10000")  # settled before the next test
    assert fired.status == 200 and fired.json()["done"] is True, fired
    no_traceback(target.node)


def test_numbers_json_cannot_hold_are_refused(target: Target) -> None:
    before = target.digest()
    for number in ("NaN", "Infinity", "-Infinity", "1e999", "1" * 5000):
        body = f'{{"scopeId": "{target.run}", "mailboxId": "{target.mailbox}", "input": {number}}}'.encode()
        refused(target.send("POST", f"{SPACE}/tasks", body), 400, "VALIDATION_FAILED")
    assert target.digest() == before
    no_traceback(target.node)
