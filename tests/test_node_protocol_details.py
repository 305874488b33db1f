"""Protocol details a node must keep (issue 39, items 5 and 6), against a real `runstate dev --auth`
node over HTTP: a body is UTF-8 without a byte-order mark; a 405 names the methods the path serves
(`Allow`); a null field is not an absent one; one rule for every route's Idempotency-Key; a
malformed item of a batch refuses the whole batch. Each refusal is a 4xx with a code and message
and changes nothing (the node's data digest is the same before and after)."""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterator

import pytest

from runstate_server.node.api.app import ROUTES
from tests._http import recv
from tests._nodes import DevNode
from tests._raw_http import Answer
from tests.test_node_bad_input import Target, space_target

SPACE = "/v1/spaces/default"


@pytest.fixture(scope="module")
def target(auth_node: tuple[DevNode, str]) -> Iterator[Target]:
    yield from space_target(auth_node)


def refused(answer: Answer, status: int, code: str, says: str = "") -> None:
    assert (answer.status, answer.code) == (status, code), answer
    assert says in answer.json()["error"]["message"], answer


# -- item 5: a body is UTF-8 -----------------------------------------------------------------------


def test_a_body_that_is_not_utf8_is_refused_and_changes_nothing(target: Target) -> None:
    """The issue's body: '{"name":"utf16"}' in UTF-16 was a 201 (json.loads guessed the encoding)."""
    text = '{"name": "utf16"}'
    bodies = {
        "UTF-16 with its mark": text.encode("utf-16"),
        "UTF-16 LE": text.encode("utf-16-le"),
        "UTF-16 BE": text.encode("utf-16-be"),
        "UTF-32": text.encode("utf-32"),
        "UTF-32 LE": text.encode("utf-32-le"),
        "UTF-8 with a mark": codecs.BOM_UTF8 + text.encode(),
        "Latin-1": '{"name": "caf\u00e9"}'.encode("latin-1"),
    }
    before = target.digest()
    for path in (f"{SPACE}/scopes", f"{SPACE}/mailboxes", "/v1/keys"):
        for kind, body in bodies.items():
            answer = target.send("POST", path, body)
            assert (answer.status, answer.code) == (400, "VALIDATION_FAILED"), (path, kind, answer)
            assert "UTF-8" in answer.json()["error"]["message"], (kind, answer)
    # The charset parameter, if any, is UTF-8 (415, as for any other media type).
    for charset in ("utf-16", "iso-8859-1"):
        refused(
            target.send("POST", f"{SPACE}/scopes", text.encode(), **{"Content-Type": f"application/json; charset={charset}"}),
            415, "UNSUPPORTED_MEDIA_TYPE",
        )
    assert target.digest() == before
    # UTF-8 itself, non-ASCII included, is taken, with or without its charset.
    for content_type in ("application/json", "application/json; charset=utf-8"):
        created = target.send("POST", f"{SPACE}/scopes", '{"name": "caf\u00e9"}'.encode(), **{"Content-Type": content_type})
        assert created.status == 201 and created.json()["name"] == "caf\u00e9", created


def test_no_route_takes_a_utf16_body(target: Target) -> None:
    """Every route that reads a body refuses one in UTF-16 (none answers 2xx)."""
    before = target.digest()
    for route in ROUTES:
        if route.method == "GET":
            continue
        path = route.path.replace("{spaceId}", "default").replace("{key:.+}", "c1")
        for name in ("{id}", "{name}", "{lease}"):
            path = path.replace(name, "x")
        answer = target.send(route.method, path, '{"name": "x"}'.encode("utf-16"))
        assert 400 <= answer.status < 500, (route.method, path, answer)
    assert target.digest() == before


# -- item 6: 405 names the methods the path serves (RFC 9110) --------------------------------------


