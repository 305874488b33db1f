"""A `runstate dev --auth` node furnished for the auth tests: one of every entity in the operator
space, a second space with an all-permission key, a revoked key, and for each permission a key
with every other one."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests._http import Api, recv
from tests._nodes import DevNode, start_auth_node

PERMISSIONS = ("admin", "resource_config", "coordination_write", "coordination_read")
OTHER_SPACE = "other-team"
SPACE_ROUTE_PREFIX = "/v1/spaces/{spaceId}/"
_PARAMETER = re.compile(r"{(\w+)}")


@dataclass
class World:
    node: DevNode
    admin: Api  # the operator's bootstrap key
    ids: dict[str, str]  # path parameter values, per route family
    bodies: dict[tuple[str, str], Any]
    other: Api  # an all-permission key of OTHER_SPACE
    revoked: Api
    lacking: dict[str, Api]  # permission -> a key of the operator space with every other permission
    routes: list[tuple[str, str, str]]  # (method, OpenAPI path, x-runstate-permission)


def new_key(admin: Api, permissions: list[str], space: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"permissions": permissions, "name": "matrix"}
    if space is not None:
        body["space"] = space
    key: dict[str, Any] = admin.ok("POST", "/v1/keys", body)
    return key


def keyed(admin: Api, *permissions: str) -> Api:
    """A client with a new key of the admin's space that has exactly `permissions`."""
    return Api(admin.base_url, key=new_key(admin, list(permissions))["key"])


def forbidden(api: Api, method: str, path: str, body: Any, permission: str) -> None:
    """The call is `403 FORBIDDEN` in the error envelope, its message naming the permission it needs."""
    status, answer = api(method, path, body)
    assert status == 403, (method, path, status, answer)
    assert set(answer) == {"error"} and set(answer["error"]) == {"code", "message", "requestId"}, answer
    assert answer["error"]["code"] == "FORBIDDEN"
    assert f"needs the {permission} permission" in answer["error"]["message"], answer


def auth_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """A module fixture's body: the node with its world; the node is stopped at the end."""
    node, secret = start_auth_node(tmp_path_factory.mktemp("auth-world") / "data")
    try:
        yield build_world(node, secret)
    finally:
        node.stop()


