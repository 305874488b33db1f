"""What one command sees while it is applied: the state, its space, time, ids and the effects."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runstate_server.actors.errors import NOT_FOUND, Rejected
from runstate_server.actors.state import Space, State

# Effects are plain tuples, handed to the node on the event loop after the batch is applied:
#   ("wake", key)   wake long-poll waiters parked on key, e.g. ("task", task_id) or
#                   ("queue", run_id, mailbox) (with it ("mailbox", space, mailbox)) or
#                   ("once", run_id, key) or
#                   ("resource", space, kind, name) or
#                   ("api_key", key_id) (revoked: the long polls of the key end)
#   ("arm", due_ms) the earliest due time of the state moved earlier: re-arm the ticker
#   ("observe", what, ...) a figure for the node's metrics (node/api/metrics.py), e.g.
#                   ("observe", "task_ended", space, mailbox, state, latency_ms, attempts) or
#                   ("observe", "lease_expired", space, mailbox, taken_over); never read by the core
Effect = tuple[Any, ...]


def task_key(task_id: str) -> tuple[str, str]:
    return ("task", task_id)


def queue_key(run_id: str, mailbox: str) -> tuple[str, str, str]:
    return ("queue", run_id, mailbox)


def mailbox_key(space: str, mailbox: str) -> tuple[str, str, str]:
    """Woken with every queue of the mailbox in any run (an admit with includeDescendants)."""
    return ("mailbox", space, mailbox)


def once_key(run_id: str, key: str) -> tuple[str, str, str]:
    return ("once", run_id, key)


def resource_key(space: str, kind: str, name: str) -> tuple[str, str, str, str]:
    """Woken when something of a resource returns or its config changes; kind is "pool", "limit"
    or "budget"."""
    return ("resource", space, kind, name)


def api_key_key(key_id: str) -> tuple[str, str]:
    """Woken when the API key is revoked: every long poll parked under it ends."""
    return ("api_key", key_id)


@dataclass(slots=True)
class Context:
    state: State
    space: Space
    now_ms: int
    epoch: int
    command_id: str
    effects: list[Effect] = field(default_factory=list)
    key_id: str | None = None  # the API key the command carries (checked by dispatch); None: keyless node

    def observe(self, *figures: Any) -> None:
        """A figure for the node's metrics; the node counts it, the state keeps nothing of it."""
        self.effects.append(("observe", *figures))

    def wake(self, key: tuple[str, ...]) -> None:
        self.effects.append(("wake", key))
        if key[0] == "queue":
            self.effects.append(("wake", mailbox_key(self.space.id, key[2])))


def require_in_space(ctx: Context, table: dict[str, Any], entity_id: Any, what: str) -> Any:
    """The entity `entity_id` of `table` if it belongs to the command's space, else NOT_FOUND
    (an id of another space looks exactly like one that does not exist)."""
    entity = table.get(entity_id) if isinstance(entity_id, str) else None
    if entity is None or entity.space != ctx.space.id:
        raise Rejected(NOT_FOUND, f"{what} {entity_id!r} not found")
    return entity
