"""The long poll every waiting route shares: confirm leadership, then look, and wait for a wake of
the entity's key until what the client waits for happened or its `waitMs` ran out."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from runstate_server.actors.context import api_key_key
from runstate_server.node.api import _request as req
from runstate_server.node.api.routes import CALLER_KEY, caller_of, node_of
from runstate_server.node.config import LONG_POLL_MS_MAX
from runstate_server.node.errors import ApiError
from runstate_server.node.http_server import Connection
from runstate_server.node.waiters import Waiter

if TYPE_CHECKING:
    from runstate_server.node.server import Node

WAIT_MS_QUERY = {"waitMs": {"type": "integer", "minimum": 0, "maximum": LONG_POLL_MS_MAX}}


async def long_poll(
    request: web.Request,
    node: Node,
    key: Hashable,
    look: Callable[[], dict[str, Any]],
    happened: Callable[[dict[str, Any]], bool],
) -> dict[str, Any]:
    """The view `look()` returns once `happened(view)`, or after the request's `waitMs` (0 to
    LONG_POLL_MS_MAX, default 0) with what it is then. `look` reads the state (and may raise an
    ApiError, e.g. NOT_FOUND). The waiter is registered before each look, so no wake is missed."""
    wait_ms = req.query_integer(request, "waitMs", minimum=0, maximum=LONG_POLL_MS_MAX, default=0)
    deadline = time.monotonic() + wait_ms / 1000
    await node.confirm_leadership(caller_of(request))
    if wait_ms == 0:  # a plain read: nothing to wait for, so no waiter to register and drop
        return look()
    while True:
        with park(request, key) as waiter:
            view = look()
            remaining_s = deadline - time.monotonic()
            if happened(view) or remaining_s <= 0 or not waiter.parked:
                return view
            await wait(request, waiter, remaining_s)


def park(request: web.Request, key: Hashable) -> Waiter:
    """A waiter on `key` for this request (registered before the handler looks, so no wake is
    missed), that a revoke of the request's API key wakes as well. Check `waiter.parked`: past the
    node's bounds it is not, and the handler answers at once with what it has."""
    caller = request.get(CALLER_KEY)
    owner = api_key_key(caller.key_id) if caller is not None and caller.key_id is not None else None
    return node_of(request).waiters.register(key, owner)


async def wait(request: web.Request, waiter: Waiter, timeout_s: float) -> None:
    """Wait for a wake of the waiter (at most `timeout_s`); then, if the request's API key was
    revoked meanwhile, end the poll with UNAUTHENTICATED instead of showing what came after. A
    client that goes away ends the wait at once (ConnectionResetError, logged at debug): else its
    poll would stay parked, counted against the bounds, until its wait ran out."""
    if client_gone(request):  # before it parks: its connection's loss would never wake it
        raise ConnectionResetError("the client went away before its long poll waited")
    connection = request.protocol if isinstance(request.protocol, Connection) else None
    if connection is not None:
        connection.parked_on(waiter)
    try:
        await waiter.wait(timeout_s)
    finally:
        if connection is not None:
            connection.parked_on(None)
    if client_gone(request):
        raise ConnectionResetError("the client went away while its long poll waited")
    caller = request.get(CALLER_KEY)
    if caller is None or caller.key_id is None:
        return
    with node_of(request).read() as state:
        key = state.keys.get(caller.key_id)
        revoked = key is None or key.revoked_ms is not None
    if revoked:
        raise ApiError("UNAUTHENTICATED", "the API key was revoked while this call waited")


def body_wait_ms(body: dict[str, Any]) -> int:
    """The `waitMs` of a long poll's body: 0 to LONG_POLL_MS_MAX, default 0."""
    wait_ms = req.integer(body, "waitMs", minimum=0, maximum=LONG_POLL_MS_MAX, default=0)
    assert wait_ms is not None
    return wait_ms


def client_gone(request: web.Request) -> bool:
    """The client closed its connection: nobody is left to hand a grant to."""
    return request.transport is None or request.transport.is_closing()
