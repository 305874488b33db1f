"""Spaces and API keys: who am I, create and list spaces, create, list and revoke keys.

A key's secret is made here (on the leader), returned once by the create call, and only its
SHA-256 goes into the log. An admin key of the operator space (the one bootstrap created) manages
every space; an admin key of another space manages its own space's keys only.

A node without auth creates no key (409 AUTH_DISABLED): anyone on the machine may call it, and
a key made there would be valid once the node restarts with --auth. Start it with --auth and use
the bootstrap admin key instead. Listing and revoking keys stay open (a revoke only takes away).
"""

from __future__ import annotations

import secrets
from typing import Any

from aiohttp import web

from runstate_server.actors import access, limits
from runstate_server.node._json import json_response
from runstate_server.node.api import _request as req
from runstate_server.node.api.routes import (
    ADMIN,
    ANY_KEY,
    SPACE_ID,
    Caller,
    RouteTable,
    caller_of,
    node_of,
)
from runstate_server.node.api.schemas import (
    BOOLEAN,
    NAME,
    STRING,
    STRING_OR_NULL,
    TIME,
    TIME_OR_NULL,
    array,
    obj,
)
from runstate_server.node.api.views import iso
from runstate_server.node.errors import ApiError
from runstate_server.node.keys import key_hash, new_key_id, new_key_secret

SPACE = obj({"id": STRING, "name": STRING_OR_NULL, "createdAt": TIME})
KEY = obj({
    "id": STRING, "space": STRING, "name": STRING_OR_NULL, "permissions": array(STRING), "createdAt": TIME,
    "revokedAt": TIME_OR_NULL, "createdBy": STRING_OR_NULL,
})

routes = RouteTable()

ID_HEX_CHARS = 20
_PERMISSIONS_SCHEMA = {"type": "array", "minItems": 1, "items": {"type": "string", "enum": list(access.PERMISSIONS)}}
_SPACE_ID = {"type": "string", "pattern": SPACE_ID.pattern}


def key_view(view: dict[str, Any]) -> dict[str, Any]:
    """The core's key view with ISO times."""
    return {**view, "createdAt": iso(view["createdAt"]), "revokedAt": iso(view["revokedAt"])}


def space_view(view: dict[str, Any]) -> dict[str, Any]:
    return {**view, "createdAt": iso(view["createdAt"])}


@routes(
    "GET", "/v1/whoami", "The calling key: its id, space and permissions (works with any valid key)",
    errors=("UNAUTHENTICATED",), permission=ANY_KEY, answer=obj({"auth": BOOLEAN, "keyId": STRING_OR_NULL, "space": STRING, "permissions": array(STRING), "operator": BOOLEAN}),
)
async def whoami(request: web.Request) -> web.Response:
    caller = caller_of(request)
    return json_response({
        "auth": node_of(request).config.auth,
        "keyId": caller.key_id,
        "space": caller.space,
        "permissions": [permission for permission in access.PERMISSIONS if permission in caller.permissions],
        "operator": caller.operator,
    })


def require_operator(caller: Caller, what: str) -> None:
    """FORBIDDEN unless `caller` holds an admin key of the operator space (operator routes)."""
    if not caller.operator:
        raise ApiError("FORBIDDEN", f"{what} needs an admin key of the operator space")


