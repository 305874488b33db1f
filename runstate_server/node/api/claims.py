"""Claims (once per run and key). The space's default run is the named run `default` (runs.py)."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from runstate_server.actors import claims, limits, runs
from runstate_server.actors.context import claim_key
from runstate_server.actors.state import Claim, ClaimState, State
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
from runstate_server.node.api.views import iso
from runstate_server.node.errors import ApiError

routes = RouteTable()

_INACTIVE = ("SCOPE_CANCELLED", "DEADLINE_EXCEEDED")
_LEASE_MS = {"type": "integer", "minimum": limits.lease_ms_min, "maximum": limits.lease_ms_max}


def claim_view(claim: Claim | None, key: str) -> dict[str, Any]:
    if claim is None:
        return {"key": key, "state": ClaimState.FREE, "attempt": 0, "attempts": None, "holder": None,
                "leaseExpiresAt": None, "result": None, "error": None, "finishedBy": None}
    held = claim.state == ClaimState.HELD
    return {
        "key": claim.key,
        "state": claim.state,
        "attempt": claim.attempt,
        "attempts": claim.attempts,
        "holder": claim.holder if held else None,
        "leaseExpiresAt": iso(claim.lease_expires_ms) if held else None,
        "result": claim.result,
        "error": claim.error,
        "finishedBy": claims.finisher(claim),
    }


def _find(state: State, space: str, run_id: str, key: str) -> Claim | None:
    run = state.runs.get(run_id)
    if run is None or run.space != space:
        raise ApiError("NOT_FOUND", f"run {run_id!r} not found")
    return state.claims.get(run.claims.get(key, ""))


@routes(
    "POST", SPACE_PREFIX + "/scopes/{id}/claims",
    "Acquire the claim on a key: GRANTED (with a lease), HELD by another, DONE (with the result) or FAILED",
    body={"key": STRING, "leaseMs": _LEASE_MS, "attempts": {"type": "integer", "minimum": 1,
                                                            "maximum": limits.attempts_max}, "holder": STRING},
    errors=("VALIDATION_FAILED", "NOT_FOUND", "LIMIT_EXCEEDED", *_INACTIVE), permission=WRITE,
)
async def acquire(request: web.Request) -> web.Response:
    node, caller = node_of(request), caller_of(request)
    body = await req.json_body(request)
    key = req.text(body, "key", max_chars=limits.key_chars_max, required=True)
    assert key is not None
    args = {
        "run_id": request.match_info["id"],
        "key": key,
        "lease_ms": req.lease_ms(body),
        "attempts": req.integer(
            body, "attempts", minimum=1, maximum=limits.attempts_max, default=limits.claim_attempts_default
        ),
        "holder": holder_of(request, body),
    }
    result = await node.propose(caller, "claim.acquire", args)
    with node.read() as state:
        claim = state.claims[result["claim_id"]]
        answer: dict[str, Any] = {
            "outcome": result["outcome"],
            "claim": claim_view(claim, key),
            # A stopped run still answers its recorded outcomes; this says whether it stopped.
            "scopeEffective": runs.effective(state, state.runs[claim.run_id], int(time.time() * 1000)),
        }
    if "lease_id" in result:
        answer["leaseId"] = result["lease_id"]
    return web.json_response(answer)


@routes(
    "GET", SPACE_PREFIX + "/scopes/{id}/claims/{key:.+}",
    "A claim; long poll: answers once it is not HELD (FREE, DONE or FAILED) or its run stopped, or after waitMs",
    query=WAIT_MS_QUERY,
    errors=("NOT_FOUND", "VALIDATION_FAILED"), permission=READ,
)
async def claim_status(request: web.Request) -> web.Response:
    node, caller = node_of(request), caller_of(request)
    run_id, key = request.match_info["id"], request.match_info["key"]
    if len(key) > limits.key_chars_max:
        raise ApiError("VALIDATION_FAILED", f"key must be at most {limits.key_chars_max} characters")

    def look() -> dict[str, Any]:
        with node.read() as state:
            view = claim_view(_find(state, caller.space, run_id, key), key)
            view["scopeEffective"] = runs.effective(state, state.runs[run_id], int(time.time() * 1000))
            return view

    def happened(view: dict[str, Any]) -> bool:
        # A stopped run wakes its claims' waiters (runs._stop): a claim still HELD there will never
        # be recorded, so waiting on for its lease to lapse would only delay them.
        return view["state"] != ClaimState.HELD or view["scopeEffective"] != "ACTIVE"

    view = await long_poll(request, node, claim_key(run_id, key), look, happened)
    return web.json_response(view)


async def _lease_command(request: web.Request, kind: str, args: dict[str, Any]) -> dict[str, Any]:
    node, caller = node_of(request), caller_of(request)
    args["lease_id"] = request.match_info["lease"]
    result = await node.propose(caller, kind, args)
    with node.read() as state:
        claim = state.claims[result["claim_id"]]
        return claim_view(claim, claim.key)


@routes(
    "POST", SPACE_PREFIX + "/claims/{lease}/renew", "Extend a claim's lease", body={"leaseMs": _LEASE_MS},
    errors=("NOT_FOUND", "STALE_CLAIM", *_INACTIVE), permission=WRITE,
)
async def renew(request: web.Request) -> web.Response:
    body = await req.json_body(request, required=False)
    view = await _lease_command(request, "claim.renew", {"lease_ms": req.lease_ms(body)})
    return web.json_response({"leaseExpiresAt": view["leaseExpiresAt"]})


@routes(
    "POST", SPACE_PREFIX + "/claims/{lease}/complete", "Record the claim's result (DONE for everyone)",
    body={"result": ANY_JSON}, errors=("VALIDATION_FAILED", "NOT_FOUND", "STALE_CLAIM", *_INACTIVE), permission=WRITE,
)
async def complete(request: web.Request) -> web.Response:
    body = await req.json_body(request, required=False)
    result, _ = req.payload(body, "result", code="VALIDATION_FAILED", required=False)
    return web.json_response(await _lease_command(request, "claim.complete", {"result": result}))


@routes(
    "POST", SPACE_PREFIX + "/claims/{lease}/fail", "Record a failed attempt (FREE for the next caller, or FAILED)",
    body={"error": STRING}, errors=("VALIDATION_FAILED", "NOT_FOUND", "STALE_CLAIM"), permission=WRITE,
)
async def fail(request: web.Request) -> web.Response:
    body = await req.json_body(request, required=False)
    return web.json_response(await _lease_command(request, "claim.fail", {"error": req.error_text(body)}))


@routes(
    "POST", SPACE_PREFIX + "/claims/{lease}/release", "Give the claim back at once, no attempt counted",
    errors=("NOT_FOUND", "STALE_CLAIM"), permission=WRITE,
)
async def release(request: web.Request) -> web.Response:
    await req.json_body(request, required=False)
    return web.json_response(await _lease_command(request, "claim.release", {}))
