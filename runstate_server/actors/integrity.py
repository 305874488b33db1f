"""`replica.check`: the leader asks every replica to hash its state at this entry.

The command changes nothing but the clock (as every command does): each node, as it applies it,
starts a copy of its state right there (the node layer's fork, node/replicas.py), and the nodes
compare the digests they computed at the same entry. The core only checks the command's shape and
returns what the node layer needs: the check's id (the command's, chosen by the leader) and why it
was asked. The leader's, in the system space, at command level 5 (dispatch.INTEGRITY_LEVEL).
"""

from __future__ import annotations

from typing import Any

from runstate_server.actors import errors
from runstate_server.actors.errors import Rejected

CHECK_KIND = "replica.check"
# Why a leader asks for a check: its period passed (`--replica-check-every`), or it compacted its log.
CHECK_REASONS = ("period", "compaction")


def check(args: Any, command_id: str) -> dict[str, Any]:
    reason = args.get("reason") if isinstance(args, dict) else None
    if reason not in CHECK_REASONS:
        raise Rejected(errors.VALIDATION_FAILED, f"{CHECK_KIND} needs a reason, one of {', '.join(CHECK_REASONS)}")
    if not command_id:
        raise Rejected(errors.VALIDATION_FAILED, f"{CHECK_KIND} needs the command's id (the check's name)")
    return {"check": command_id, "reason": reason}