@routes(
    "POST", "/v1/spaces", "Create a space (an operator admin key)",
    body={"id": _SPACE_ID, "name": NAME}, ok=201, errors=("VALIDATION_FAILED", "FORBIDDEN", "CONFLICT", "LIMIT_EXCEEDED"),
    permission=ADMIN, answer=SPACE,
)
async def create_space(request: web.Request) -> web.Response:
    caller = caller_of(request)
    require_operator(caller, "creating a space")
    body = await req.json_body(request, required=False)
    space_id = req.text(body, "id", max_chars=limits.name_chars_max)
    if space_id is not None and not SPACE_ID.match(space_id):
        raise ApiError("VALIDATION_FAILED", "id must be 1 to 128 letters, digits, '_', '.' or '-'")
    args = {
        "space_id": space_id or "spc_" + secrets.token_hex(ID_HEX_CHARS // 2),
        "name": req.text(body, "name", max_chars=limits.name_chars_max),
    }
    # Under the request's Idempotency-Key: a resent creation answers the space it made first.
    result = await req.propose(request, "space.create", args)
    return json_response(space_view(result), status=201)


@routes("GET", "/v1/spaces", "The spaces this key sees (an operator admin: all)", permission=ADMIN, answer=obj({"spaces": array(SPACE)}),)
async def list_spaces(request: web.Request) -> web.Response:
    node, caller = node_of(request), caller_of(request)
    await node.confirm_leadership(caller)
    with node.read() as state:
        views = access.list_spaces(state, None if caller.operator else [caller.space])
    return json_response({"spaces": [space_view(view) for view in views]})


def _target_space(caller: Caller, space_id: str | None) -> str:
    if space_id is None or space_id == caller.space:
        return caller.space
    if not SPACE_ID.match(space_id):
        raise ApiError("VALIDATION_FAILED", "space must be 1 to 128 letters, digits, '_', '.' or '-'")
    require_operator(caller, "managing another space's keys")
    return space_id


def _permissions(body: dict[str, Any]) -> list[str]:
    permissions = body.get("permissions")
    if (
        not isinstance(permissions, list)
        or not permissions
        or not all(isinstance(permission, str) and permission in access.PERMISSIONS for permission in permissions)
    ):
        raise ApiError("VALIDATION_FAILED", f"permissions must be a non-empty list of {', '.join(access.PERMISSIONS)}")
    return [permission for permission in access.PERMISSIONS if permission in permissions]


@routes(
    "POST", "/v1/keys", "Create an API key; its secret is in this answer only",
    body={"space": _SPACE_ID, "name": NAME, "permissions": _PERMISSIONS_SCHEMA}, required=("permissions",), ok=201,
    errors=("VALIDATION_FAILED", "FORBIDDEN", "NOT_FOUND", "CONFLICT", "AUTH_DISABLED", "LIMIT_EXCEEDED"),
    permission=ADMIN, answer=obj({**KEY["properties"], "key": STRING}),
)
async def create_key(request: web.Request) -> web.Response:
    caller = caller_of(request)
    if not node_of(request).config.auth:
        raise ApiError(
            "AUTH_DISABLED",
            "this node runs without auth, so it creates no API keys (one made here would be valid once the "
            "node restarts with --auth); start it with --auth and create keys with its bootstrap admin key",
        )
    body = await req.json_body(request)
    space_id = _target_space(caller, req.text(body, "space", max_chars=limits.name_chars_max))
    permissions = _permissions(body)
    secret = new_key_secret()
    args = {
        "space_id": space_id,
        "key_id": new_key_id(),
        "key_hash": key_hash(secret),
        "name": req.text(body, "name", max_chars=limits.name_chars_max),
        "permissions": permissions,
    }
    result = await node_of(request).propose(caller, "key.create", args)
    return json_response({**key_view(result), "key": secret}, status=201)


@routes(
    "GET", "/v1/keys", "The keys of a space (no secrets)",
    query={"space": _SPACE_ID}, errors=("VALIDATION_FAILED", "FORBIDDEN", "NOT_FOUND"), permission=ADMIN, answer=obj({"keys": array(KEY)}),
)
async def list_keys(request: web.Request) -> web.Response:
    node, caller = node_of(request), caller_of(request)
    space_id = _target_space(caller, request.query.get("space"))
    await node.confirm_leadership(caller)
    with node.read() as state:
        if space_id not in state.spaces and space_id != caller.space:
            raise ApiError("NOT_FOUND", f"space {space_id!r} not found")
        views = access.list_keys(state, space_id)
    return json_response({"keys": [key_view(view) for view in views]})


@routes(
    "POST", "/v1/keys/{id}/revoke", "Revoke an API key, at once on every node",
    errors=("NOT_FOUND",), permission=ADMIN, answer=KEY,
)
async def revoke_key(request: web.Request) -> web.Response:
    caller = caller_of(request)
    await req.json_body(request, required=False)
    result = await node_of(request).propose(caller, "key.revoke", {"key_id": request.match_info["id"]})
    return json_response(key_view(result))
