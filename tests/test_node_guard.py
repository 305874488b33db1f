"""What a web page on another site can make a node do (node/api/guard.py), against real nodes: a
body must be sent as JSON (415 UNSUPPORTED_MEDIA_TYPE), a node without auth serves loopback
origins and hosts only (403 FORBIDDEN_ORIGIN), and it creates no API keys (409 AUTH_DISABLED).
Each refused request changes nothing."""

from __future__ import annotations

from typing import Any

from tests._http import Api, keyed_send, new_space
from tests._nodes import DevNode, read_bootstrap_key
from tests._raw_http import json_headers, send

# The requests of the report (issue 13, finding 3), as `curl -d` sends them.
CROSS_SITE = {"Content-Type": "text/plain", "Origin": "http://evil.example", "Host": "evil.example"}


def new_run(node: DevNode, space: str) -> str:
    return str(Api(node.url, space=space).ok("POST", "/v1/scopes", {})["id"])


def run_state(node: DevNode, space: str, run_id: str) -> str:
    return str(Api(node.url, space=space).ok("GET", f"/v1/scopes/{run_id}")["storedState"])


def test_a_cross_site_cancel_is_refused_and_changes_nothing(dev_node: DevNode) -> None:
    space = new_space(dev_node.url, "guard")
    run_id = new_run(dev_node, space)
    cancel = f"/v1/spaces/{space}/scopes/{run_id}/cancel"
    refusals: list[tuple[dict[str, Any], bytes | None, int, str]] = [
        (CROSS_SITE, b'{"reason":"x"}', 403, "FORBIDDEN_ORIGIN"),
        # Each part alone is enough.
        ({"Content-Type": "text/plain"}, b'{"reason":"x"}', 415, "UNSUPPORTED_MEDIA_TYPE"),
        ({"Content-Type": "application/x-www-form-urlencoded"}, b'{"reason":"x"}', 415, "UNSUPPORTED_MEDIA_TYPE"),
        ({}, b'{"reason":"x"}', 415, "UNSUPPORTED_MEDIA_TYPE"),  # a body without a content type
        ({"Content-Type": "application/json; charset=latin-1"}, b'{"reason":"x"}', 415, "UNSUPPORTED_MEDIA_TYPE"),
        ({"Origin": "http://evil.example"}, None, 403, "FORBIDDEN_ORIGIN"),  # no body: no preflight either
        ({"Origin": "null"}, None, 403, "FORBIDDEN_ORIGIN"),  # a sandboxed frame, a file:// page
        ({"Origin": "http://127.0.0.1.evil.example"}, None, 403, "FORBIDDEN_ORIGIN"),
        ({"Host": f"evil.example:{dev_node.port}"}, None, 403, "FORBIDDEN_ORIGIN"),  # DNS rebinding
        ({"Host": "localhost.evil.example"}, None, 403, "FORBIDDEN_ORIGIN"),
    ]
    for headers, body, status, code in refusals:
        answer = send(dev_node.url, "POST", cancel, body, headers)
        assert (answer.status, answer.code) == (status, code), (headers, answer)
        assert answer.json()["error"]["requestId"] == answer.headers["X-Request-Id"]
    assert run_state(dev_node, space, run_id) == "ACTIVE"


def test_a_node_without_auth_serves_this_machine(dev_node: DevNode) -> None:
    space = new_space(dev_node.url, "guard")
    base = f"/v1/spaces/{space}/scopes"
    port = dev_node.port
    for origin in ("http://127.0.0.1:3000", "http://localhost:5173", "http://[::1]:8000", "https://localhost"):
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "127.0.0.2"):
            answer = send(dev_node.url, "POST", base, b"{}", json_headers(Origin=origin, Host=host))
            assert answer.status == 201, (origin, host, answer)
    for content_type in ("application/json; charset=utf-8", "Application/JSON;charset=\"UTF-8\"", "application/problem+json"):
        answer = send(dev_node.url, "POST", base, b"{}", {"Content-Type": content_type})
        assert answer.status == 201, (content_type, answer)
    # A POST that takes no body needs no content type: none at all, or an empty one of any type.
    run_id = new_run(dev_node, space)
    assert send(dev_node.url, "POST", f"{base}/{run_id}/complete").status == 200
    run_id = new_run(dev_node, space)
    assert send(dev_node.url, "POST", f"{base}/{run_id}/complete", b"", {"Content-Type": "text/plain"}).status == 200


