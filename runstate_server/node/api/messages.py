"""Deliveries of messages and tasks: the receive long poll (recv and admit share it), and renew,
complete and nack of a delivery, each fenced by its token."""

from __future__ import annotations

import secrets
import time
from typing import Any

from aiohttp import web

from runstate_server.actors import limits, runs
from runstate_server.actors.context import mailbox_key, queue_key
from runstate_server.node._json import json_response, raw_value
from runstate_server.node.api import _answers as A
from runstate_server.node.api import _request as req
from runstate_server.node.api._poll import client_gone, park, wait
from runstate_server.node.api.routes import (
    ANY_JSON,
    SPACE_PREFIX,
    STRING,
    WRITE,
    Caller,
    RouteTable,
    caller_of,
    holder_of,
    node_of,
)
from runstate_server.node.api.schemas import HOLDER, KEY, NAME, bounded
from runstate_server.node.api.views import iso, needs_view
from runstate_server.node.config import LONG_POLL_MS_MAX
from runstate_server.node.errors import ApiError

routes = RouteTable()

# Random bytes of a delivery token besides the leader's command id (docs/http-api.md).
TOKEN_NONCE_BYTES = 12

_INACTIVE = ("SCOPE_CANCELLED", "DEADLINE_EXCEEDED")
# What recv and admit take besides their own fields.
RECEIVE_BODY: dict[str, Any] = {
    "scopeId": NAME, "holder": HOLDER, "holderSession": NAME, "leaseSeconds": req.LEASE_SECONDS,
    "waitMs": bounded(0, limits.wait_ms_max),
    "max": {"type": "integer", "minimum": 1, "maximum": limits.receive_batch_max},  # extension: a batch
}


def receive_args(
    request: web.Request, body: dict[str, Any], mailbox_id: str, *, include_descendants: bool, tasks_only: bool
) -> dict[str, Any]:
    """The core's receive of a recv or an admit (the holder: the body's, else X-Runstate-Holder)."""
    return {
        "run_id": req.text(body, "scopeId", max_chars=limits.name_chars_max, required=True),
        "mailbox_id": mailbox_id,
        "max": req.integer(body, "max", minimum=1, maximum=limits.receive_batch_max, default=1),
        "lease_ms": req.lease_seconds_ms(body),
        "holder": holder_of(request, body),
        "holder_session": req.text(body, "holderSession", max_chars=limits.name_chars_max),
        "include_descendants": include_descendants,
        "tasks_only": tasks_only,
        "nonce": secrets.token_hex(TOKEN_NONCE_BYTES),
    }


async def receive(request: web.Request, body: dict[str, Any], args: dict[str, Any]) -> list[dict[str, Any]]:
    """The deliveries of one receive, as the core's step described them: waits up to the body's
    `waitMs` (served up to LONG_POLL_MS_MAX) for the first; [] when nothing came."""
    node, caller = node_of(request), caller_of(request)
    run_id = args["run_id"]
    with node.read() as state:
        space = state.spaces.get(caller.space)
        name = space.mailbox_names.get(args["mailbox_id"]) if space is not None else None
    # Mailboxes are never renamed or removed: the name found now stays the name.
    key = mailbox_key(caller.space, name or "") if args["include_descendants"] else queue_key(run_id, name or "")
    # A longer wait is served as LONG_POLL_MS_MAX: the client asks again.
    wait_ms = req.integer(body, "waitMs", minimum=0, maximum=limits.wait_ms_max, default=0) or 0
    deadline = time.monotonic() + min(wait_ms, LONG_POLL_MS_MAX) / 1000
    first = True
    while True:
        # Registered before proposing, so a task that becomes ready meanwhile wakes this wait.
        with park(request, key) as waiter:
            if client_gone(request):
                return []  # nobody to hand a task to
            # The first receive always goes through the log (it validates); later ones only when
            # there is something to hand out or the run stopped, so an idle poll writes nothing.
            if first or _worth_receiving(request, run_id, name or "", args["include_descendants"]):
                result = await req.propose(request, "task.receive", args)
            else:
                result = {"deliveries": []}
            first = False
            if result["deliveries"]:
                if client_gone(request):
                    await _give_back(request, caller, [given["token"] for given in result["deliveries"]])
                    return []
                return list(result["deliveries"])
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0 or not waiter.parked:
                return []
            await wait(request, waiter, remaining_s)


