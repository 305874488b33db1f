"""What the state holds, in bytes, per space and for the whole node; and the bounds on it.

Counts alone do not bound memory: a task's input and its result can each be 64 KiB, so a space at
its task count could hold 128 GiB. Every task and every once entry is therefore charged what it
holds: a fixed overhead (what its objects cost in the node, measured; `bench.memory` measures it
again and prints the ratio of the node's growth to the charge), more for a task once delivered,
plus the bytes of its payloads, its key and its error. Payloads are kept as their canonical
JSON bytes, never as parsed objects (which cost up to twenty times their JSON size, `[{}, {}, ...]`
the worst), so the charge is close to the memory they really take.

A new task or once entry is refused (LIMIT_EXCEEDED) when its charge would take its space past
`limits.space_bytes_max` or the node past `limits.node_bytes_max`. A result is never refused: the
work is done, and losing its result would be worse than the overshoot, which is at most one
payload per unfinished task. The charges are derived from the state (recounted on restore, never
written to a snapshot), so every replica counts the same.
"""

from __future__ import annotations

import json
from typing import Any

from runstate_server.actors import errors, limits
from runstate_server.actors.context import Context
from runstate_server.actors.errors import Rejected
from runstate_server.actors.state import (
    CLAIM_OVERHEAD_BYTES,
    DELIVERED_TASK_BYTES,
    ONCE_OVERHEAD_BYTES,
    TASK_OVERHEAD_BYTES,
    State,
    claim_bytes,
    json_bytes,
    once_bytes,
    recount,
    task_bytes,
)

__all__ = [
    "CLAIM_OVERHEAD_BYTES", "DELIVERED_TASK_BYTES", "ONCE_OVERHEAD_BYTES", "TASK_OVERHEAD_BYTES",
    "charge", "claim_bytes", "json_bytes", "json_value", "once_bytes", "recount", "require_room", "task_bytes",
]

def json_value(data: bytes | None) -> Any:
    """A kept payload as the JSON value it encodes (None for none)."""
    return None if data is None else json.loads(data)


def charge(state: State, space_id: str, delta: int) -> None:
    """Add `delta` bytes to a space's charge and the node's."""
    state.spaces[space_id].stored_bytes += delta
    state.stored_bytes += delta


def require_room(ctx: Context, cost: int, what: str) -> None:
    """Refuse a new `what` of `cost` bytes that its space or the node has no room for."""
    if ctx.space.stored_bytes + cost > limits.space_bytes_max:
        raise Rejected(
            errors.LIMIT_EXCEEDED,
            f"space {ctx.space.id!r} holds {ctx.space.stored_bytes} bytes; a {what} of {cost} bytes would pass its "
            f"limit of {limits.space_bytes_max} bytes (finished runs free theirs when they are removed)",
        )
    if ctx.state.stored_bytes + cost > limits.node_bytes_max:
        raise Rejected(
            errors.LIMIT_EXCEEDED,
            f"the node holds {ctx.state.stored_bytes} bytes; a {what} of {cost} bytes would pass its limit of "
            f"{limits.node_bytes_max} bytes (finished runs free theirs when they are removed)",
        )
