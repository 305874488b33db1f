"""What the protocol's named resources (permits, allowances, budgets: each a resources.py pool,
rate limit or budget seen through a public id) share on the wire: a name in a path, the look-up of
`PUT .../by-name/{name}` with `{}` (read permission; declaring needs resource_config), the list
of the space's rows, and the resize extension (`PATCH .../{id}`). Read under the node's read lock after leadership is confirmed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from runstate_server.actors import limits, resources
from runstate_server.actors.state import State
from runstate_server.node._json import json_response
from runstate_server.node.api import _request as req
from runstate_server.node.api.routes import caller_of, node_of
from runstate_server.node.errors import ApiError


def resource_name(value: str | None) -> str:
    if value is None or len(value) > limits.name_chars_max:
        raise ApiError("VALIDATION_FAILED", f"name must be 1 to {limits.name_chars_max} characters")
    return value


async def look_up(
    request: web.Request, kind: str, name: str, what: str, row: Callable[[web.Request, str], dict[str, Any]]
) -> web.Response:
    """The declaration answer of the resource of that kind and name (`created` false); NOT_FOUND."""
    node, caller = node_of(request), caller_of(request)
    await node.confirm_leadership(caller)
    with node.read() as state:
        resource = resources.find(state, kind, caller.space, name)
        public_id = None if resource is None else resource.public_id
    if public_id is None:
        raise ApiError("NOT_FOUND", f"{what} {name!r} not found")
    return json_response({**row(request, public_id), "created": False})


async def listed(request: web.Request, field: str, rows: Callable[[State, str], list[dict[str, Any]]]) -> web.Response:
    """`{field: rows}` of the caller's space, oldest first."""
    node, caller = node_of(request), caller_of(request)
    await node.confirm_leadership(caller)
    with node.read() as state:
        found = rows(state, caller.space)
    return json_response({field: found})


async def resized(
    request: web.Request, kind: str, id_field: str, sizes: dict[str, Any],
    row: Callable[[web.Request, str], dict[str, Any]],
) -> web.Response:
    """Resize the resource of that kind named by the path's `id_field` to `sizes` (the core's
    config fields) and answer its row."""
    public_id = request.match_info[id_field]
    await req.propose(request, "resource.resize", {"resource": kind, "id": public_id, **sizes})
    return json_response(row(request, public_id))
