"""Completes sent together: what consume() uses to settle its deliveries with fewer requests.

Group commit: while no batch complete is in flight, a complete goes out at once (alone, so one
handler at a time pays no wait); the completes asked for while one is in flight wait for it and
then go out together in the next one (`POST /messages/complete`). Nothing waits on a timer to
fill a batch. Each delivery still gets its own answer or its own error, exactly what its single
complete would have raised (a lease lost is LeaseLostError for that delivery only).

A server without the batch call (404 for the route) gets single completes from then on; so does a
result too large to share a request, which the server then refuses as it would alone.
"""

from __future__ import annotations

import asyncio
import collections
import copy
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from runstate.sdk._coalesce import take_batch
from runstate.sdk._http import Transport, encode_body
from runstate.sdk.errors import NotFoundError, RunstateError, error_from_item

# The server's bound on the items of one batch complete (limits.complete_batch_max).
COMPLETE_BATCH_MAX = 100
# Bytes of one batch's items, well under the server's 256 KiB request body; an item over
# COMPLETE_ITEM_BYTES_MAX (a result near the 64 KiB bound, or over it) goes alone.
COMPLETE_BATCH_BYTES_MAX = 160 * 1024
COMPLETE_ITEM_BYTES_MAX = 16 * 1024
# Completes waiting for the next batch; past this, a complete goes alone. consume() holds at most
# its concurrency (CONCURRENCY_MAX) deliveries, so this is reached only by completes of
# deliveries kept after their handler returned.
COMPLETES_WAITING_MAX = 2_000

Single = Callable[[], Awaitable[dict[str, Any]]]


@dataclass(slots=True)
class _Waiting:
    item: bytes  # the encoded {"id", "token", "result"}
    answer: asyncio.Future[dict[str, Any]]


class Completes:
    """Sends the completes of one consume() call, coalesced (see the module's docstring)."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport
        # One entry per delivery awaiting its settle: bounded by the handlers (consume's concurrency).
        self._waiting: collections.deque[_Waiting] = collections.deque()
        self._sender: asyncio.Task[None] | None = None
        self._batch_call = True  # False once the server answered that it has no batch complete

    async def complete(self, task_id: str, body: dict[str, Any], single: Single) -> dict[str, Any]:
        """The answer of complete `body` ({"token", "result"}) of a delivery of `task_id`, sent
        with others when some are waiting; `single` sends it alone. Raises what the single
        complete raises (ConfigError for a result that is not JSON, before any request)."""
        item = encode_body({"id": task_id, **body})
        if not self._batch_call or len(item) > COMPLETE_ITEM_BYTES_MAX or len(self._waiting) >= COMPLETES_WAITING_MAX:
            return await single()
        waiting = _Waiting(item, asyncio.get_running_loop().create_future())
        self._waiting.append(waiting)
        if self._sender is None:
            self._sender = asyncio.create_task(self._send_while_waiting(), name="runstate-completes")
        try:
            return await waiting.answer
        except _NoBatchCall:
            return await single()
        except asyncio.CancelledError:
            # Not sent yet: it never will be. Sent: its answer is dropped, as a cancelled single
            # complete's would be.
            waiting.answer.cancel()
            raise

    async def _send_while_waiting(self) -> None:
        batch: list[_Waiting] = []
        try:
            while self._waiting:
                batch = self._take()
                if batch:
                    await self._send(batch)
        finally:
            self._sender = None
            # Cancelled (the event loop is closing): what still waits gets no answer.
            for waiting in [*batch, *self._waiting]:
                waiting.answer.cancel()
            self._waiting.clear()

    def _take(self) -> list[_Waiting]:
        """The oldest waiting completes (those still wanted), up to a batch's bounds."""
        return take_batch(
            self._waiting, COMPLETE_BATCH_MAX, COMPLETE_BATCH_BYTES_MAX,
            encoded=lambda waiting: waiting.item, wanted=lambda waiting: not waiting.answer.done(),
        )

    async def _send(self, batch: list[_Waiting]) -> None:
        body = b'{"items":[' + b",".join(waiting.item for waiting in batch) + b"]}"
        try:
            answer = await self._transport.request("POST", "/messages/complete", encoded_body=body, safe=True)
        except NotFoundError as error:
            if not error.message.startswith("no route"):
                _fail(batch, error)
                return
            # A server without the batch call: these and every later complete go alone.
            self._batch_call = False
            _fail(batch, _NoBatchCall())
            return
        except Exception as error:  # noqa: BLE001 - each waiting complete raises it
            _fail(batch, error)
            return
        items = answer.get("items")
        if not isinstance(items, list) or len(items) != len(batch):
            _fail(batch, RunstateError("the batch complete's answer does not list every item", code="INVALID_RESPONSE", status=None))
            return
        for waiting, item in zip(batch, items, strict=True):
            if waiting.answer.done():
                continue
            refusal = item.get("error") if isinstance(item, dict) else None
            if isinstance(refusal, dict):
                waiting.answer.set_exception(error_from_item(refusal))
            elif isinstance(item, dict):
                waiting.answer.set_result(item)
            else:
                waiting.answer.set_exception(RunstateError("an item of the batch complete's answer is not an object", code="INVALID_RESPONSE", status=None))


class _NoBatchCall(Exception):
    """The server has no batch complete: the waiting complete is sent alone."""


def _fail(batch: list[_Waiting], error: BaseException) -> None:
    """Every complete of a batch that failed as a whole gets the error (its own copy)."""
    for index, waiting in enumerate(batch):
        if not waiting.answer.done():
            waiting.answer.set_exception(error if index == 0 else copy.copy(error))
