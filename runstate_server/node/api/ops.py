"""Diagnostics (the published protocol's §5.14): a run's holders and waiters, and the space's
waiters, rendered from actors/ops.py under the node's read lock after leadership is confirmed.
A view of one moment, never a source of authority: act on it through the other routes."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from runstate_server.actors import ops
from runstate_server.node._json import json_response
from runstate_server.node.api.routes import READ, SPACE_PREFIX, RouteTable, caller_of, node_of
from runstate_server.node.api.schemas import (
    ANY_JSON,
    BOOLEAN,
    STRING,
    STRING_OR_NULL,
    TIME_OR_NULL,
    array,
    obj,
)
from runstate_server.node.api.views import in_space, iso

routes = RouteTable()

# The fields of actors/ops.py's views that hold times in ms; answered as ISO 8601.
_TIME_FIELDS = frozenset({"earliestLeaseExpiry", "leaseExpiresAt", "availableAt", "until", "fireAt", "cooldownUntil"})

# What waits: kind "task" (waitsFor: permit, allowance, budget, retry, worker), "permitWaiter",
# "allowanceWaiter", "barrier" or "timer"; the other fields depend on the kind (docs/http-api.md).
_WAITING = array(obj({"kind": STRING}, optional={"waitsFor": array(obj({"kind": STRING}))}))
_WORKER = obj({
    "holder": STRING, "sessions": array(STRING), "keys": array(STRING), "tasks": array(STRING),
    "grants": array(ANY_JSON), "reservations": array(ANY_JSON), "earliestLeaseExpiry": TIME_OR_NULL,
})
RUN = obj({
    "rootScopeId": STRING,
    "scopes": array(obj({"id": STRING, "name": STRING_OR_NULL, "parentId": STRING_OR_NULL, "storedState": STRING,
                         "effective": STRING})),
    "workers": array(_WORKER),
    "waiting": _WAITING,
    "truncated": BOOLEAN,
})
WAITS = obj({"waiting": _WAITING, "truncated": BOOLEAN})


def _rendered(value: Any) -> Any:
    """`value` with every time field (ms) as ISO 8601."""
    if isinstance(value, dict):
        return {key: iso(item) if key in _TIME_FIELDS else _rendered(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_rendered(item) for item in value]
    return value


def _now_ms() -> int:
    return int(time.time() * 1000)


@routes(
    "GET", SPACE_PREFIX + "/ops/runs/{scopeId}",
    "Diagnostics of a run and its descendants: each holder and what it holds (deliveries, claims, once "
    "leases, permit grants, budget reservations; earliestLeaseExpiry), and everything that waits with what it "
    "waits for and who holds that",
    errors=("NOT_FOUND",), permission=READ, answer=RUN,
)
async def run_diagnostics(request: web.Request) -> web.Response:
    node, caller = node_of(request), caller_of(request)
    await node.confirm_leadership(caller)
    with node.read() as state:
        run = in_space(state.runs, caller.space, request.match_info["scopeId"], "run")
        view = ops.run_view(state, run, _now_ms())
    return json_response(_rendered(view))


@routes(
    "GET", SPACE_PREFIX + "/ops/waits",
    "Everything of the space that waits on a resource: permit and allowance waiters in line and queued jobs "
    "whose needs fall short, each with the resource and who holds it",
    permission=READ, answer=WAITS,
)
async def waits(request: web.Request) -> web.Response:
    node, caller = node_of(request), caller_of(request)
    await node.confirm_leadership(caller)
    with node.read() as state:
        view = ops.waits_view(state, caller.space, _now_ms())
    return json_response(_rendered(view))