def test_a_405_carries_allow_with_the_methods_of_its_path(target: Target) -> None:
    methods_by_path: dict[str, set[str]] = {}
    for route in ROUTES:
        methods_by_path.setdefault(route.path, set()).add(route.method)
    before = target.digest()
    checked = 0
    for path, methods in methods_by_path.items():
        url = re.sub(r"{\w+(:[^}]*\))?[^}]*}", "x", path.replace("{spaceId}", "default"))
        for other in sorted({"GET", "POST", "PUT", "PATCH", "DELETE"} - methods):
            answer = target.send(other, url, b"{}")
            if answer.status != 405:  # another route's pattern takes the path with that method
                continue
            refused(answer, 405, "METHOD_NOT_ALLOWED")
            allowed = set(answer.headers["Allow"].split(", "))
            assert methods <= allowed and other not in allowed, (other, url, answer.headers)
            checked += 1
    assert checked > len(methods_by_path)
    assert target.digest() == before
    answer = target.send("DELETE", f"{SPACE}/scopes")
    assert answer.status == 405 and answer.headers["Allow"] == "GET, POST", answer
    assert "GET, POST" in answer.json()["error"]["message"]


# -- item 6: null is not absent in a by-name declaration -------------------------------------------


@pytest.mark.parametrize(
    ("kind", "sizes", "null_field"),
    [
        ("permits", {"units": 2}, "units"),
        ("allowances", {"unitsLimit": 5, "windowSeconds": 60}, "unitsLimit"),
        ("allowances", {"unitsLimit": 5, "windowSeconds": 60}, "windowSeconds"),
        ("budgets", {"limitMinor": "100", "currency": "USD", "scale": 2}, "limitMinor"),
        ("budgets", {"limitMinor": "100", "currency": "USD", "scale": 2}, "currency"),
        ("budgets", {"limitMinor": "100", "currency": "USD", "scale": 2}, "scale"),
    ],
)
def test_a_null_size_of_a_by_name_declaration_is_refused_not_a_look_up(
    target: Target, kind: str, sizes: dict[str, object], null_field: str
) -> None:
    """`{"units": null}` to PUT /permits/by-name/X was taken as `{}`, a look-up (404 when there is
    none, the permit's row when there is one): null is not absent."""
    name = f"null-{kind}-{null_field}"
    path = f"{SPACE}/{kind}/by-name/{name}"
    before = target.digest()
    for present in (False, True):
        for body in ({null_field: None}, {**sizes, null_field: None}):
            refused(target.send("PUT", path, json.dumps(body).encode()), 400, "VALIDATION_FAILED", f"{null_field} must not be null")
        assert target.digest() == before
        if not present:  # the same calls once the resource exists
            assert target.send("PUT", path, json.dumps(sizes).encode()).status == 200
            before = target.digest()
    assert target.send("PUT", path, b"{}").status == 200  # {} is the look-up


# -- item 6: one Idempotency-Key rule for every route ----------------------------------------------

BAD_IDEMPOTENCY_KEYS: tuple[bytes, ...] = (b"", b"has space", b"x" * 256, b"caf\xc3\xa9", b"tab\there")


def test_a_malformed_idempotency_key_is_refused_by_every_mutation(target: Target) -> None:
    """It was refused where a command is proposed (POST /scopes) but accepted by POST /v1/keys,
    POST /v1/keys/{id}/revoke and routes that wrote nothing (a by-name look-up)."""
    created = target.admin.ok("POST", "/v1/keys", {"permissions": ["coordination_read"], "name": "to-keep"})
    before = target.digest()
    checked = 0
    for route in ROUTES:
        if route.method == "GET":
            continue
        path = route.path.replace("{spaceId}", "default").replace("{keyId}", created["id"])
        path = re.sub(r"{\w+(:[^}]*\))?[^}]*}", "x", path)
        for bad in BAD_IDEMPOTENCY_KEYS:
            answer = target.send(route.method, path, b"{}", **{"Idempotency-Key": bad})
            refused(answer, 400, "VALIDATION_FAILED", "Idempotency-Key must be")
            checked += 1
    assert checked > 100
    assert target.digest() == before
    keys = target.admin.ok("GET", "/v1/keys")["keys"]
    assert [key["revokedAt"] for key in keys if key["id"] == created["id"]] == [None]  # not revoked
    # A key of the pattern is taken everywhere (a key's creation is applied on every request).
    good = "k-" + "x" * 200
    assert target.send("PUT", f"{SPACE}/permits/by-name/idem", json.dumps({"units": 1}).encode(), **{"Idempotency-Key": good}).status == 200
    assert target.send("POST", "/v1/keys", json.dumps({"permissions": ["coordination_read"]}).encode(), **{"Idempotency-Key": good}).status == 201
    # A GET takes no key: one there is not read.
    assert target.send("GET", f"{SPACE}/scopes", **{"Idempotency-Key": b"has space"}).status == 200


