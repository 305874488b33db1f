"""Deliveries: receive tasks under a lease, renew, complete, retry, reject, release."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from runstate_server.actors import limits, runs
from runstate_server.actors.context import queue_key
from runstate_server.actors.state import State
from runstate_server.node.api import _request as req
from runstate_server.node.api._poll import body_wait_ms, client_gone
from runstate_server.node.api.routes import (
    ANY_JSON,
    INTEGER,
    SPACE_PREFIX,
    STRING,
    WRITE,
    Caller,
    RouteTable,
    caller_of,
    holder_of,
    node_of,
)
from runstate_server.node.api.views import delivery_view, iso
from runstate_server.node.config import LONG_POLL_MS_MAX
from runstate_server.node.errors import ApiError

routes = RouteTable()

_INACTIVE = ("SCOPE_CANCELLED", "DEADLINE_EXCEEDED")
_LEASE_MS = {"type": "integer", "minimum": limits.lease_ms_min, "maximum": limits.lease_ms_max}
_SPENT = {"type": "number", "minimum": 0, "maximum": req.AMOUNT_MAX}  # of the job's budget reservation


@routes(
    "POST", SPACE_PREFIX + "/scopes/{id}/mailboxes/{name}/receive",
    "Receive up to max tasks under a lease, waiting up to waitMs for the first",
    body={
        "max": {"type": "integer", "minimum": 1, "maximum": limits.receive_batch_max},
        "leaseMs": _LEASE_MS,
        "waitMs": {"type": "integer", "minimum": 0, "maximum": LONG_POLL_MS_MAX},
        "holder": STRING,
    },
    errors=("VALIDATION_FAILED", "NOT_FOUND", *_INACTIVE), permission=WRITE,
)
async def receive(request: web.Request) -> web.Response:
    node, caller = node_of(request), caller_of(request)
    body = await req.json_body(request, required=False)
    run_id, mailbox = request.match_info["id"], request.match_info["name"]
    args = {
        "run_id": run_id,
        "mailbox": mailbox,
        "max": req.integer(body, "max", minimum=1, maximum=limits.receive_batch_max, default=1),
        "lease_ms": req.lease_ms(body),
        "holder": holder_of(request, body),
    }
    deadline = time.monotonic() + body_wait_ms(body) / 1000
    first = True
    while True:
        # Registered before proposing, so a task that becomes ready meanwhile wakes this wait.
        with node.waiters.register(queue_key(run_id, mailbox)) as waiter:
            if client_gone(request):
                return web.json_response({"deliveries": []})  # nobody to hand a task to
            # The first receive always goes through the log (it validates); later ones only when
            # there is something to hand out or the run stopped, so an idle poll writes nothing.
            if first or _worth_receiving(request, run_id, mailbox):
                result = await node.propose(caller, "task.receive", args)
            else:
                result = {"task_ids": [], "deliveries": []}
            first = False
            if result["deliveries"]:
                if client_gone(request):
                    await _give_back(request, caller, [given["delivery_id"] for given in result["deliveries"]])
                    return web.json_response({"deliveries": []})
                with node.read() as state:
                    deliveries = [_given_view(state, given) for given in result["deliveries"]]
                return web.json_response({"deliveries": deliveries})
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                return web.json_response({"deliveries": []})
            await waiter.wait(remaining_s)


def _given_view(state: State, given: dict[str, Any]) -> dict[str, Any]:
    """A delivery as the receive handed it out. The id, attempt and lease come from the receive's
    own step, never from the state read afterwards: another command may have ended the delivery
    meanwhile (its holds are then returned: none are shown), and a later delivery of the same task
    belongs to someone else."""
    task = state.tasks.get(given["task_id"])
    current = task is not None and task.delivery_id == given["delivery_id"]
    view = delivery_view(task) if task is not None else {"taskId": given["task_id"]}
    view.update(
        id=given["delivery_id"],
        attempt=given["attempt"],
        leaseExpiresAt=iso(given["lease_expires_ms"]),
    )
    if not current:
        view["holds"] = {"slots": [], "reservationId": None}
    return view


async def _give_back(request: web.Request, caller: Caller, delivery_ids: list[str]) -> None:
    """The client left while its receive was committed: release what it got at once rather than
    leave the tasks stranded until their leases lapse."""
    node = node_of(request)
    for delivery_id in delivery_ids:
        try:
            await node.propose(caller, "delivery.release", {"delivery_id": delivery_id})
        except ApiError:
            pass  # lapsed or ended meanwhile: nothing left to give back


def _worth_receiving(request: web.Request, run_id: str, mailbox: str) -> bool:
    with node_of(request).read() as state:
        run = state.runs.get(run_id)
        if run is None or runs.inactive_reason(state, run, int(time.time() * 1000)) is not None:
            return True
        queue = run.queues.get(mailbox)
        return bool(queue and queue.ready)


def _spent(body: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    """`args` with the job's actual spend of its budget reservation, when the worker reported one
    (without it the whole reservation counts as spent)."""
    spent = req.amount_micros(body, "spent")
    return args if spent is None else {**args, "spent_micros": spent}


async def _delivery_command(request: web.Request, kind: str, args: dict[str, Any]) -> dict[str, Any]:
    args["delivery_id"] = request.match_info["id"]
    result: dict[str, Any] = await node_of(request).propose(caller_of(request), kind, args)
    return result


@routes(
    "POST", SPACE_PREFIX + "/deliveries/{id}/renew", "Extend a delivery's lease", body={"leaseMs": _LEASE_MS},
    errors=("NOT_FOUND", "STALE_CLAIM", *_INACTIVE), permission=WRITE,
)
async def renew(request: web.Request) -> web.Response:
    body = await req.json_body(request, required=False)
    result = await _delivery_command(request, "delivery.renew", {"lease_ms": req.lease_ms(body)})
    return web.json_response({"taskId": result["task_id"], "leaseExpiresAt": iso(result["lease_expires_ms"])})


@routes(
    "POST", SPACE_PREFIX + "/deliveries/{id}/complete", "Complete a delivery: record its task's result",
    body={"result": {"type": "object", "properties": {"payload": ANY_JSON}}, "spent": _SPENT},
    errors=("VALIDATION_FAILED", "NOT_FOUND", "STALE_CLAIM", *_INACTIVE), permission=WRITE,
)
async def complete(request: web.Request) -> web.Response:
    body = await req.json_body(request, required=False)
    result = body.get("result", {})
    if not isinstance(result, dict):
        raise ApiError("VALIDATION_FAILED", "result must be an object such as {\"payload\": ...}")
    payload, _ = req.payload(result, "payload", code="VALIDATION_FAILED", required=False)
    answer = await _delivery_command(request, "delivery.complete", _spent(body, {"payload": payload}))
    return web.json_response({"taskId": answer["task_id"], "state": answer["state"]})


@routes(
    "POST", SPACE_PREFIX + "/deliveries/{id}/retry", "Give the task back for another attempt (after a backoff)",
    body={"error": STRING, "delayMs": INTEGER, "spent": _SPENT},
    errors=("VALIDATION_FAILED", "NOT_FOUND", "STALE_CLAIM"), permission=WRITE,
)
async def retry(request: web.Request) -> web.Response:
    body = await req.json_body(request, required=False)
    args = {
        "error": req.error_text(body),
        "delay_ms": req.integer(body, "delayMs", minimum=0, maximum=limits.retry_delay_ms_max),
    }
    answer = await _delivery_command(request, "delivery.retry", _spent(body, args))
    return web.json_response({"taskId": answer["task_id"], "state": answer["state"]})


@routes(
    "POST", SPACE_PREFIX + "/deliveries/{id}/reject", "Fail the task now, without further attempts",
    body={"error": STRING, "spent": _SPENT}, errors=("VALIDATION_FAILED", "NOT_FOUND", "STALE_CLAIM"), permission=WRITE,
)
async def reject(request: web.Request) -> web.Response:
    body = await req.json_body(request, required=False)
    answer = await _delivery_command(request, "delivery.reject", _spent(body, {"error": req.error_text(body)}))
    return web.json_response({"taskId": answer["task_id"], "state": answer["state"]})


@routes(
    "POST", SPACE_PREFIX + "/deliveries/{id}/release", "Put the task back at once, no attempt counted",
    errors=("NOT_FOUND", "STALE_CLAIM"), permission=WRITE,
)
async def release(request: web.Request) -> web.Response:
    await req.json_body(request, required=False)
    answer = await _delivery_command(request, "delivery.release", {})
    return web.json_response({"taskId": answer["task_id"], "state": answer["state"]})
