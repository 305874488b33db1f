"""API errors: one exception, one JSON shape (`{"error": {"code", "message", "requestId"}}`), one
status per code, and `Retry-After` (seconds) on the answers that say "busy, try again"."""

from __future__ import annotations

import math
import re
import secrets
from typing import Any

from aiohttp import web

from runstate_server.node._json import json_response

REQUEST_ID_HEADER = "X-Request-Id"
REQUEST_ID_KEY: web.RequestKey[str] = web.RequestKey("request_id", str)
REQUEST_ID_HEX_CHARS = 24
# What new_request_id makes; a forwarded request's id is kept only if it looks like one.
REQUEST_ID = re.compile(r"req_[0-9a-f]{%d}" % REQUEST_ID_HEX_CHARS)  # noqa: UP031

# Every code a client can meet, with its HTTP status (docs/errors.md lists them for users).
STATUS_BY_CODE: dict[str, int] = {
    "VALIDATION_FAILED": 400,
    "UNAUTHENTICATED": 401,
    "FORBIDDEN": 403,
    # A node without auth refuses a request from a web page of another origin (Origin, or a Host
    # that is not this machine's: DNS rebinding); node/api/guard.py.
    "FORBIDDEN_ORIGIN": 403,
    "NOT_FOUND": 404,
    "METHOD_NOT_ALLOWED": 405,
    "REQUEST_TIMEOUT": 408,  # a request's headers or body did not arrive in time (node/http_server.py)
    "CONFLICT": 409,
    # A node without auth creates no API keys (one would be valid once it restarts with --auth).
    "AUTH_DISABLED": 409,
    "IDEMPOTENCY_CONFLICT": 409,
    "CLAIM_HELD": 409,
    "BACKLOG_FULL": 409,
    "CAPACITY_UNAVAILABLE": 409,  # a permit has not the units asked for free now (node/api/permits.py)
    "INSUFFICIENT_BUDGET": 409,  # a budget has less left than a reserve or settle asks (node/api/budgets.py)
    "SCOPE_CANCELLED": 409,
    "DEADLINE_EXCEEDED": 409,
    "STALE_CLAIM": 409,
    "KEY_CONFLICT": 409,
    "LIMIT_EXCEEDED": 409,
    "STALE_EPOCH": 409,
    "BARRIER_CANCELLED": 409,
    "BARRIER_RELEASED": 409,
    # A request body that is not sent as JSON (Content-Type: application/json); node/api/guard.py.
    # A cursor of GET /events or /watch older than what the space's log keeps (node/api/events.py).
    "CURSOR_EXPIRED": 410,
    "UNSUPPORTED_MEDIA_TYPE": 415,
    # A task naming a work limit that holds its maxOutstanding unfinished tasks (node/api/work_limits.py).
    "CONCURRENCY_LIMITED": 429,
    # An allowance has not the units now (or waiters are in line first), or cools down; with
    # Retry-After: node/api/allowances.py.
    "ALLOWANCE_EXHAUSTED": 429,
    "ALLOWANCE_COOLDOWN": 429,
    "INTERNAL": 500,
    "UNAVAILABLE": 503,
    "REMOVED": 503,  # this node was removed from its cluster (node/members.py): it serves nothing more
    # A replica check found this node's state differs from the majority's (node/replicas.py).
    "REPLICA_DIVERGED": 503,
}


# Codes that mean "busy now, the same call may succeed later": answered with Retry-After.
RETRY_AFTER_S_DEFAULT = 1.0
RETRYABLE_CODES = frozenset({
    "CLAIM_HELD", "BACKLOG_FULL", "CAPACITY_UNAVAILABLE", "UNAVAILABLE", "CONCURRENCY_LIMITED",
    "ALLOWANCE_EXHAUSTED", "ALLOWANCE_COOLDOWN",  # the core names when (retryAfterMs)
})


def new_request_id() -> str:
    return "req_" + secrets.token_hex(REQUEST_ID_HEX_CHARS // 2)


class ApiError(Exception):
    def __init__(self, code: str, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = STATUS_BY_CODE.get(code, 500)
        if retry_after_s is None and code in RETRYABLE_CODES:
            retry_after_s = RETRY_AFTER_S_DEFAULT
        self.retry_after_s = retry_after_s

    def response(self, request_id: str) -> web.Response:
        return error_response(self.code, self.message, request_id, retry_after_s=self.retry_after_s)


def error_response(code: str, message: str, request_id: str, *, retry_after_s: float | None = None) -> web.Response:
    headers = {REQUEST_ID_HEADER: request_id}
    if retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(retry_after_s)))  # whole seconds, at least 1
    return json_response(
        {"error": {"code": code, "message": message, "requestId": request_id}},
        status=STATUS_BY_CODE.get(code, 500),
        headers=headers,
    )


def raise_for_result(result: Any) -> Any:
    """A core result, or the ApiError it carries (a core error may name `retryAfterMs`)."""
    if isinstance(result, dict) and "error" in result:
        error = result["error"]
        retry_after_ms = error.get("retryAfterMs")
        raise ApiError(
            error["code"], error["message"], retry_after_s=None if retry_after_ms is None else retry_after_ms / 1000
        )
    return result