# -- item 6: a malformed item refuses the whole batch ----------------------------------------------


def test_a_malformed_item_refuses_the_whole_batch_complete(target: Target) -> None:
    """The issue's body was a 200 with a per-item error; now a 400 that completes nothing, not even
    the batch's well-formed items. A well-formed item that is refused (a stale token) stays a
    per-item error."""
    for key in ("b1", "b2"):
        target.admin.ok("POST", f"{SPACE}/tasks", {"scopeId": target.run, "mailboxId": target.mailbox, "input": key, "taskKey": key})
    deliveries = recv(target.admin, target.run, leaseMs=600_000, max=2)
    assert len(deliveries) == 2, deliveries
    good = [{"id": given["taskId"], "token": given["token"], "result": {"payload": 1}} for given in deliveries]
    path = f"{SPACE}/messages/complete"
    before = target.digest()
    malformed: list[object] = [
        {"id": "", "token": "x", "result": [None, None]},  # the item
        {"id": "x", "token": "x", "result": [None, None]},
        {"token": "x"},
        {"id": "x"},
        {"id": 5, "token": "x"},
        {"id": "x", "token": "x", "extra": 1},
        {"id": "x" * 10_000, "token": "x"},
        "not an object",
        None,
    ]
    for item in malformed:
        answer = target.send("POST", path, json.dumps({"items": [good[0], item]}).encode())
        refused(answer, 400, "VALIDATION_FAILED", "item 1 of the batch")
    assert target.digest() == before
    # Well-formed items: one completes, one with a stale token is refused on its own.
    stale = {**good[1], "token": good[1]["token"] + "0"}
    answer = target.send("POST", path, json.dumps({"items": [good[0], stale]}).encode())
    assert answer.status == 200, answer
    first, second = answer.json()["items"]
    assert first["state"] == "SUCCEEDED" and second["error"]["code"] in ("STALE_CLAIM", "NOT_FOUND"), answer


def test_a_malformed_task_refuses_the_whole_batch_submit(target: Target) -> None:
    path = f"{SPACE}/tasks/batch"

    def task(key: str, **extra: object) -> dict[str, object]:
        return {"scopeId": target.run, "mailboxId": target.mailbox, "input": key, "taskKey": key, **extra}

    before = target.digest()
    for item in (7, None, task("m1", mailbox="work"), {"scopeId": target.run, "mailboxId": target.mailbox},
                 task("m2", taskKey=""), task("m3", attempts=0), task("m4", deadline="yesterday")):
        answer = target.send("POST", path, json.dumps({"tasks": [task("ok-1"), item]}).encode())
        refused(answer, 400, "VALIDATION_FAILED", "item 1 of the batch")
    assert target.digest() == before
    # Well-formed tasks each answer on their own: an input over its bound is that task's error.
    answer = target.send("POST", path, json.dumps({"tasks": [task("ok-1"), task("big", input="x" * 70_000)]}).encode())
    assert answer.status == 200, answer
    created, too_large = answer.json()["tasks"]
    assert created["created"] and too_large["error"]["code"] == "VALIDATION_FAILED", answer
