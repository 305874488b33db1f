"""Claims: fenced mutex leases on (scopeId, key) (actors/claims.py).

The key of renew, release and GET travels in the path, percent-encoded (any character, `/`
included: the route takes the rest of the path). Every answer of a write is rendered from the
result its core command returned, never from a read of the state afterwards.
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from runstate_server.actors import claims, limits
from runstate_server.node._json import json_response, stored_value
from runstate_server.node.api import _request as req
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
    BOOLEAN,
    HOLDER,
    INTEGER,
    KEY,
    NAME,
    STRING_OR_NULL,
    TIME,
    TIME_OR_NULL,
    obj,
)
from runstate_server.node.api.views import iso
from runstate_server.node.errors import ApiError

routes = RouteTable()

_INACTIVE = ("SCOPE_CANCELLED", "DEADLINE_EXCEEDED")
# Any character, a newline included (`.` alone stops at one, and the route would not match).
_KEY_PATH = SPACE_PREFIX + "/claims/{key:(?s:.+)}"
# A claim command's answer (_render); a release's has `"token": null, "released": true`.
_ANSWER = obj(
    {"key": STRING, "scopeId": STRING, "generation": INTEGER, "token": STRING_OR_NULL, "holder": STRING_OR_NULL,
     "holderSession": STRING_OR_NULL, "leaseExpiresAt": TIME},
    optional={"released": BOOLEAN},
)
_VIEW = obj({
    "key": STRING, "scopeId": STRING, "generation": INTEGER, "held": BOOLEAN, "holder": STRING_OR_NULL,
    "holderSession": STRING_OR_NULL, "leaseExpiresAt": TIME_OR_NULL, "observation": ANY_JSON,
})


def _render(result: dict[str, Any]) -> dict[str, Any]:
    return {
        "key": result["key"],
        "scopeId": result["run_id"],
        "generation": result["generation"],
        "token": result["token"],
        "holder": result["holder"],
        "holderSession": result["holder_session"],
        "leaseExpiresAt": iso(result["lease_expires_ms"]),
    }


def _path_key(request: web.Request) -> str:
    key = request.match_info["key"]
    if len(key) > limits.key_chars_max:
        raise ApiError("VALIDATION_FAILED", f"key must be at most {limits.key_chars_max} characters")
    return key


@routes(
    "POST", SPACE_PREFIX + "/claims",
    "Acquire the claim on (scopeId, key): a fresh token and the next generation; CLAIM_HELD while another lease "
    "is live",
    required=("key", "scopeId"),
    body={"key": KEY, "scopeId": NAME, "holder": HOLDER, "holderSession": NAME,
          "leaseSeconds": req.LEASE_SECONDS},
    errors=("VALIDATION_FAILED", "NOT_FOUND", "CLAIM_HELD", "LIMIT_EXCEEDED", *_INACTIVE), permission=WRITE, answer=_ANSWER,
)
async def acquire(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    args = {
        "run_id": req.text(body, "scopeId", max_chars=limits.name_chars_max, required=True),
        "key": req.text(body, "key", max_chars=limits.key_chars_max, required=True),
        "lease_ms": req.lease_seconds_ms(body),
        "holder": holder_of(request, body),
        "holder_session": req.holder_session(body),
    }
    return json_response(_render(await req.propose(request, "claim.acquire", args)))


@routes(
    "POST", _KEY_PATH + "/renew", "Extend the claim's lease from now (by leaseSeconds, else its last length)",
    body={"token": NAME, "leaseSeconds": req.LEASE_SECONDS}, required=("token",),
    errors=("VALIDATION_FAILED", "STALE_CLAIM", *_INACTIVE), permission=WRITE, answer=_ANSWER,
)
async def renew(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    args = {
        "key": _path_key(request),
        "token": req.text(body, "token", max_chars=limits.name_chars_max, required=True),
        "lease_ms": req.optional_lease_seconds_ms(body),
    }
    return json_response(_render(await req.propose(request, "claim.renew", args)))


@routes(
    "POST", _KEY_PATH + "/release", "Give the claim back (free at once), leaving an optional observation",
    body={"token": NAME, "observation": ANY_JSON}, required=("token",),
    errors=("VALIDATION_FAILED", "STALE_CLAIM"), permission=WRITE, answer=_ANSWER,
)
async def release(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    observation, encoded = req.payload(body, "observation", code="VALIDATION_FAILED", required=False)
    if len(encoded) > limits.observation_bytes_max:
        raise ApiError("VALIDATION_FAILED", f"observation exceeds {limits.observation_bytes_max} bytes")
    args = {
        "key": _path_key(request),
        "token": req.text(body, "token", max_chars=limits.name_chars_max, required=True),
        "observation": None if observation is None else encoded,  # kept as its canonical JSON bytes
    }
    result = await req.propose(request, "claim.release", args)
    return json_response({**_render(result), "released": True})


@routes(
    "GET", _KEY_PATH, "The claim on (scopeId, key): its generation, whether it is held and by whom, the last "
    "release's observation",
    query={"scopeId": NAME}, query_required=("scopeId",), errors=("VALIDATION_FAILED", "NOT_FOUND"), permission=READ,
    answer=_VIEW,
)
async def get(request: web.Request) -> web.Response:
    node, caller = node_of(request), caller_of(request)
    key = _path_key(request)
    run_id = req.text(dict(request.query), "scopeId", max_chars=limits.name_chars_max, required=True)
    assert run_id is not None
    await node.confirm_leadership(caller)
    now_ms = int(time.time() * 1000)
    with node.read() as state:
        run = state.runs.get(run_id)
        if run is None or run.space != caller.space:
            raise ApiError("NOT_FOUND", f"run {run_id!r} not found")
        claim = state.claims.get(run.claims.get(key, ""))
        if claim is None:
            return json_response({"key": key, "scopeId": run_id, "generation": 0, "held": False, "holder": None,
                                      "holderSession": None, "leaseExpiresAt": None, "observation": None})
        held = claims.is_held(claim, now_ms)
        return json_response({
            "key": key,
            "scopeId": run_id,
            "generation": claim.generation,
            "held": held,
            "holder": claim.holder if held else None,
            "holderSession": claim.holder_session if held else None,
            "leaseExpiresAt": iso(claim.lease_expires_ms) if held else None,
            "observation": stored_value(claim.observation),
        })
