"""Who is calling, checked in one place every request passes.

Every route declares the permission it needs (routes.py). This middleware turns the request's
`Authorization: Bearer <key>` header and the space of the path (`/v1/spaces/{spaceId}/...`) into a
`Caller`, or answers 401
UNAUTHENTICATED (no key, unknown or revoked key) or 403 FORBIDDEN (a key of another space than the
path names, or without the route's permission). Ids of another space are NOT_FOUND further
down, in the handlers and again in the core, so ids leak nothing.

The key is checked where the request is served (this middleware runs after route_to_leader): a
follower forwards a request to the leader unchecked (its copy of the keys may lag a create or a
revoke), and the leader checks it against its state. Every command then carries the key id, and
the core refuses it if an earlier log entry revoked the key, so a revoke holds in log order for
writes and for reads (a read commits no entry: once the node confirmed it may answer, with a read
index on a cluster, it checks the key against its state at the read with the same check and error,
and that state holds every revoke acknowledged before the read: Node.confirm_leadership). Node-local
routes (the cluster view) are checked against the local copy.

Without auth (`runstate dev` without --auth, loopback only) there is no key: the caller has every
permission in the space the path names, or the default space. The space the path names must exist
(the default space always does; `runstate spaces create` makes others): an unknown one is
404 NOT_FOUND naming it, so a typo in RUNSTATE_SPACE_ID fails at the first call instead of writing
into a new, empty space. Checked here against the node's state, which holds at apply time too:
a space is never deleted, and such a node is alone (a cluster node always has auth).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from runstate_server.actors import access
from runstate_server.node.api.routes import (
    ANY_KEY,
    CALLER_KEY,
    NODE_KEY,
    PUBLIC,
    ROUTE_BY_HANDLER_KEY,
    SPACE_ID,
    Caller,
    Handler,
    Route,
    is_unicode,
)
from runstate_server.node.errors import ApiError
from runstate_server.node.keys import key_hash

if TYPE_CHECKING:
    from runstate_server.node.server import Node

BEARER_PREFIX = "bearer "
API_KEY_CHARS_MAX = 512  # longer Authorization values are refused before they are hashed
ALL_PERMISSIONS = frozenset(access.PERMISSIONS)

def route_of(request: web.Request) -> Route | None:
    """The table entry of the matched route; None when nothing matched (aiohttp's 404 and 405)."""
    if request.match_info.http_exception is not None:
        return None
    route = request.app[ROUTE_BY_HANDLER_KEY].get(request.match_info.handler)
    # Fail closed: a handler outside the table would otherwise be served without a check.
    assert route is not None, f"{request.method} {request.path} matched a handler outside the route table"
    return route


@web.middleware
async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
    route = route_of(request)
    if route is not None and route.permission != PUBLIC:
        request[CALLER_KEY] = _caller(request, route)
    return await handler(request)


def _caller(request: web.Request, route: Route) -> Caller:
    node = request.app[NODE_KEY]
    path_space = request.match_info.get("spaceId")
    if path_space is not None and not SPACE_ID.match(path_space):
        raise ApiError("VALIDATION_FAILED", "the space id in the path must be 1 to 128 letters, digits, '_', '.' or '-'")
    if not node.config.auth:
        space = path_space or node.config.default_space
        if space != node.config.default_space:
            _require_space(node, space)
        return Caller(space, None, ALL_PERMISSIONS, operator=True)
    secret = _bearer(request)
    with node.read() as state:
        if state.operator_space is None:
            # A fresh cluster's leader is still committing the first admin key: no key can be
            # valid yet, and saying so (401) would be wrong a moment later.
            raise ApiError("UNAVAILABLE", "the first admin key is still being created; retry")
        key = access.authenticate(state, key_hash(secret))
        if key is None:
            raise ApiError("UNAUTHENTICATED", "the API key is not valid (unknown or revoked)")
        operator = access.is_operator_admin(state, key)
    if path_space is not None and path_space != key.space:
        raise ApiError("FORBIDDEN", f"this API key belongs to another space than {path_space!r}")
    if route.permission != ANY_KEY and route.permission not in key.permissions:
        raise ApiError(
            "FORBIDDEN",
            f"this call needs the {route.permission} permission; the key has {', '.join(key.permissions)}",
        )
    return Caller(key.space, key.id, frozenset(key.permissions), operator)


def _require_space(node: Node, space_id: str) -> None:
    with node.read() as state:
        if space_id in state.spaces:
            return
    raise ApiError(
        "NOT_FOUND",
        f"space {space_id!r} not found: create it first (runstate spaces create --id {space_id}), "
        f"or use the default space, {node.config.default_space!r}",
    )


def _bearer(request: web.Request) -> str:
    header = request.headers.get("Authorization", "")
    if not header.lower().startswith(BEARER_PREFIX):
        raise ApiError("UNAUTHENTICATED", "send an API key: Authorization: Bearer <key>")
    secret = header[len(BEARER_PREFIX):].strip()
    # A header of bytes that are not UTF-8 (kept as surrogates) cannot be a key, nor be hashed.
    if not secret or len(secret) > API_KEY_CHARS_MAX or not is_unicode(secret):
        raise ApiError("UNAUTHENTICATED", "the API key is not valid (unknown or revoked)")
    return secret
