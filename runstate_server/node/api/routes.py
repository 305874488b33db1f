"""Route tables: each handler declares its method, path and contract once, in the table of its
module (`routes = RouteTable()`); app.py builds the application from the tables the modules
export, and the OpenAPI document is generated from the same list, so the two cannot drift."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from runstate_server.actors import limits
from runstate_server.node.api.schemas import ANY_JSON, INTEGER, STRING, TIME  # noqa: F401 - re-exported
from runstate_server.node.caller import Caller
from runstate_server.node.errors import ApiError

if TYPE_CHECKING:
    from runstate_server.node.server import Node

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

NODE_KEY: web.AppKey[Node] = web.AppKey("node")

HOLDER_HEADER = "X-Runstate-Holder"
# Every route of a space's objects is under this prefix; the space comes from the path.
SPACE_PREFIX = "/v1/spaces/{spaceId}"
SPACE_ID = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")

# What a route needs from the caller's API key (runstate_server.actors.access.PERMISSIONS), or:
PUBLIC = "public"  # nothing: no key is read (health, the OpenAPI document)
ANY_KEY = "any"  # a valid key, whatever its permissions (whoami, the cluster view)
ADMIN = "admin"  # manage the space's keys (an operator admin: every space)
# create or change mailboxes, barriers (POST /barriers, nextEpoch), pools, limits, budgets
RESOURCE_CONFIG = "resource_config"
# submit, receive, complete, claim, accept, arrive, cancel, declare a named barrier or timer, arm a
# timer, ack one or wait on it (the wait acknowledges), ...
WRITE = "coordination_write"
READ = "coordination_read"  # status, result, wait (a wait that changes nothing)


CALLER_KEY: web.RequestKey[Caller] = web.RequestKey("caller", Caller)


@dataclass(frozen=True, slots=True)
class Route:
    method: str
    path: str
    handler: Handler
    summary: str
    permission: str  # PUBLIC, ANY_KEY or one of the key permissions
    body: dict[str, Any] | None = None  # JSON schema properties of the request body
    query: dict[str, Any] = field(default_factory=dict)  # query parameters: schema
    ok: int = 200
    errors: tuple[str, ...] = ()
    # The JSON schema of the success answer (schemas.py); None: the route answers no body (204).
    answer: dict[str, Any] | None = None
    # The route may also answer 204 No Content ("nothing now", e.g. a receive that found nothing).
    empty: bool = False
    media_type: str = "application/json"  # of the success answer (GET /metrics answers text)
    # The body fields the route refuses to go without (the OpenAPI schema's `required`).
    required: tuple[str, ...] = ()
    # Body fields that need others beside them (the schema's `dependentRequired`): {"scale": ("limitMinor",)}.
    dependent: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Alternatives of which the body holds exactly one (the schema's `oneOf` of `required`):
    # (("at",), ("afterSeconds",)).
    one_of: tuple[tuple[str, ...], ...] = ()
    # The query parameters the route refuses to go without (each one's `required` in the document).
    query_required: tuple[str, ...] = ()
    # Path parameters narrower than any string, by name: {"name": text(...)} for a by-name path.
    path_schemas: dict[str, Any] = field(default_factory=dict)


class RouteTable:
    """The routes of one API module, in declaration order. `@routes(method, path, ...)` adds the
    handler it decorates to this table only; nothing global changes when a module is imported."""

    def __init__(self) -> None:
        self.routes: list[Route] = []

    def __call__(
        self,
        method: str,
        path: str,
        summary: str,
        *,
        permission: str,
        body: dict[str, Any] | None = None,
        query: dict[str, Any] | None = None,
        ok: int = 200,
        errors: tuple[str, ...] = (),
        answer: dict[str, Any] | None = None,
        empty: bool = False,
        media_type: str = "application/json",
        required: tuple[str, ...] = (),
        dependent: dict[str, tuple[str, ...]] | None = None,
        one_of: tuple[tuple[str, ...], ...] = (),
        query_required: tuple[str, ...] = (),
        path_schemas: dict[str, Any] | None = None,
    ) -> Callable[[Handler], Handler]:
        assert set(required) <= set(body or {}), f"{method} {path}: a required field the body does not take"
        assert {name for group in one_of for name in group} <= set(body or {}), f"{method} {path}: one_of names a field the body does not take"
        assert set(query_required) <= set(query or {}), f"{method} {path}: a required query parameter the route does not take"
        assert all("{" + name in path for name in path_schemas or {}), f"{method} {path}: a schema for a parameter not in the path"

        def add(handler: Handler) -> Handler:
            self.routes.append(
                Route(
                    method, path, handler, summary, permission, body, query or {}, ok, errors, answer, empty, media_type,
                    required, dependent or {}, one_of, query_required, path_schemas or {},
                )
            )
            return handler

        return add

    def __iter__(self) -> Iterator[Route]:
        return iter(self.routes)


# The application's routes (app.build_app) and the same by handler (auth.route_of).
ROUTES_KEY: web.AppKey[tuple[Route, ...]] = web.AppKey("routes", tuple)
ROUTE_BY_HANDLER_KEY: web.AppKey[dict[Handler, Route]] = web.AppKey("routes_by_handler", dict)


def node_of(request: web.Request) -> Node:
    return request.app[NODE_KEY]


def caller_of(request: web.Request) -> Caller:
    """The caller the auth middleware recorded (every non-public route has one)."""
    return request[CALLER_KEY]


def require_permission(caller: Caller, permission: str) -> None:
    """For a route whose permission depends on its body (a by-name look-up needs only read, a
    declaration resource_config): FORBIDDEN unless the caller's key has `permission`."""
    if permission not in caller.permissions:
        raise ApiError(
            "FORBIDDEN", f"this call needs the {permission} permission; the key has {', '.join(sorted(caller.permissions))}"
        )


def space_of(request: web.Request) -> str:
    return request[CALLER_KEY].space


def holder_of(request: web.Request, body: dict[str, Any]) -> str | None:
    holder = body.get("holder") or request.headers.get(HOLDER_HEADER)
    if holder is None:
        return None
    # A header's bytes that are not UTF-8 reach here as lone surrogates, which cannot be stored.
    if not isinstance(holder, str) or len(holder) > limits.name_chars_max or not is_unicode(holder):
        raise ApiError("VALIDATION_FAILED", f"holder must be a string of at most {limits.name_chars_max} characters (valid Unicode)")
    return holder


def is_unicode(text: str) -> bool:
    """The text encodes as UTF-8: no lone surrogate (from a JSON escape such as `"\\ud800"`, or
    from a header's bytes that are not UTF-8, which aiohttp keeps as surrogates)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


# Schema fragments of request fields, as the route modules have named them (schemas.py has all).
ISO_TIME = TIME
