"""The route table: each handler declares its method, path and contract once; the app registers
routes from this table and the OpenAPI document is generated from it, so the two cannot drift."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from runstate.actors import limits
from runstate.node.api.errors import ApiError

if TYPE_CHECKING:
    from runstate.node.server import Node

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

NODE_KEY: web.AppKey[Node] = web.AppKey("node")

SPACE_HEADER = "X-Runstate-Space"
HOLDER_HEADER = "X-Runstate-Holder"
_SPACE_ID = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")


@dataclass(frozen=True, slots=True)
class Route:
    method: str
    path: str
    handler: Handler
    summary: str
    body: dict[str, Any] | None = None  # JSON schema properties of the request body
    query: dict[str, Any] = field(default_factory=dict)  # query parameters: schema
    ok: int = 200
    errors: tuple[str, ...] = ()


ROUTES: list[Route] = []


def route(
    method: str,
    path: str,
    summary: str,
    *,
    body: dict[str, Any] | None = None,
    query: dict[str, Any] | None = None,
    ok: int = 200,
    errors: tuple[str, ...] = (),
) -> Callable[[Handler], Handler]:
    def register(handler: Handler) -> Handler:
        ROUTES.append(Route(method, path, handler, summary, body, query or {}, ok, errors))
        return handler

    return register


def node_of(request: web.Request) -> Node:
    return request.app[NODE_KEY]


def space_of(request: web.Request) -> str:
    space = request.headers.get(SPACE_HEADER)
    if space is None:
        return node_of(request).config.default_space
    if not _SPACE_ID.match(space):
        raise ApiError("VALIDATION", f"{SPACE_HEADER} must be 1 to 128 letters, digits, '_', '.' or '-'")
    return space


def holder_of(request: web.Request, body: dict[str, Any]) -> str | None:
    holder = body.get("holder") or request.headers.get(HOLDER_HEADER)
    if holder is None:
        return None
    if not isinstance(holder, str) or len(holder) > limits.name_chars_max:
        raise ApiError("VALIDATION", f"holder must be a string of at most {limits.name_chars_max} characters")
    return holder


# Reusable schema fragments for the OpenAPI document.
STRING = {"type": "string"}
INTEGER = {"type": "integer"}
ANY_JSON: dict[str, Any] = {}
ISO_TIME = {"type": "string", "format": "date-time"}
