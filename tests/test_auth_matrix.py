"""Every route of the OpenAPI document against a `runstate dev --auth` node, called with no key, a
revoked key, a key lacking the route's permission, and a key of another space: each gets the
documented status, and none changes the state (the node's state digest without its clock is the
same before and after). An id of another space answers exactly as an id that does not exist."""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest

from tests._auth_world import OTHER_SPACE, PERMISSIONS, World, auth_world, concrete
from tests._http import Api
from tests._prometheus import scrape

# Routes whose answer depends on no id of the caller's space: a key of another space uses them in
# its own space, legitimately (and changes its own space's state), so the cross-space case skips them.
# Takes no key but a proof that the caller holds the cluster secret (node/membership.py).
JOIN = ("POST", "/v1/cluster/join")
SPACELESS = {
    ("GET", "/v1/whoami"), ("POST", "/v1/spaces"), ("GET", "/v1/spaces"), ("POST", "/v1/keys"),
    ("GET", "/v1/keys"), ("POST", "/v1/scopes"), ("GET", "/v1/mailboxes"),
    ("PUT", "/v1/mailboxes/by-name/{name}"), ("PUT", "/v1/runs/{name}"), ("POST", "/v1/mailboxes"),
    ("POST", "/v1/tasks/results"), ("POST", "/v1/permits"), ("GET", "/v1/permits"),
    ("PUT", "/v1/permits/by-name/{name}"), ("GET", "/v1/work-limits"), ("POST", "/v1/budgets"), ("GET", "/v1/budgets"),
    ("PUT", "/v1/budgets/by-name/{name}"),
    ("GET", "/v1/cluster"), ("GET", "/v1/cluster/digest"), ("GET", "/v1/ops/waits"), ("GET", "/metrics"),
    ("POST", "/v1/cluster/transfer-leader"), ("POST", "/v1/cluster/members"), ("DELETE", "/v1/cluster/members/{id}"),
    ("POST", "/v1/cluster/members/{id}/promote"), ("GET", "/v1/cluster/backup"),
    ("POST", "/v1/allowances"), ("GET", "/v1/allowances"), ("PUT", "/v1/allowances/by-name/{name}"),
    ("GET", "/v1/events"), ("GET", "/v1/watch"),  # they name no id (a scopeId of another space matches nothing)
    # The list reads (extensions): their filters name ids only in the query, matching nothing of another space.
    ("GET", "/v1/scopes"), ("GET", "/v1/tasks"), ("GET", "/v1/task-groups"), ("GET", "/v1/barriers"), ("GET", "/v1/timers"),
}


# A claim's token names its lease, not an id of the space: one that holds nothing here (another
# space's, an unknown one) is stale, 409 STALE_CLAIM, exactly like an ended one.
TOKEN_ROUTES = {
    ("POST", "/v1/claims/{key}/renew"), ("POST", "/v1/claims/{key}/release"),
    ("POST", "/v1/grants/{grantId}/renew"), ("POST", "/v1/grants/{grantId}/release"),
}



def whole_token(value: str) -> re.Pattern[str]:
    """`value` where it stands as a whole id, not inside a longer one."""
    return re.compile(rf"(?<![A-Za-z0-9_-]){re.escape(value)}(?![A-Za-z0-9_-])")

@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    yield from auth_world(tmp_path_factory)


def data_digest(world: World) -> str:
    return str(world.admin.ok("GET", "/v1/cluster/digest")["dataDigest"])


