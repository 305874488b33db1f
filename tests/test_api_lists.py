"""The list reads of the console (GET /scopes, /tasks, /task-groups, /barriers, /timers) and the
mailbox stats, against a real dev node: filters, newest-first paging with a cursor that holds
under concurrent inserts, bad query values, and space isolation."""

from __future__ import annotations

import uuid
from typing import Any

from tests._http import Api
from tests._nodes import DevNode


def _space(dev_node: DevNode) -> Api:
    return Api(dev_node.url, space=f"lists-{uuid.uuid4().hex[:10]}")


def _all(api: Api, path: str, field: str, limit: int, **query: str) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    cursor = ""
    while True:
        params = "&".join(f"{k}={v}" for k, v in {**query, "limit": str(limit), "cursor": cursor}.items())
        answer = api.ok("GET", f"{path}?{params}")
        seen.extend(answer[field])
        if answer["nextCursor"] is None:
            return seen
        cursor = answer["nextCursor"]


def test_scopes_list_filters_and_pages_newest_first(dev_node: DevNode) -> None:
    api = _space(dev_node)
    root = api.ok("POST", "/v1/scopes", {"name": "Alpha Root"})
    children = [api.ok("POST", "/v1/scopes", {"parentId": root["id"], "name": f"child-{i}"}) for i in range(3)]
    other = api.ok("POST", "/v1/scopes", {"name": "beta"})
    api.ok("POST", f"/v1/scopes/{other['id']}/cancel", {})
    everything = _all(api, "/v1/scopes", "scopes", 2)
    assert [run["id"] for run in everything] == [other["id"], *[c["id"] for c in reversed(children)], root["id"]]
    assert everything[0] == api.ok("GET", f"/v1/scopes/{other['id']}")
    roots = api.ok("GET", "/v1/scopes?root=true")["scopes"]
    assert [run["id"] for run in roots] == [other["id"], root["id"]]
    assert [r["id"] for r in api.ok("GET", f"/v1/scopes?parentId={root['id']}&limit=2")["scopes"]] == [
        children[2]["id"], children[1]["id"]]
    assert [r["id"] for r in api.ok("GET", "/v1/scopes?name=ALPHA")["scopes"]] == [root["id"]]
    assert [r["id"] for r in api.ok("GET", "/v1/scopes?state=CANCELLED")["scopes"]] == [other["id"]]
