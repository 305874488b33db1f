"""Every node serves the console: GET / and /console redirect to /console/, the built files with
their headers (CSP, nosniff, no-cache with an ETag), without a key, outside the OpenAPI document;
the guard of a node without auth still refuses foreign origins and hosts, and lets the console's
own same-origin requests through."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

from tests._http import Api
from tests._nodes import DevNode

STATIC = Path(__file__).resolve().parent.parent / "runstate_server" / "console" / "static"
CSP = "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def _get(url: str, headers: dict[str, str] | None = None, method: str = "GET", body: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers=headers or {}, method=method, data=body)
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(request, timeout=30) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, dict(error.headers), error.read()


def test_the_node_serves_the_committed_files_with_their_headers(auth_node: tuple[DevNode, str]) -> None:
    node, _ = auth_node  # a node with auth: no key is needed for the console's files
    for path in ("/", "/console"):
        status, headers, _ = _get(node.url + path)
        assert (status, headers["Location"]) == (302, "/console/")
    served = {"index.html": "/console/", "app.js": "/console/static/app.js", "app.css": "/console/static/app.css"}
    types = {"index.html": "text/html", "app.js": "text/javascript", "app.css": "text/css"}
    for name, path in served.items():
        status, headers, body = _get(node.url + path)
        assert status == 200
        assert body == (STATIC / name).read_bytes()
        assert headers["Content-Type"].startswith(types[name])
        assert headers["Content-Security-Policy"] == CSP
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert headers["Cache-Control"] == "no-cache"
        status, again, body = _get(node.url + path, {"If-None-Match": headers["ETag"]})
        assert (status, body, again["ETag"]) == (304, b"", headers["ETag"])
    for missing in ("/console/static/nope.js", "/console/static/index.html", "/console/static/..%2Fapp.js"):
        status, _, body = _get(node.url + missing)
        assert status == 404 and json.loads(body)["error"]["code"] == "NOT_FOUND"
    paths = Api(node.url).ok("GET", "/v1/openapi.json")["paths"]
    assert [path for path in paths if path == "/" or path.startswith("/console")] == []


def test_the_guard_of_a_node_without_auth_still_holds(dev_node: DevNode) -> None:
    status, _, _ = _get(dev_node.url + "/console/", {"Host": "rebound.example:8080"})
    assert status == 403  # DNS rebinding: the console is not served under another name either
    create = json.dumps({"name": "from-the-console"}).encode()
    json_type = {"Content-Type": "application/json"}
    status, _, body = _get(dev_node.url + "/v1/spaces/default/scopes", {**json_type, "Origin": dev_node.url}, "POST", create)
    assert status == 201, body  # the console's own origin
    status, _, body = _get(dev_node.url + "/v1/spaces/default/scopes", {**json_type, "Origin": "http://evil.example"}, "POST", create)
    assert status == 403 and json.loads(body)["error"]["code"] == "FORBIDDEN_ORIGIN"