def _worth_receiving(request: web.Request, run_id: str, mailbox: str, descendants: bool) -> bool:
    with node_of(request).read() as state:
        run = state.runs.get(run_id)
        if run is None or runs.inactive_reason(state, run, int(time.time() * 1000)) is not None:
            return True
        members = runs.subtree(state, run)[: limits.admit_runs_max] if descendants else [run]
        return any((queue := member.queues.get(mailbox)) is not None and queue.ready for member in members)


async def _give_back(request: web.Request, caller: Caller, tokens: list[str]) -> None:
    """The client left while its receive was committed: release what it got at once rather than
    leave the tasks stranded until their leases lapse."""
    node = node_of(request)
    for token in tokens:
        try:
            await node.propose(caller, "delivery.release", {"delivery_id": token})
        except ApiError:
            pass  # lapsed or ended meanwhile: nothing left to give back


def holds_of(given: dict[str, Any]) -> dict[str, Any]:
    return {"slots": given["slot_leases"], "reservationId": given["reservation_id"]}


def message_of(given: dict[str, Any]) -> dict[str, Any]:
    """One delivery of a recv: the message and its token."""
    return {
        "message": {
            "id": given["task_id"],
            "payload": raw_value(given["input"]),
            "attempt": given["attempt"],
            "attempts": given["attempts"],
            "scopeId": given["run_id"],
            "workKey": given["key"],
            "needs": needs_view(given["needs"]),
            "holds": holds_of(given),
            # The reservations of the job's requirements.budgets, to settle or void (as admit's).
            "reservations": given.get("budget_reservations", []),
        },
        "token": given["token"],
        "leaseExpiresAt": iso(given["lease_expires_ms"]),
    }


