"""API errors: one exception, one JSON shape, one status per code."""

from __future__ import annotations

from typing import Any

from aiohttp import web

# Every code a client can meet, with its HTTP status (README "Errors" lists them for users).
STATUS_BY_CODE: dict[str, int] = {
    "VALIDATION": 400,
    "UNAUTHENTICATED": 401,
    "FORBIDDEN": 403,
    "NOT_FOUND": 404,
    "METHOD_NOT_ALLOWED": 405,
    "CONFLICT": 409,
    "SCOPE_CANCELLED": 409,
    "DEADLINE_EXCEEDED": 409,
    "LEASE_LOST": 409,
    "KEY_CONFLICT": 409,
    "LIMIT_EXCEEDED": 409,
    "STALE_EPOCH": 409,
    "GROUP_CLOSED": 409,
    "BARRIER_CANCELLED": 409,
    "BARRIER_RELEASED": 409,
    "RESULT_TOO_LARGE": 413,
    "INTERNAL": 500,
    "UNAVAILABLE": 503,
}


class ApiError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = STATUS_BY_CODE.get(code, 500)

    def response(self) -> web.Response:
        return error_response(self.code, self.message)


def error_response(code: str, message: str) -> web.Response:
    return web.json_response(
        {"error": {"code": code, "message": message}}, status=STATUS_BY_CODE.get(code, 500)
    )


def raise_for_result(result: Any) -> Any:
    """A core result, or the ApiError it carries."""
    if isinstance(result, dict) and "error" in result:
        error = result["error"]
        raise ApiError(error["code"], error["message"])
    return result
