"""Mailboxes (work queues) of a space."""

from __future__ import annotations

from aiohttp import web

from runstate_server.actors import limits
from runstate_server.node.api import _request as req
from runstate_server.node.api.routes import (
    READ,
    RESOURCE_CONFIG,
    SPACE_PREFIX,
    STRING,
    RouteTable,
    caller_of,
    node_of,
)
from runstate_server.node.errors import ApiError

routes = RouteTable()


@routes(
    "POST", SPACE_PREFIX + "/mailboxes", "Create a mailbox if it does not exist (idempotent)",
    body={"name": STRING, "mode": {"type": "string", "enum": ["WORK"]}},
    errors=("VALIDATION_FAILED", "CONFLICT", "LIMIT_EXCEEDED"), permission=RESOURCE_CONFIG,
)
async def ensure_mailbox(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    name = req.text(body, "name", max_chars=limits.name_chars_max, required=True)
    mode = req.text(body, "mode", max_chars=limits.name_chars_max) or "WORK"
    result = await node_of(request).propose(caller_of(request), "mailbox.ensure", {"name": name, "mode": mode})
    return web.json_response(result)


@routes("GET", SPACE_PREFIX + "/mailboxes/{name}", "A mailbox", errors=("NOT_FOUND",), permission=READ)
async def get_mailbox(request: web.Request) -> web.Response:
    node, caller, name = node_of(request), caller_of(request), request.match_info["name"]
    await node.confirm_leadership(caller)
    with node.read() as state:
        found = state.spaces.get(caller.space)
        mailbox = found.mailboxes.get(name) if found else None
        if mailbox is None:
            raise ApiError("NOT_FOUND", f"mailbox {name!r} not found")
        return web.json_response({"name": mailbox.name, "mode": mailbox.mode})
