"""The aiohttp application: routes from the table, JSON errors, no 500 for bad input."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from aiohttp import web

from runstate_server.actors import limits
from runstate_server.node.api import (
    access,
    allowances,
    backup,
    barriers,
    budgets,
    claims,
    cluster,
    console,
    events,
    groups,
    health,
    mailboxes,
    messages,
    metrics,
    once,
    openapi,
    ops,
    permits,
    runs,
    tasks,
    timers,
    work_limits,
)
from runstate_server.node.api._request import idempotency_key
from runstate_server.node.api.auth import authenticate
from runstate_server.node.api.guard import guard
from runstate_server.node.api.routes import NODE_KEY, ROUTE_BY_HANDLER_KEY, ROUTES_KEY, Handler, Route
from runstate_server.node.errors import (
    REQUEST_ID,
    REQUEST_ID_HEADER,
    REQUEST_ID_KEY,
    ApiError,
    error_response,
    new_request_id,
)
from runstate_server.node.http_server import client_gone
from runstate_server.node.metrics import UNMATCHED_ROUTE
from runstate_server.node.routing import forwarded

__all__ = ["ROUTES", "build_app"]

# Every route of the API, from the tables the modules export: the operator routes (outside any
# space), then those of a space's objects (under SPACE_PREFIX).
ROUTES: tuple[Route, ...] = tuple(
    route
    for module in (
        health, cluster, backup, openapi, access,
        runs, mailboxes, messages, tasks, once, claims, groups, barriers, timers, permits,
        work_limits, budgets, ops, allowances, events, metrics,
    )
    for route in module.routes
)

if TYPE_CHECKING:
    from runstate_server.node.server import Node

log = logging.getLogger(__name__)


@web.middleware
async def count_requests(request: web.Request, handler: Handler) -> web.StreamResponse:
    """GET /metrics' runstate_http_requests_total: by the route's path template, never the raw
    path (ids would make a series per request), and the status answered ("aborted": none was)."""
    status = "aborted"
    try:
        response = await handler(request)
        status = str(response.status)
        return response
    except web.HTTPException as error:
        status = str(error.status)
        raise
    finally:
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None and request.match_info.http_exception is None else UNMATCHED_ROUTE
        request.app[NODE_KEY].metrics.count_request(request.method, route, status)


@web.middleware
async def errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every answer carries a request id (X-Request-Id; in an error envelope, `requestId`). A
    forwarded request keeps the id the first node gave it, so both nodes' logs name one id."""
    request_id = request.headers.get(REQUEST_ID_HEADER, "") if forwarded(request) else ""
    request_id = request_id if REQUEST_ID.fullmatch(request_id) else new_request_id()
    request[REQUEST_ID_KEY] = request_id
    try:
        response = await handler(request)
    except ApiError as error:
        return error.response(request_id)
    except web.HTTPException as error:
        if error.status == 404:
            return error_response("NOT_FOUND", f"no route {request.method} {request.path}", request_id)
        if isinstance(error, web.HTTPMethodNotAllowed):
            # RFC 9110 section 15.5.6: a 405 names the methods the path serves.
            allowed = ", ".join(sorted(error.allowed_methods))
            answer = error_response(
                "METHOD_NOT_ALLOWED", f"{request.method} is not allowed on {request.path} (it takes {allowed})", request_id
            )
            answer.headers["Allow"] = allowed
            return answer
        raise
    except Exception as error:
        if client_gone(request, error):  # e.g. it closed mid-body: nobody to answer, nothing wrong here
            log.debug("client went away during %s %s (request %s): %r", request.method, request.path, request_id, error)
            raise
        log.exception("internal error in %s %s (request %s)", request.method, request.path, request_id)
        return error_response("INTERNAL", "internal server error; the node's log has the details", request_id)
    if not response.prepared:
        response.headers.setdefault(REQUEST_ID_HEADER, request_id)
    return response


# What a node removed from its cluster still answers (its health says it was removed).
REMOVED_STILL_ANSWERS = frozenset({"/v1/health", "/metrics"})
# What a node whose state diverged still answers: its health, its metrics, and the operator's cluster
# routes (the view, the digest, handing leadership over, removing it: README, "Replica checks").
DIVERGED_STILL_ANSWERS = REMOVED_STILL_ANSWERS
DIVERGED_STILL_ANSWERS_PREFIX = "/v1/cluster"


@web.middleware
async def route_to_leader(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Serve here if this node leads (or the route is node-local); else forward to the leader."""
    node = request.app[NODE_KEY]
    if node.removed is not None and request.path not in REMOVED_STILL_ANSWERS:
        raise ApiError("REMOVED", node.removed)
    if node.replicas.diverged is not None and not (
        request.path in DIVERGED_STILL_ANSWERS or request.path.startswith(DIVERGED_STILL_ANSWERS_PREFIX)
    ):
        node.replicas.refuse_if_diverged()
    router = node.router
    if not router.serves_here(request):
        forwarded = await router.forward(request)
        if forwarded is not None:
            return forwarded
    return await handler(request)


@web.middleware
async def idempotency_keys(request: web.Request, handler: Handler) -> web.StreamResponse:
    """One rule for every mutation's Idempotency-Key: one outside the documented pattern is
    VALIDATION_FAILED whether or not the route writes (POST /v1/keys, a revoke, a receive that finds
    nothing), not only where a command is proposed. A GET takes no key; a path no route serves is
    answered 404 or 405 as it would be without one."""
    if request.method != "GET" and request.match_info.http_exception is None:
        idempotency_key(request)
    return await handler(request)


def build_app(node: Node) -> web.Application:
    app = web.Application(
        middlewares=[count_requests, errors_as_json, guard, route_to_leader, authenticate, idempotency_keys],
        client_max_size=limits.body_bytes_max,
    )
    app[NODE_KEY] = node
    app[ROUTES_KEY] = ROUTES
    # The console's pages are served too, but are not API: outside ROUTES (the OpenAPI document).
    app[console.CONSOLE_FILES_KEY] = console.load_files()
    app[ROUTE_BY_HANDLER_KEY] = {route.handler: route for route in (*ROUTES, *console.CONSOLE_ROUTES)}
    for route in (*ROUTES, *console.CONSOLE_ROUTES):
        app.router.add_route(route.method, route.path, route.handler)
    return app
