"""The aiohttp application: routes from the table, JSON errors, no 500 for bad input."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from aiohttp import web

from runstate_server.actors import limits

# Importing the route modules registers their routes in ROUTES.
from runstate_server.node.api import (  # noqa: F401
    access,
    barriers,
    claims,
    cluster,
    deliveries,
    groups,
    health,
    mailboxes,
    openapi,
    resources,
    runs,
    tasks,
    timers,
)
from runstate_server.node.api.auth import authenticate
from runstate_server.node.api.errors import ApiError, error_response
from runstate_server.node.api.routes import NODE_KEY, ROUTES, Handler

__all__ = ["ROUTES", "build_app"]

if TYPE_CHECKING:
    from runstate_server.node.server import Node

log = logging.getLogger(__name__)


@web.middleware
async def errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as error:
        return error.response()
    except web.HTTPException as error:
        if error.status == 404:
            return error_response("NOT_FOUND", f"no route {request.method} {request.path}")
        if error.status == 405:
            return error_response("METHOD_NOT_ALLOWED", f"{request.method} is not allowed on {request.path}")
        raise
    except Exception:
        log.exception("internal error in %s %s", request.method, request.path)
        return error_response("INTERNAL", "internal server error; the node's log has the details")


@web.middleware
async def route_to_leader(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Serve here if this node leads (or the route is node-local); else forward to the leader."""
    router = request.app[NODE_KEY].router
    if not router.serves_here(request):
        forwarded = await router.forward(request)
        if forwarded is not None:
            return forwarded
    return await handler(request)


def build_app(node: Node) -> web.Application:
    app = web.Application(middlewares=[errors_as_json, route_to_leader, authenticate], client_max_size=limits.body_bytes_max)
    app[NODE_KEY] = node
    for route in ROUTES:
        app.router.add_route(route.method, route.path, route.handler)
    return app