async def _delivery_command(request: web.Request, kind: str, body: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    args["message_id"] = request.match_info["id"]
    args["delivery_id"] = req.text(body, "token", max_chars=limits.key_chars_max, required=True)
    result: dict[str, Any] = await req.propose(request, kind, args)
    return result


def _settled_view(result: dict[str, Any]) -> dict[str, Any]:
    return {"taskId": result["task_id"], "state": result["state"], "attempt": result["attempt"],
            "outcomeReason": result["outcome_reason"]}


@routes(
    "POST", SPACE_PREFIX + "/messages/{id}/renew", "Extend a delivery's lease",
    body={"token": KEY, "leaseSeconds": req.LEASE_SECONDS}, required=("token",),
    errors=("VALIDATION_FAILED", "NOT_FOUND", "STALE_CLAIM", *_INACTIVE), permission=WRITE, answer=A.RENEWED,
)
async def renew(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    result = await _delivery_command(request, "delivery.renew", body, {"lease_ms": req.lease_seconds_ms(body)})
    return json_response({"taskId": result["task_id"], "leaseExpiresAt": iso(result["lease_expires_ms"])})


_RESULT = {"type": "object", "properties": {"payload": ANY_JSON}}


def _completed_payload(body: dict[str, Any]) -> Any:
    """The payload a complete records: its body's `result.payload` (None without one)."""
    result = body.get("result") or {}
    if not isinstance(result, dict):
        raise ApiError("VALIDATION_FAILED", "result must be an object such as {\"payload\": ...}")
    _, payload = req.payload(result, "payload", code="VALIDATION_FAILED", required=False)
    return payload


@routes(
    "POST", SPACE_PREFIX + "/messages/{id}/complete", "Settle a delivery OK: result.payload becomes the task's outcome",
    body={"token": KEY, "result": _RESULT}, required=("token",),
    errors=("VALIDATION_FAILED", "NOT_FOUND", "STALE_CLAIM", *_INACTIVE), permission=WRITE, answer=A.SETTLED,
)
async def complete(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    answer = await _delivery_command(request, "delivery.complete", body, {"payload": _completed_payload(body)})
    return json_response(_settled_view(answer))


_COMPLETE_ITEM = {"id": KEY, "token": KEY, "result": _RESULT}


def _complete_item_args(item: Any) -> dict[str, Any]:
    """The core's complete of one item of a batch complete (what the single complete takes from
    its path and body)."""
    if not isinstance(item, dict):
        raise ApiError("VALIDATION_FAILED", "must be an object such as {\"id\", \"token\", \"result\"}")
    unknown = sorted(set(item) - set(_COMPLETE_ITEM))
    if unknown:
        raise ApiError("VALIDATION_FAILED", f"unknown field {', '.join(unknown)}; an item takes id, token and result")
    return {
        "message_id": req.text(item, "id", max_chars=limits.key_chars_max, required=True),
        "delivery_id": req.text(item, "token", max_chars=limits.key_chars_max, required=True),
        "payload": _completed_payload(item),
    }


@routes(
    "POST", SPACE_PREFIX + "/messages/complete",
    f"Extension: complete up to {limits.complete_batch_max} deliveries in one call; each answers on its own. An item "
    "its schema refuses refuses the whole call (400, nothing changes)",
    body={"items": {"type": "array", "minItems": 1, "maxItems": limits.complete_batch_max, "items": {
        "type": "object", "properties": _COMPLETE_ITEM, "required": ["id", "token"], "additionalProperties": False,
    }}},
    required=("items",),
    errors=("VALIDATION_FAILED",), permission=WRITE, answer=A.SETTLED_MANY,
)
async def complete_batch(request: web.Request) -> web.Response:
    """An item its schema refuses (not an object, an unknown field, a missing or malformed id or
    token, a result that is not an object) is a 400 for the whole call, which changes nothing
    (req.batch_item). Each well-formed item is applied as POST /messages/{id}/complete would (its
    answer, or its own error: a stale token, a payload over its bound); those that pass are
    committed as one command. The answer lists them in order."""
    body = await req.json_body(request)
    items = body.get("items")
    if not isinstance(items, list) or not 1 <= len(items) <= limits.complete_batch_max:
        raise ApiError("VALIDATION_FAILED", f"items must be a list of 1 to {limits.complete_batch_max} deliveries")
    answers: list[dict[str, Any] | None] = []
    checked: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        try:
            checked.append(req.batch_item(index, item, _complete_item_args))
            answers.append(None)  # the core's answer, below
        except req.BoundExceeded as error:
            answers.append(_item_error(error.code, error.message))
    if checked:
        results = iter((await req.propose(request, "delivery.complete_many", {"items": checked}))["items"])
        for index, answer in enumerate(answers):
            if answer is None:
                result = next(results)
                refusal = result.get("error")
                answers[index] = _settled_view(result) if refusal is None else _item_error(refusal["code"], refusal["message"])
    return json_response({"items": answers})


def _item_error(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


@routes(
    "POST", SPACE_PREFIX + "/messages/{id}/nack",
    "Settle a delivery not OK: retry (another attempt, FAILED once they are used) or reject (FAILED now)",
    body={"token": KEY, "retry": {"type": "boolean"}, "error": STRING, "delayMs": bounded(0, limits.retry_delay_ms_max),
          "countAttempt": {"type": "boolean"}},
    required=("token", "retry"),
    errors=("VALIDATION_FAILED", "NOT_FOUND", "STALE_CLAIM"), permission=WRITE, answer=A.SETTLED,
)
async def nack(request: web.Request) -> web.Response:
    body = await req.json_body(request)
    if not isinstance(body.get("retry"), bool):
        raise ApiError("VALIDATION_FAILED", "retry must be true (another attempt) or false (reject)")
    error = req.error_text(body)
    count_attempt = body.get("countAttempt", True)
    if not isinstance(count_attempt, bool):
        raise ApiError("VALIDATION_FAILED", "countAttempt must be true or false")
    args: dict[str, Any]
    if not body["retry"]:
        kind, args = "delivery.reject", {"error": error}
    elif count_attempt:
        delay_ms = req.integer(body, "delayMs", minimum=0, maximum=limits.retry_delay_ms_max)
        kind, args = "delivery.retry", {"error": error, "delay_ms": delay_ms}
    else:
        kind, args = "delivery.release", {}
    return json_response(_settled_view(await _delivery_command(request, kind, body, args)))

