"""Once (run-once work with one result per run and key). The default run is the named run `default` (runs.py).

Every answer of a write is rendered from the result its core command returned (actors/once.py),
never from a read of the state afterwards.
"""

from __future__ import annotations

import json
import time
from typing import Any

from aiohttp import web

from runstate_server.actors import limits, once, runs
from runstate_server.actors.context import once_key
from runstate_server.actors.state import Once, OnceState, json_bytes
from runstate_server.node._json import json_response, stored_value
from runstate_server.node.api import _request as req
from runstate_server.node.api._poll import WAIT_MS_QUERY, long_poll
from runstate_server.node.api.routes import (
    ANY_JSON,
    READ,
    SPACE_PREFIX,
    STRING,
    WRITE,
    RouteTable,
    caller_of,
    holder_of,
    node_of,
)
from runstate_server.node.api.schemas import (
    HOLDER,
    INTEGER,
    KEY,
    NAME,
    STRING_OR_NULL,
    TIME,
    TIME_OR_NULL,
    bounded,
    enum,
    obj,
)
from runstate_server.node.api.views import iso
from runstate_server.node.errors import ApiError

routes = RouteTable()

_INACTIVE = ("SCOPE_CANCELLED", "DEADLINE_EXCEEDED")
_MAX_ATTEMPTS = bounded(1, limits.attempts_max)
_ENTRY = {"scopeId": NAME, "key": KEY}  # which once entry a call is about
_LEASE = {**_ENTRY, "token": NAME}  # ... and the lease it presents
_ENTRY_REQUIRED = ("scopeId", "key")
_LEASE_REQUIRED = (*_ENTRY_REQUIRED, "token")
_STATE = enum(OnceState.OPEN, OnceState.HELD, OnceState.DONE, OnceState.FAILED)
_EFFECTIVE = enum("ACTIVE", "INACTIVE")
# What a once command answers (_render); `token` and `leaseExpiresAt` while the caller holds it.
_ANSWER = obj(
    {"state": enum(once.GRANTED, *_STATE["enum"]), "attempts": INTEGER, "scopeEffective": _EFFECTIVE},
    optional={"result": ANY_JSON, "lastError": STRING, "token": STRING, "leaseExpiresAt": TIME},
)
# What GET /once shows (once_view).
_VIEW = obj(
    {"key": STRING, "state": _STATE, "attempts": INTEGER, "holder": STRING_OR_NULL, "leaseExpiresAt": TIME_OR_NULL,
     "finishedBy": STRING_OR_NULL, "scopeEffective": _EFFECTIVE},
    optional={"result": ANY_JSON, "lastError": STRING},
)


def _entry_args(body: dict[str, Any]) -> dict[str, Any]:
    run_id = req.text(body, "scopeId", max_chars=limits.name_chars_max, required=True)
    key = req.text(body, "key", max_chars=limits.key_chars_max, required=True)
    return {"run_id": run_id, "key": key}


def _lease_args(body: dict[str, Any]) -> dict[str, Any]:
    return {**_entry_args(body), "token": req.text(body, "token", max_chars=limits.name_chars_max, required=True)}


def _render(result: dict[str, Any]) -> dict[str, Any]:
    """A once command's answer: `state`, `attempts` (failed attempts so far), `result` when DONE,
    `lastError` when an attempt failed, `token` and `leaseExpiresAt` while this caller holds it."""
    answer: dict[str, Any] = {"state": result["state"], "attempts": result["attempts"]}
    if result["state"] == OnceState.DONE:
        answer["result"] = stored_value(result["result"])
    if result["last_error"] is not None:
        answer["lastError"] = result["last_error"]
    if "token" in result:
        answer["token"] = result["token"]
    if "lease_expires_ms" in result:
        answer["leaseExpiresAt"] = iso(result["lease_expires_ms"])
    answer["scopeEffective"] = result["run_effective"]
    return answer