def build_world(node: DevNode, secret: str) -> World:
    admin = Api(node.url, key=secret)
    work = admin.ok("POST", "/v1/mailboxes", {"name": "work"})["id"]
    a_only = admin.ok("POST", "/v1/mailboxes", {"name": "a-only"})["id"]  # a name no other space has
    run = admin.ok("POST", "/v1/scopes", {})["id"]
    admin.ok("POST", "/v1/scopes", {"parentId": run})
    task = admin.ok("POST", "/v1/tasks", {"scopeId": run, "mailboxId": work, "input": 1, "taskKey": "t1"})["id"]
    (delivery,) = recv(admin, run, leaseMs=600_000)
    once_token = admin.ok("POST", "/v1/once/acquire", {"scopeId": run, "key": "c1", "leaseSeconds": 600})["token"]
    claim = admin.ok("POST", "/v1/claims", {"scopeId": run, "key": "c1", "leaseSeconds": 600})
    group = admin.ok("POST", "/v1/task-groups", {"mailboxId": work, "condition": "ALL_TERMINAL", "scopeId": run})["id"]
    member = admin.ok("POST", f"/v1/task-groups/{group}/tasks", {"input": 2, "taskKey": "m1"})["id"]
    barrier = admin.ok("POST", "/v1/barriers", {"scopeId": run, "target": 2})["id"]
    timer = admin.ok("POST", "/v1/timers", {"scopeId": run, "afterSeconds": 3600})["id"]
    # Resources named like the mailbox no other space has: a path's {name} takes that one value.
    permit = admin.ok("PUT", "/v1/permits/by-name/a-only", {"units": 2})["id"]
    grant = admin.ok("POST", f"/v1/permits/{permit}/acquire", {"scopeId": run, "leaseSeconds": 600})
    waiter = admin.ok("POST", f"/v1/permits/{permit}/wait", {"scopeId": run, "ttlSeconds": 3600})["waiterId"]
    budget = admin.ok("PUT", "/v1/budgets/by-name/a-only", {"limitMinor": "100000000", "scale": 6})["id"]
    budget_reservation = admin.ok(
        "POST", f"/v1/budgets/{budget}/reserve", {"scopeId": run, "amountMinor": "1"}
    )["reservationId"]
    allowance = admin.ok("PUT", "/v1/allowances/by-name/a-only", {"unitsLimit": 1000, "windowSeconds": 1})["id"]
    consumption = admin.ok("POST", f"/v1/allowances/{allowance}/consume", {"scopeId": run})["consumptionId"]
    allowance_waiter = admin.ok("POST", f"/v1/allowances/{allowance}/wait", {"scopeId": run, "ttlSeconds": 3600})["waiterId"]
    admin.ok("POST", "/v1/spaces", {"id": OTHER_SPACE})
    other = Api(node.url, key=new_key(admin, list(PERMISSIONS), OTHER_SPACE)["key"])
    other.ok("POST", "/v1/mailboxes", {"name": "work"})  # so a group body naming it is no 404 of its own
    victim = new_key(admin, ["coordination_read"])
    revoked = Api(node.url, key=victim["key"])
    admin.ok("POST", f"/v1/keys/{victim['id']}/revoke")
    lacking = {
        permission: Api(node.url, key=new_key(admin, [p for p in PERMISSIONS if p != permission])["key"])
        for permission in PERMISSIONS
    }
    ids = {
        "scopes": run, "tasks": task, "messages": delivery["taskId"], "claims": claim["token"],
        "barriers": barrier, "timers": timer, "keys": victim["id"], "mailboxes": a_only, "names": "a-only",
        "runs": "a-only", "claim-key": "c1",
        "permits": permit, "grants": grant["grantId"], "permit-waiters": waiter, "budgets": budget,
        "ops": run,  # /ops/runs/{scopeId}
        "allowances": allowance, "allowance-waiters": allowance_waiter, "allowance-consumptions": consumption,
        "task-groups": group, "members": member,
        "cluster": "dev",  # DELETE /v1/cluster/members/{id}: the dev node's own id
    }
    bodies = {
        ("POST", "/v1/cluster/members"): {"nodeId": "n9", "raftAddress": "127.0.0.1:1", "apiUrl": "http://127.0.0.1:1"},
        ("POST", "/v1/cluster/join"): {"nodeId": "n9", "raftAddress": "127.0.0.1:1", "apiUrl": "http://127.0.0.1:1"},
        ("POST", "/v1/task-groups"): {"mailboxId": work, "condition": "ALL_TERMINAL"},
        ("POST", "/v1/task-groups/{groupId}/tasks"): {"taskKey": "m3", "input": 3},
        ("POST", "/v1/task-groups/{groupId}/join-task"): {"taskId": task},
        ("POST", "/v1/barriers/{id}/arrive"): {"arrivalKey": "a"},
        ("POST", "/v1/tasks"): {"scopeId": run, "mailboxId": work, "input": 4},
        ("POST", "/v1/tasks/batch"): {"tasks": [{"scopeId": run, "mailboxId": work, "input": 5}]},
        ("POST", "/v1/tasks/admit"): {"scopeId": run, "mailboxId": work},
        ("POST", "/v1/tasks/{id}/join"): {"subscriberId": "s", "scopeId": run},
        ("POST", "/v1/tasks/{id}/detach"): {"subscriberId": "s"},
        ("POST", "/v1/mailboxes/{id}/messages"): {"scopeId": run, "payload": 6},
        ("POST", "/v1/mailboxes/{id}/recv"): {"scopeId": run},
        ("POST", "/v1/messages/{id}/renew"): {"token": delivery["token"]},
        ("POST", "/v1/messages/{id}/nack"): {"token": delivery["token"], "retry": True},
        ("POST", "/v1/barriers"): {"scopeId": run, "target": 1},
        ("PUT", "/v1/barriers/by-name/{name}"): {"scopeId": run, "target": 1},
        ("POST", "/v1/timers"): {"scopeId": run, "afterSeconds": 60},
        ("PUT", "/v1/timers/by-name/{name}"): {"scopeId": run, "afterSeconds": 60},
        ("POST", "/v1/timers/poll"): {"scopeId": run},
        ("POST", "/v1/timers/{id}/ack"): {"token": "t"},
        ("POST", "/v1/messages/{id}/complete"): {"token": delivery["token"], "result": {"payload": 1}},
        ("POST", "/v1/messages/complete"): {"items": [{"id": delivery["taskId"], "token": delivery["token"]}]},
        ("POST", "/v1/once/acquire"): {"scopeId": run, "key": "c2"},
        ("GET", "/v1/once"): {"scopeId": run, "key": "c1"},  # GET bodies are sent as the query
        **{("POST", f"/v1/once/{action}"): {"scopeId": run, "key": "c1", "token": once_token}
           for action in ("renew", "complete", "fail", "release")},
        ("POST", "/v1/claims"): {"scopeId": run, "key": "c2"},
        ("GET", "/v1/claims/{key}"): {"scopeId": run},
        ("POST", "/v1/claims/{key}/renew"): {"token": claim["token"]},
        ("POST", "/v1/claims/{key}/release"): {"token": claim["token"]},
        ("POST", "/v1/mailboxes"): {"name": "more"},
        ("POST", "/v1/keys"): {"permissions": ["coordination_read"]},
        ("POST", "/v1/tasks/results"): {"ids": [task]},
        ("POST", "/v1/permits"): {"name": "more", "units": 1},
        ("PUT", "/v1/permits/by-name/{name}"): {"units": 2},
        ("PATCH", "/v1/permits/{permitId}"): {"units": 2},
        ("POST", "/v1/permits/{permitId}/acquire"): {"scopeId": run, "units": 1},
        ("POST", "/v1/permits/{permitId}/wait"): {"scopeId": run, "units": 1},
        ("POST", "/v1/grants/{grantId}/renew"): {"token": grant["token"]},
        ("POST", "/v1/grants/{grantId}/release"): {"token": grant["token"]},
        ("POST", "/v1/work-limits"): {"name": "more", "scopeId": run, "maxOutstanding": 1},
        ("POST", "/v1/budgets"): {"name": "more", "limitMinor": "100"},
        ("PUT", "/v1/budgets/by-name/{name}"): {"limitMinor": "100000000", "scale": 6},
        ("PATCH", "/v1/budgets/{budgetId}"): {"limitMinor": "100000000"},
        ("POST", "/v1/budgets/{budgetId}/reserve"): {"scopeId": run, "amountMinor": "1"},
        ("POST", "/v1/budgets/{budgetId}/settle"): {"reservationId": budget_reservation, "amountMinor": "0",
                                                    "workKey": "w"},
        ("POST", "/v1/budgets/{budgetId}/void"): {"reservationId": budget_reservation, "workKey": "w"},
        ("POST", "/v1/allowances"): {"name": "more", "unitsLimit": 1, "windowSeconds": 1},
        ("PUT", "/v1/allowances/by-name/{name}"): {"unitsLimit": 1000, "windowSeconds": 1},
        ("PATCH", "/v1/allowances/{allowanceId}"): {"unitsLimit": 1000, "windowSeconds": 1},
        ("POST", "/v1/allowances/{allowanceId}/consume"): {"scopeId": run, "units": 1},
        ("POST", "/v1/allowances/{allowanceId}/wait"): {"scopeId": run, "units": 1},
        ("POST", "/v1/allowances/{allowanceId}/cooldown"): {"seconds": 1},
        ("POST", "/v1/allowance-consumptions/{consumptionId}/settle"): {"units": 1},
    }
    document = Api(node.url).ok("GET", "/v1/openapi.json")
    # Space routes as the tests name them: `/v1/<path>` (Api puts them under the caller's space).
    routes = [
        (method.upper(), path.replace(SPACE_ROUTE_PREFIX, "/v1/", 1), operation["x-runstate-permission"])
        for path, operations in document["paths"].items()
        for method, operation in operations.items()
    ]
    return World(node, admin, ids, bodies, other, revoked, lacking, routes)


def concrete(world: World, method: str, path: str, ids: dict[str, str] | None = None) -> str:
    """`path` with the world's ids (or `ids`) in its parameters."""
    values = ids if ids is not None else world.ids
    family = path.split("/")[2] if path.startswith("/v1/") else ""  # GET /metrics is outside /v1

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name == "key":
            return values["claim-key"]
        if name == "name":
            return values["names"]  # the mailbox, permit, allowance, budget and named run of the world have its name
        if name == "taskId" and family == "task-groups":
            return values["members"]  # a member of the world's group
        return values[family]

    return _PARAMETER.sub(value, path)
