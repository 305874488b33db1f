"""GET /v1/openapi.json, generated from the route table."""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web

from runstate_server._version import __version__
from runstate_server.node.api.errors import STATUS_BY_CODE
from runstate_server.node.api.routes import PUBLIC, ROUTES_KEY, Route, RouteTable

routes = RouteTable()

_PARAM = re.compile(r"{(\w+)(?::[^}]+)?}")


def openapi_path(path: str) -> str:
    """An aiohttp route path in OpenAPI form: `{key:.+}` becomes `{key}`."""
    return _PARAM.sub(lambda match: "{" + match.group(1) + "}", path)


_ERROR = {
    "description": "error",
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "properties": {
                    "error": {
                        "type": "object",
                        "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
                        "required": ["code", "message"],
                    }
                },
                "required": ["error"],
            }
        }
    },
}


def document(routes: tuple[Route, ...]) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for entry in routes:
        parameters: list[dict[str, Any]] = [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in _PARAM.findall(entry.path)
        ]
        parameters += [
            {"name": name, "in": "query", "required": False, "schema": schema} for name, schema in entry.query.items()
        ]
        operation: dict[str, Any] = {
            "operationId": entry.handler.__name__,
            "summary": entry.summary,
            "parameters": parameters,
            "responses": {str(entry.ok): {"description": "success", "content": {"application/json": {}}}},
        }
        if entry.body is not None:
            operation["requestBody"] = {
                "required": False,
                "content": {"application/json": {"schema": {"type": "object", "properties": entry.body}}},
            }
        # Which key the route needs: none (public), any valid one, or one with this permission.
        operation["x-runstate-permission"] = entry.permission
        if entry.permission == PUBLIC:
            operation["security"] = []
        else:
            for code in ("UNAUTHENTICATED", "FORBIDDEN"):
                operation["responses"].setdefault(str(STATUS_BY_CODE[code]), _ERROR)
        for code in entry.errors:
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


@routes("GET", "/v1/openapi.json", "This OpenAPI document", permission=PUBLIC)
async def openapi_json(request: web.Request) -> web.Response:
    return web.json_response(document(request.app[ROUTES_KEY]))