@routes(
    "POST", SPACE_PREFIX + "/once/acquire",
    "Acquire the once entry of (scopeId, key): GRANTED (with token and lease), HELD by another, DONE (with the "
    "result) or FAILED (with lastError)",
    required=_ENTRY_REQUIRED,
    body={**_ENTRY, "holder": HOLDER, "holderSession": NAME, "leaseSeconds": req.LEASE_SECONDS,
          "maxAttempts": _MAX_ATTEMPTS},
    errors=("VALIDATION_FAILED", "NOT_FOUND", "LIMIT_EXCEEDED", *_INACTIVE), permission=WRITE, answer=_ANSWER,
)
async def acquire(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    args = {
        **_entry_args(body),
        "lease_ms": req.lease_seconds_ms(body),
        "holder": holder_of(request, body),
        "holder_session": req.holder_session(body),
        "max_attempts": req.integer(body, "maxAttempts", minimum=1, maximum=limits.attempts_max),
    }
    return json_response(_render(await req.propose(request, "once.acquire", args)))


def once_view(entry: Once | None, key: str) -> dict[str, Any]:
    """The entry as GET /once shows it; an unknown key is OPEN with no attempts."""
    if entry is None:
        return {"key": key, "state": OnceState.OPEN, "attempts": 0, "holder": None, "leaseExpiresAt": None,
                "finishedBy": None}
    held = entry.state == OnceState.HELD
    view: dict[str, Any] = {
        "key": entry.key,
        "state": entry.state,
        "attempts": entry.failures,
        "holder": entry.holder if held else None,
        "leaseExpiresAt": iso(entry.lease_expires_ms) if held else None,
        "finishedBy": once.finisher(entry),
    }
    if entry.state == OnceState.DONE:
        view["result"] = _Kept(json_bytes(entry.result))
    if entry.error is not None:
        view["lastError"] = entry.error
    return view


class _Kept(bytes):
    """A kept payload (canonical JSON bytes) that goes into an answer as it is (_json_answer)."""


def _json_answer(view: dict[str, Any]) -> web.Response:
    """`view` as a JSON answer, its `result` spliced in as the kept bytes: not decoded and encoded
    again for each caller (a result is up to 64 KB, and one completion answers every long poll
    parked on its entry)."""
    result = view.get("result")
    if not isinstance(result, _Kept):
        return json_response(view)
    rest = json.dumps({name: value for name, value in view.items() if name != "result"})
    return web.Response(body=rest[:-1].encode() + b', "result": ' + result + b"}", content_type="application/json",
                        charset="utf-8")


_WAIT_QUERY = {**_ENTRY, **WAIT_MS_QUERY}


@routes(
    "GET", SPACE_PREFIX + "/once",
    "A once entry (OPEN, HELD, DONE or FAILED); long poll: answers once it is not HELD or its run stopped, or "
    "after waitMs",
    query=_WAIT_QUERY, query_required=_ENTRY_REQUIRED, errors=("NOT_FOUND", "VALIDATION_FAILED"), permission=READ,
    answer=_VIEW,
)
async def get(request: web.Request) -> web.Response:
    node, caller = node_of(request), caller_of(request)
    args = _entry_args(dict(request.query))
    run_id, key = args["run_id"], args["key"]

    def look() -> dict[str, Any]:
        with node.read() as state:
            run = state.runs.get(run_id)
            if run is None or run.space != caller.space:
                raise ApiError("NOT_FOUND", f"run {run_id!r} not found")
            view = once_view(state.once.get(run.once.get(key, "")), key)
            view["scopeEffective"] = runs.effective(state, run, int(time.time() * 1000))
            return view

    def happened(view: dict[str, Any]) -> bool:
        # A stopped run wakes its entries' waiters: an entry still HELD there will never be
        # recorded, so waiting on for its lease to lapse would only delay them.
        return view["state"] != OnceState.HELD or view["scopeEffective"] != "ACTIVE"

    return _json_answer(await long_poll(request, node, once_key(run_id, key), look, happened))


@routes(
    "POST", SPACE_PREFIX + "/once/renew", "Extend this caller's once lease",
    body={**_LEASE, "leaseSeconds": req.LEASE_SECONDS}, required=_LEASE_REQUIRED,
    errors=("VALIDATION_FAILED", "NOT_FOUND", "STALE_CLAIM", *_INACTIVE), permission=WRITE, answer=_ANSWER,
)
async def renew(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    args = {**_lease_args(body), "lease_ms": req.lease_seconds_ms(body)}
    return json_response(_render(await req.propose(request, "once.renew", args)))


@routes(
    "POST", SPACE_PREFIX + "/once/complete", "Record the result (DONE for every caller)",
    body={**_LEASE, "result": ANY_JSON}, required=_LEASE_REQUIRED,
    errors=("VALIDATION_FAILED", "NOT_FOUND", "STALE_CLAIM", *_INACTIVE), permission=WRITE, answer=_ANSWER,
)
async def complete(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    _, result = req.payload(body, "result", code="VALIDATION_FAILED", required=False)
    args = {**_lease_args(body), "result": result}
    return json_response(_render(await req.propose(request, "once.complete", args)))


@routes(
    "POST", SPACE_PREFIX + "/once/fail",
    "Record a failed attempt: FAILED when it used the last of maxAttempts (default 3), else OPEN for the next caller",
    body={**_LEASE, "error": STRING, "maxAttempts": _MAX_ATTEMPTS}, required=_LEASE_REQUIRED,
    errors=("VALIDATION_FAILED", "NOT_FOUND", "STALE_CLAIM"), permission=WRITE, answer=_ANSWER,
)
async def fail(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    args = {
        **_lease_args(body),
        "error": req.error_text(body),
        "max_attempts": req.integer(
            body, "maxAttempts", minimum=1, maximum=limits.attempts_max, default=limits.once_attempts_default
        ),
    }
    return json_response(_render(await req.propose(request, "once.fail", args)))


@routes(
    "POST", SPACE_PREFIX + "/once/release", "Give the once entry back at once (OPEN), no attempt counted",
    body=_LEASE, required=_LEASE_REQUIRED, errors=("VALIDATION_FAILED", "NOT_FOUND", "STALE_CLAIM"), permission=WRITE,
    answer=_ANSWER,
)
async def release(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    return json_response(_render(await req.propose(request, "once.release", _lease_args(body))))
