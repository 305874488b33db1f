"""The cluster's learners: nodes that receive the log and do not vote yet (cluster/DESIGN.md,
"Membership"). The voters are the Raft log's own configuration, which the node layer reads; the
learners are replicated state, so that whichever node leads knows whom to promote, and every node
shows them.

`cluster.learner_add {node_id, raft_address, api_url}` records one (the node layer checked it is
no voter); adding the same learner again changes nothing; one that shares an id, an address or a
URL with another learner is CONFLICT. `cluster.learner_drop {node_id}` forgets one: promoted (a
voter now) or removed. Both are the leader's, in the system space, at command level 4.
"""

from __future__ import annotations

from typing import Any

from runstate_server.actors import errors, limits
from runstate_server.actors.errors import Rejected
from runstate_server.actors.state import State

LEARNERS_MAX = 7  # as many as a cluster has voters at most


def add_learner(state: State, args: dict[str, Any], now_ms: int) -> dict[str, Any]:
    node_id, raft_address, api_url = (_text(args, name) for name in ("node_id", "raft_address", "api_url"))
    existing = state.learners.get(node_id)
    if existing is not None:
        if existing[:2] == [raft_address, api_url]:
            return {"added": False}
        raise Rejected(errors.CONFLICT, f"{node_id} is a learner already, at {existing[0]} and {existing[1]}")
    for other_id, (other_raft, other_api, _) in state.learners.items():
        if raft_address == other_raft or api_url == other_api:
            raise Rejected(errors.CONFLICT, f"learner {other_id} has that address already")
    if len(state.learners) >= LEARNERS_MAX:
        raise Rejected(errors.LIMIT_EXCEEDED, f"at most {LEARNERS_MAX} learners at once")
    state.learners[node_id] = [raft_address, api_url, now_ms]
    return {"added": True}


def drop_learner(state: State, args: dict[str, Any]) -> dict[str, Any]:
    return {"dropped": state.learners.pop(_text(args, "node_id"), None) is not None}


def _text(args: Any, name: str) -> str:
    value = args.get(name) if isinstance(args, dict) else None
    if not isinstance(value, str) or not 0 < len(value) <= limits.name_chars_max:
        raise Rejected(errors.VALIDATION_FAILED, f"{name} must be a string of 1 to {limits.name_chars_max} characters")
    return value