def test_a_node_without_auth_creates_no_key(node_factory: Any) -> None:
    node = node_factory().start()
    create = "/v1/keys"
    answer = send(node.url, "POST", create, b'{"permissions":["admin"]}', CROSS_SITE)
    assert (answer.status, answer.code) == (403, "FORBIDDEN_ORIGIN")
    answer = send(node.url, "POST", create, b'{"permissions":["admin"]}', {"Content-Type": "text/plain"})
    assert (answer.status, answer.code) == (415, "UNSUPPORTED_MEDIA_TYPE")
    # Not even from this machine, as JSON: a key made here would be valid after a restart with --auth.
    answer = send(node.url, "POST", create, b'{"permissions":["admin"]}', json_headers())
    assert (answer.status, answer.code) == (409, "AUTH_DISABLED")
    assert Api(node.url).ok("GET", "/v1/keys")["keys"] == []
    node.stop()

    node.extra_args = ("--auth",)
    node.start()
    keys = Api(node.url, key=read_bootstrap_key(node)).ok("GET", "/v1/keys")["keys"]
    assert [key["name"] for key in keys] == ["bootstrap admin"]  # only the key --auth created


def test_a_node_with_auth_ignores_origin_and_still_wants_json(auth_node: tuple[DevNode, str]) -> None:
    node, secret = auth_node
    # A bearer key is never attached by a browser, so with one the origin does not matter.
    answer = send(node.url, "GET", "/v1/whoami", None, {"Authorization": f"Bearer {secret}", **CROSS_SITE})
    assert answer.status == 200 and answer.json()["auth"] is True
    # Without one, a cross-site request is unauthenticated.
    answer = send(node.url, "POST", "/v1/keys", b'{"permissions":["admin"]}', {**CROSS_SITE, "Content-Type": "application/json"})
    assert (answer.status, answer.code) == (401, "UNAUTHENTICATED")
    answer = send(node.url, "POST", "/v1/spaces/default/scopes", b"{}", {"Authorization": f"Bearer {secret}", "Content-Type": "text/plain"})
    assert (answer.status, answer.code) == (415, "UNSUPPORTED_MEDIA_TYPE")


def test_the_document_names_the_new_answers(dev_node: DevNode) -> None:
    document = Api(dev_node.url).ok("GET", "/v1/openapi.json")
    cancel = document["paths"]["/v1/spaces/{spaceId}/scopes/{id}/cancel"]["post"]["responses"]
    assert {"403", "415"} <= set(cancel)
    assert "409" in document["paths"]["/v1/keys"]["post"]["responses"]


def test_a_follower_forwards_json_and_bodiless_calls_and_refuses_the_rest_itself(make_cluster: Any) -> None:
    cluster = make_cluster().start()
    follower = (cluster.leader_index() + 1) % cluster.size
    url, key = cluster.urls[follower], cluster.admin_key
    scopes = "/v1/spaces/default/scopes"
    # Keyed, and sent again while the answer is 503 UNAVAILABLE (an election on a loaded machine:
    # the outcome is unknown, the same key makes the resend safe).
    created = keyed_send(url, "POST", scopes, b"{}", json_headers(key, Origin="http://evil.example"))
    assert created.status == 201 and "X-Runstate-Leader" in created.headers, created  # served by the leader
    run_id = created.json()["id"]
    # A bodiless POST (as the 0.2 client cancels) needs no content type on either hop.
    cancelled = keyed_send(url, "POST", f"{scopes}/{run_id}/cancel", None, {"Authorization": f"Bearer {key}"})
    assert cancelled.status == 200 and cancelled.json()["storedState"] == "CANCELLED", cancelled
    refused = send(url, "POST", scopes, b"{}", {"Authorization": f"Bearer {key}", "Content-Type": "text/plain"})
    assert (refused.status, refused.code) == (415, "UNSUPPORTED_MEDIA_TYPE")
    assert "X-Runstate-Leader" not in refused.headers  # refused where it arrived, not forwarded
