"""GET /v1/openapi.json, generated from the route table."""

from __future__ import annotations

import json
import re
from typing import Any

from aiohttp import web

from runstate_server._version import __version__
from runstate_server.actors import limits
from runstate_server.node.api._request import IDEMPOTENCY_HEADER
from runstate_server.node.api.routes import PUBLIC, ROUTES_KEY, SPACE_ID, Route, RouteTable
from runstate_server.node.api.schemas import ERROR, STRING, obj
from runstate_server.node.errors import STATUS_BY_CODE

routes = RouteTable()

# The encoded document of each route table served (one per application; a few in a test process).
_ENCODED: dict[int, tuple[tuple[Route, ...], bytes]] = {}
_ENCODED_MAX = 16
_PARAM = re.compile(r"{(\w+)(?::[^}]+)?}")


def openapi_path(path: str) -> str:
    """An aiohttp route path in OpenAPI form: `{key:.+}` becomes `{key}`."""
    return _PARAM.sub(lambda match: "{" + match.group(1) + "}", path)


_ERROR = {"description": "error", "content": {"application/json": {"schema": ERROR}}}


_PATH_SCHEMAS = {"spaceId": {"type": "string", "pattern": SPACE_ID.pattern}}
_IDEMPOTENCY_KEY = {
    "name": IDEMPOTENCY_HEADER, "in": "header", "required": False,
    "description": "a retry with the same key and request is answered with the first answer, applied once",
    "schema": {"type": "string", "pattern": f"^[\\x21-\\x7e]{{1,{limits.idempotency_key_chars_max}}}$"},
}


def document(routes: tuple[Route, ...]) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for entry in routes:
        parameters: list[dict[str, Any]] = [
            {"name": name, "in": "path", "required": True,
             "schema": entry.path_schemas.get(name) or _PATH_SCHEMAS.get(name, {"type": "string"})}
            for name in _PARAM.findall(entry.path)
        ]
        parameters += [
            {"name": name, "in": "query", "required": name in entry.query_required, "schema": schema}
            for name, schema in entry.query.items()
        ]
        if entry.method != "GET":
            parameters.append(_IDEMPOTENCY_KEY)
        operation: dict[str, Any] = {
            "operationId": entry.handler.__name__,
            "summary": entry.summary,
            "parameters": parameters,
            "responses": {str(entry.ok): _success(entry)},
        }
        if entry.ok == 201:  # created now; 200 when it existed already (a declare, a keyed submit, a replay)
            operation["responses"]["200"] = _success(entry)
        if entry.empty:
            operation["responses"]["204"] = {"description": "nothing now"}
        if entry.body is not None:
            body_schema: dict[str, Any] = {"type": "object", "properties": entry.body, "additionalProperties": False}
            if entry.required:
                body_schema["required"] = list(entry.required)
            if entry.dependent:
                body_schema["dependentRequired"] = {name: list(needs) for name, needs in entry.dependent.items()}
            if entry.one_of:
                body_schema["oneOf"] = [{"required": list(group)} for group in entry.one_of]
            operation["requestBody"] = {
                "required": bool(entry.required or entry.one_of),
                "content": {"application/json": {"schema": body_schema}},
            }
        # Which key the route needs: none (public), any valid one, or one with this permission.
        operation["x-runstate-permission"] = entry.permission
        if entry.permission == PUBLIC:
            operation["security"] = []
        else:
            for code in ("UNAUTHENTICATED", "FORBIDDEN"):
                operation["responses"].setdefault(str(STATUS_BY_CODE[code]), _ERROR)
        # Every route may meet a malformed space id in its path, and a node without a leader (or
        # with every connection busy); a body not sent as JSON (415); on a node without auth, a
        # request from another origin (403); a request too slow to arrive (408). A route with a
        # parameter in its path may answer 404 (an id or key it does not know, or a value no route
        # pattern takes). A mutation may meet a reused idempotency key (409), or a malformed one (400).
        shared = [
            *(["VALIDATION_FAILED"] if "{spaceId}" in entry.path else []), "UNAVAILABLE",
            "UNSUPPORTED_MEDIA_TYPE", "FORBIDDEN_ORIGIN", "REQUEST_TIMEOUT",
            *(["NOT_FOUND"] if "{" in entry.path else []),
        ]
        if entry.method != "GET":
            shared += ["VALIDATION_FAILED", "IDEMPOTENCY_CONFLICT"]
        for code in (*entry.errors, *shared):
            operation["responses"].setdefault(str(STATUS_BY_CODE[code]), _ERROR)
        paths.setdefault(openapi_path(entry.path), {})[entry.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "runstate", "version": __version__},
        "paths": paths,
        # A node started without auth (`runstate dev`) ignores the key.
        "components": {"securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer"}}},
        "security": [{"apiKey": []}],
    }


def _success(entry: Route) -> dict[str, Any]:
    if entry.answer is None:
        return {"description": "success, no body"}
    return {"description": "success", "content": {entry.media_type: {"schema": entry.answer}}}


@routes("GET", "/v1/openapi.json", "This OpenAPI document", permission=PUBLIC, answer=obj({"openapi": STRING, "paths": {"type": "object"}}),)
async def openapi_json(request: web.Request) -> web.Response:
    # Built once per application: it is the same for every caller, and building it anew for each
    # request (about 0.5 MB) cost every anonymous caller that much memory churn.
    table = request.app[ROUTES_KEY]
    cached = _ENCODED.get(id(table))
    if cached is None or cached[0] is not table:
        if len(_ENCODED) >= _ENCODED_MAX:
            _ENCODED.clear()
        cached = _ENCODED[id(table)] = (table, json.dumps(document(table)).encode())
    return web.Response(body=cached[1], content_type="application/json")