def call(world: World, api: Api, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
    body = world.bodies.get((method, path), {} if method == "POST" else None)
    ids = kwargs.get("ids")
    if ids is not None and isinstance(body, dict):  # the ids a body names (a run's, a token) too
        replaced = {world.ids[family]: value for family, value in ids.items()}
        body = {field: replaced.get(value, value) if isinstance(value, str) else value for field, value in body.items()}
    url = concrete(world, method, path, **kwargs)
    if method == "GET" and body is not None:  # the fields of a GET go in its query
        url, body = url + "?" + urllib.parse.urlencode(body), None
    return api(method, url, body)


def test_the_document_names_a_permission_for_every_route(world: World) -> None:
    permissions = {permission for _, _, permission in world.routes}
    assert permissions <= {"public", "any", *PERMISSIONS}
    assert {(m, p) for m, p, perm in world.routes if perm == "public"} == {
        ("GET", "/v1/health"), ("GET", "/v1/openapi.json"),
        JOIN,  # proves the cluster secret instead (node/membership.py)
    }
    assert len(world.routes) > 50


# The permissions docs/http-api.md gives the barrier and timer routes: creating a barrier is
# configuration; the by-name declarations are the published clients' worker calls (together,
# sleep); a timer's wait acknowledges the firing, so it is a write like the ack.
DOCUMENTED = {
    ("POST", "/v1/barriers"): "resource_config",
    ("POST", "/v1/barriers/{id}/nextEpoch"): "resource_config",
    ("PUT", "/v1/barriers/by-name/{name}"): "coordination_write",
    ("POST", "/v1/barriers/{id}/arrive"): "coordination_write",
    ("GET", "/v1/barriers/{id}"): "coordination_read",
    ("GET", "/v1/barriers/{id}/wait"): "coordination_read",
    ("POST", "/v1/timers/{id}/wait"): "coordination_write",
    ("POST", "/v1/timers/{id}/ack"): "coordination_write",
    ("POST", "/v1/timers/poll"): "coordination_read",
    ("GET", "/v1/timers/{id}"): "coordination_read",
}


def test_the_barrier_and_timer_routes_need_the_documented_permissions(world: World) -> None:
    declared = {(method, path): permission for method, path, permission in world.routes}
    assert {route: declared.get(route) for route in DOCUMENTED} == DOCUMENTED


def test_no_key_and_a_revoked_key_are_unauthenticated_and_change_nothing(world: World) -> None:
    anonymous = Api(world.node.url)
    wrong = Api(world.node.url, key="rsk_" + "x" * 43)
    before = data_digest(world)
    for method, path, permission in world.routes:
        for api in (anonymous, wrong, world.revoked):
            status, body = call(world, api, method, path)
            if (method, path) == JOIN:  # no key, and no proof of the cluster secret either
                assert (status, body["error"]["code"]) == (401, "UNAUTHENTICATED"), (method, path, body)
            elif permission == "public":
                assert status == 200, (method, path, status, body)
            else:
                assert (status, body["error"]["code"]) == (401, "UNAUTHENTICATED"), (method, path, body)
    assert data_digest(world) == before


def test_a_key_without_the_permission_is_forbidden_and_changes_nothing(world: World) -> None:
    before = data_digest(world)
    checked = 0
    for method, path, permission in world.routes:
        if permission not in PERMISSIONS:
            continue
        status, body = call(world, world.lacking[permission], method, path)
        assert (status, body["error"]["code"]) == (403, "FORBIDDEN"), (method, path, body)
        assert permission in body["error"]["message"]
        checked += 1
    assert checked > 40
    assert data_digest(world) == before


# Batch calls, and the field of their answer that lists each item's own answer.
PER_ITEM_ROUTES = {"/v1/tasks/batch": "tasks", "/v1/messages/complete": "items"}


def test_ids_of_another_space_are_not_found_exactly_like_unknown_ids(world: World) -> None:
    unknown = {family: f"{value}x" for family, value in world.ids.items()}
    before = data_digest(world)
    checked = 0
    for method, path, permission in world.routes:
        if permission == "public" or (method, path) in SPACELESS:
            continue
        status, body = call(world, world.other, method, path)
        if path in PER_ITEM_ROUTES:  # per-item answers (docs/http-api.md): each one NOT_FOUND
            items = body[PER_ITEM_ROUTES[path]]
            assert status == 200 and [item["error"]["code"] for item in items] == ["NOT_FOUND"], body
            continue
        # The same answer as for an id that exists nowhere, up to the id itself.
        unknown_status, unknown_body = call(world, world.other, method, path, ids=unknown)
        if (method, path) in TOKEN_ROUTES:
            assert (status, body["error"]["code"]) == (409, "STALE_CLAIM") == (unknown_status, unknown_body["error"]["code"])
            checked += 1
            continue
        assert (status, (body.get("error") or {}).get("code")) == (404, "NOT_FOUND"), (method, path, body)
        assert unknown_status == 404, (method, path, unknown_body)
        message, unknown_message = body["error"]["message"], unknown_body["error"]["message"]
        for family, value in sorted(world.ids.items(), key=lambda item: -len(item[1])):  # a delivery id holds its task's
            message = whole_token(value).sub("<id>", message)  # "c1" is a claim key, not part of "mbx_a8c1..."
            unknown_message = whole_token(unknown[family]).sub("<id>", unknown_message)
        assert message == unknown_message, (method, path)
        checked += 1
    assert checked > 35
    assert data_digest(world) == before


def test_a_key_of_another_space_sees_none_of_its_data_on_spaceless_routes(world: World) -> None:
    results = world.other.ok("POST", "/v1/tasks/results", {"ids": [world.ids["tasks"]]})["results"]
    assert results == [{"id": world.ids["tasks"], "error": results[0]["error"]}]
    assert results[0]["error"]["code"] == "NOT_FOUND"
    assert [space["id"] for space in world.other.ok("GET", "/v1/spaces")["spaces"]] == [OTHER_SPACE]
    assert all(key["space"] == OTHER_SPACE for key in world.other.ok("GET", "/v1/keys")["keys"])
    assert world.other.error("GET", "/v1/keys?space=default") == (403, "FORBIDDEN")
    assert world.other.ok("GET", "/v1/whoami")["space"] == OTHER_SPACE
    # GET /metrics: the per-space series of its own space only; the operator's show the world's space.
    other_spaces = {dict(labels).get("space") for _, labels in scrape(world.node.url, world.other.headers["Authorization"].split()[1])[0]}
    admin_spaces = {dict(labels).get("space") for _, labels in scrape(world.node.url, world.admin.headers["Authorization"].split()[1])[0]}
    assert other_spaces <= {None, OTHER_SPACE} and "default" in admin_spaces, (other_spaces, admin_spaces)


def test_a_space_header_other_than_the_keys_space_is_forbidden(world: World) -> None:
    elsewhere = Api(world.node.url, space="default", key=world.other.headers["Authorization"].split()[1])
    before = data_digest(world)
    assert elsewhere.error("GET", f"/v1/scopes/{world.ids['scopes']}") == (403, "FORBIDDEN")
    assert elsewhere.error("POST", "/v1/scopes", {}) == (403, "FORBIDDEN")
    assert data_digest(world) == before


def test_the_operator_key_passes_every_check(world: World) -> None:
    """The control: with the right key, no route answers 401, 403 or 404 for the world's ids."""
    for method, path, _ in world.routes:
        if path.endswith(("/revoke", "/cancel", "/complete", "/release", "/reject", "/fail", "/close")):
            continue  # ends an entity the other checks use
        if (method, path) == JOIN:
            continue  # takes no key: a proof of the cluster secret (tests/test_cluster_membership.py)
        status, body = call(world, world.admin, method, path)
        assert status not in (401, 403, 404), (method, path, status, body)


# Operator routes take no idempotency key: they are not the published protocol's, and a key's
# secret is shown once, never replayed.
OPERATOR_PREFIXES = ("/v1/spaces", "/v1/keys", "/v1/whoami", "/v1/cluster", "/v1/health", "/v1/openapi.json")


def without_request_id(answer: tuple[int, Any]) -> tuple[int, Any]:
    status, body = answer
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        body = {**body, "error": {k: v for k, v in body["error"].items() if k != "requestId"}}
    if isinstance(body, dict) and "now" in body:  # the node's clock when it answers (PUT /timers/by-name)
        body = {k: v for k, v in body.items() if k != "now"}
    return status, body


def test_every_mutation_retried_with_its_idempotency_key_is_answered_alike(world: World) -> None:
    """Each mutating route, sent twice with one Idempotency-Key, answers the second time exactly
    as the first (a route that applied its command again would answer otherwise: a second run, a
    second task, another token). Runs last in this module: it changes the world."""
    checked = 0
    for index, (method, path, _) in enumerate(world.routes):
        if method == "GET" or path.startswith(OPERATOR_PREFIXES):
            continue
        keyed = Api(world.node.url, key=world.admin.headers["Authorization"].split()[1])
        keyed.headers["Idempotency-Key"] = f"replay-{index}"
        first = without_request_id(call(world, keyed, method, path))
        again = without_request_id(call(world, keyed, method, path))
        assert again == first, (method, path, first, again)
        checked += 1
    assert checked > 40  # the protocol's mutations, not a handful
